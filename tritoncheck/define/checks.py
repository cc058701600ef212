"""The checks every defined op gets, and its large-index problem.

The generic ones (tritoncheck/generic.py: ``matches_reference``, ``gradients_match_reference``
where it has ``grads``, ``inputs_unchanged``, ``calls_independent``, ``deterministic``,
``backward_repeatable``), their upstream gradients drawn in each output's dtype and
domain, and two that need what the definition says:

* ``layout_invariant``: the same values in contiguous tensors give the outputs of the drawn
  layouts within twice the allowance (each call is within it of the same exact values;
  bitwise is not promised: a kernel may take another path for contiguous inputs);
* ``rows_independent`` (for ``independent`` dims): an output slice along such a dim is bit
  for bit the same when every other slice of the inputs changes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck.define import domains
from tritoncheck.define.signature import DimExpression
from tritoncheck.generic import generic_checks, precision, run, with_upstream
from tritoncheck.large_problem import LargeProblem, rows_past_int32
from tritoncheck.oracle import assert_close, assert_identical, to_numpy
from tritoncheck.registry import OPS, Check, Implementation, NotApplicable, OpSpec
from tritoncheck.strategies import Case, tensors

if TYPE_CHECKING:
    from tritoncheck.define.op import Definition

UPSTREAM_SCALES = (1.0, 1e-3, 1e3)


def _upstream(definition: "Definition", grad_outputs: tuple[str, ...]):
    """The op's cases plus an upstream gradient ``d<output>`` per differentiable output, in
    the output's dtype (the case's where it has none) and its declared upstream domain."""
    def cases(op: OpSpec, dtype: torch.dtype) -> st.SearchStrategy[Case]:
        def add(case: Case) -> st.SearchStrategy[Case]:
            shapes = op.output_shapes(case)
            grads = {}
            for n in grad_outputs:
                out = definition.signature.outputs[n]
                out_dtype = out.dtype or dtype
                grads[f"d{n}"] = tensors(shapes[n], out_dtype, families=("normal", "outlier", "constant"),
                                         scales=UPSTREAM_SCALES, max_magnitude=out.upstream.cap(out_dtype))
            return st.fixed_dictionaries(grads).map(lambda g: case.replace(tensors=g))
        return op.cases(dtype).flatmap(add)
    return cases


def layout_invariant(case: Case, impl: Implementation) -> None:
    """The same values, every tensor contiguous, give the drawn layouts' outputs within
    twice the allowance (module docstring)."""
    op = OPS[case.op]
    assume(any(s.layout is not None and not s.layout.contiguous for s in case.tensors.values()))
    values, drawn = run(case, impl)
    plain = {k: (v.detach().contiguous().clone() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
    _, contiguous = run(case, impl, plain)
    expected, inputs64 = op.expected(case, values)
    allowed = op.tolerance(case, inputs64, expected, precision(impl, case))
    for name, out in drawn.items():
        a = np.asarray(allowed[name], dtype=np.float64)
        a = np.where(np.isfinite(a), 2 * a, np.finfo(np.float64).max)
        assert_close(name, contiguous[name], to_numpy(out), a, record=False,
                     what="the same values in contiguous tensors give other outputs than in the drawn layouts",
                     dtype=out.dtype)


def _rows_independent(dim: str):
    def check(case: Case, impl: Implementation) -> None:
        """An output slice along an independent dim does not change, bit for bit, when every
        other slice of the inputs changes."""
        from tritoncheck.define.op import DEFINITIONS
        definition = DEFINITIONS[case.op]
        sig = definition.signature
        sizes = sig.sizes({k: v.shape for k, v in case.tensors.items()})
        m = sizes[dim]
        assume(m >= 2)
        r = m // 2
        values, first = run(case, impl)
        other = {}
        for name, spec in case.tensors.items():
            axis = sig.axis(name, dim, len(spec.shape))
            t = values[name]
            if axis is None:
                other[name] = t
                continue
            fresh = dataclasses.replace(spec, seed=(spec.seed + 1) % 2**32, injections=()).materialise(t.device)
            keep = [slice(None)] * t.dim()
            keep[axis] = r
            fresh[tuple(keep)] = t[tuple(keep)]
            other[name] = fresh
        other.update({k: v for k, v in values.items() if k not in other})
        _, second = run(case, impl, other)
        shapes = definition.output_shapes(case)
        for name, out in first.items():
            axis = _output_axis(definition, case, name, dim, m, shapes[name])
            if axis is None:
                continue
            index = [slice(None)] * out.dim()
            index[axis] = r
            assert_identical(name, out[tuple(index)], second[name][tuple(index)],
                             f"slice {r} of {dim} in output {name!r} changed when the other slices of the inputs "
                             "changed")
    check.__name__ = check.__qualname__ = f"rows_independent_{dim}"
    return check


def _output_axis(definition: "Definition", case: Case, output: str, dim: str, m: int, shape) -> int | None:
    """The axis of ``output`` that follows ``dim``: the one whose length moves with it (the
    reference on meta tensors, once more with ``dim`` one longer)."""
    sig = definition.signature
    bigger = dataclasses.replace(case, tensors={
        k: dataclasses.replace(s, shape=tuple(n + 1 if i == sig.axis(k, dim, len(s.shape)) else n
                                              for i, n in enumerate(s.shape)))
        for k, s in case.tensors.items()})
    grown = definition.output_shapes(bigger)[output]
    moved = [i for i, (a, b) in enumerate(zip(shape, grown)) if a != b]
    return moved[0] if len(moved) == 1 and shape[moved[0]] == m else None


def of(definition: "Definition", grad_outputs: tuple[str, ...]) -> tuple[Check, ...]:
    base = generic_checks(grad=bool(definition.grads))
    upstream = _upstream(definition, grad_outputs)
    # the checks that draw upstream gradients draw the definition's (its outputs' domains); the others keep theirs
    out = [dataclasses.replace(c, cases=upstream) if c.cases is with_upstream else c for c in base]
    out.append(Check("layout_invariant", layout_invariant))
    for dim in definition.independent:
        out.append(Check(f"rows_independent_{dim}" if len(definition.independent) > 1 else "rows_independent",
                         _rows_independent(dim)))
    return tuple(out)


SMALL = 16  # every other dim's size in the large-index problem


def large_problem(definition: "Definition") -> LargeProblem | NotApplicable:
    """The input past 2**31 elements: the first ``large`` dim grown until its largest tensor
    passes PAST_INT32 elements, every other dim at SMALL (within its bounds), sliced along
    the grown dim."""
    if not definition.large:
        return NotApplicable("declare large=(dim, ...) (an independent dim, first axis of its tensors) to grow it past "
                             "2**31 elements")
    sig = definition.signature
    grown = definition.large[0]
    sizes = {}
    for name in sig.dim_names:
        d = sig.dim(name)
        top = d.largest(True) or SMALL
        sizes[name] = max(d.min, min(SMALL, top)) // d.multiple_of * d.multiple_of or d.multiple_of
    per_row = max(math.prod(int(e.size(sizes)) if isinstance(e, DimExpression) else int(e) for e in spec.shape[1:]
                            if e != "...") for spec in sig.tensors.values() if grown in spec.dim_names)
    sliced = tuple(n for n, spec in sig.tensors.items() if grown in spec.dim_names)

    def build(dtype, device):
        # sized when built (PAST_INT32 as it is then: the small-size machinery tests lower it)
        now = {**sizes, grown: rows_past_int32(max(per_row, 1))}
        out = {}
        for name, spec in sig.tensors.items():
            shape = tuple(e.size(now) if isinstance(e, DimExpression) else (1 if e == "..." else e)
                          for e in spec.shape)
            chosen = spec.dtype[0] if isinstance(spec.dtype, tuple) else spec.dtype
            out[name] = domains.large(spec.values, shape, chosen or dtype, device, now)
        return out

    params = {n: (s.choices[0] if s.choices else s.default if s.default is not None else s.low)
              for n, s in sig.scalars.items()}
    whole = tuple(g for g in definition.grads if g not in sliced)
    return LargeProblem(build, "rows", sliced, whole_sum_grads=whole, params=params or None)

