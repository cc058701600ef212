"""How a defined op's outputs are judged: the derived rule (default), parity with PyTorch,
or a hand-typed allclose; exact outputs bit for bit whatever the choice.

* :func:`derived`: the running error bound of :mod:`tritoncheck.define.rounding` through
  the fp64 reference, ``SAFETY`` times (first-order bounds drop second-order terms and fix
  one order of operations; 2 covers both, as every rule of the suite), plus the output's
  own rounding ``u(out) |y|`` and the underflow floor. Nothing to write: it is derived from
  the reference, the dtypes, the declared accumulation and dot precision.
* :func:`parity`: within ``factor`` times PyTorch's own largest error on the same input,
  the reference run in the input dtype (flash-attention's rule), plus one rounding of the
  output; per output, not per element (tritoncheck/parity.py says why).
* :func:`allclose`: ``atol + rtol |expected|``, typed by hand: the report marks it so.

Each rule function carries ``rule_description``, which the report prints beside the
figures it judged (``tritoncheck.generic.rule_name``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from tritoncheck import tolerance
from tritoncheck.define import rounding
from tritoncheck.tolerance import SAFETY, U64, Precision, float64_on, underflow_floor


@dataclass(frozen=True)
class Derived:
    """The default rule (module docstring). ``intermediates``: ``"input"``, every
    intermediate of the reference expression rounded to the input dtype as PyTorch eager
    would (a composite op such as ``softmax`` once, its inside in fp32), or
    ``"float32"``, intermediates kept in fp32 (a fused kernel's promise; tighter).
    ``accumulate``: the dtype sums and matrix products accumulate in."""

    intermediates: str = "input"
    accumulate: torch.dtype = torch.float32

    def __post_init__(self):
        if self.intermediates not in rounding.INTERMEDIATES:
            raise ValueError(f"derived(intermediates=...) must be one of {rounding.INTERMEDIATES}, "
                             f"got {self.intermediates!r}")
        if not isinstance(self.accumulate, torch.dtype) or not self.accumulate.is_floating_point:
            raise TypeError(f"derived(accumulate=...) must be a float dtype, got {self.accumulate!r}")

    def describe(self) -> str:
        where = "the input dtype" if self.intermediates == "input" else "float32"
        return (f"derived from the reference: a running rounding-error bound, intermediates in {where}, "
                f"sums accumulated in {str(self.accumulate).replace('torch.', '')}")

    def units(self, p: Precision) -> rounding.Units:
        if p.dtype == torch.float64 and p.compute == U64:  # the reference's own error (tolerance.reference_precision)
            return rounding.Units(accumulate=U64, dot=U64, function=U64, exact=True)
        # float64 with fp32 compute is rounding_bias.compute_only: the fp32 arithmetic's share, no narrow rounding
        held = p.dtype == torch.float64 or self.intermediates != "input"
        return rounding.Units(accumulate=tolerance.unit_roundoff(self.accumulate), dot=p.dot, function=p.compute,
                              least=torch.float32 if held else None)


@dataclass(frozen=True)
class Parity:
    factor: float = 2.0

    def __post_init__(self):
        if not (isinstance(self.factor, (int, float)) and self.factor >= 1):
            raise ValueError(f"parity(factor=...) must be a number >= 1, got {self.factor!r}")

    def describe(self) -> str:
        return f"parity: within {self.factor:g} x PyTorch's own error in the input dtype, plus one rounding"


@dataclass(frozen=True)
class Allclose:
    atol: float
    rtol: float

    def __post_init__(self):
        for name in ("atol", "rtol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ValueError(f"allclose({name}=...) must be a finite number >= 0, got {v!r}")

    def describe(self) -> str:
        return f"hand-typed: atol={self.atol:g}, rtol={self.rtol:g} (not derived)"


Rule = Derived | Parity | Allclose


def derived(*, intermediates: str = "input", accumulate: torch.dtype = torch.float32) -> Derived:
    return Derived(intermediates=intermediates, accumulate=accumulate)


def parity(factor: float = 2.0) -> Parity:
    return Parity(factor=factor)


def allclose(*, atol: float, rtol: float) -> Allclose:
    return Allclose(atol=atol, rtol=rtol)


def _store(y: torch.Tensor, dtype: torch.dtype, p: Precision) -> torch.Tensor:
    """One rounding of the output to its dtype, and the underflow floor there."""
    if p.dtype == torch.float64:
        return U64 * y.abs() + p.floor
    if not dtype.is_floating_point:
        return torch.zeros_like(y)
    floor = underflow_floor(dtype) if dtype.itemsize >= 2 else 0.0
    return tolerance.unit_roundoff(dtype) * y.abs() + floor


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    """An allowance as the oracle takes it: where the bound is infinite (nothing pins the
    element down: rounding.py) the element is masked, reported as not checkable."""
    a = t.detach().to("cpu", torch.float64).numpy()
    return np.ma.masked_invalid(a) if not np.isfinite(a).all() else a


def _arguments(case, inputs64: Mapping[str, Any], names) -> tuple[list, list]:
    """The arguments ``names`` as the tracked evaluation takes them, on the suite's device (the
    GPU where there is one: the absolute-value products are matrix products too), and the
    dtype each tensor has in the case (its nominal dtype)."""
    from tritoncheck import backend
    device = backend.device()
    values, nominals = [], []
    for a in names:
        v = inputs64[a]
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
            values.append(float64_on(v, device))
        elif isinstance(v, np.ndarray):
            values.append(torch.as_tensor(v, device=device))
        else:
            values.append(v)
        nominals.append(case.tensors[a].torch_dtype if a in case.tensors else None)
    return values, nominals


def _within_range(evaluation: rounding.Evaluation) -> None:
    """A case whose reference passes fp32's range in any value it computes (a product of
    near-max inputs) is outside the op's domain: no fp32 implementation can compute it, and
    the contract says nothing there. Discarded (``assume``), counted as such; a test that
    discards most of its examples fails for it (harness.below_min_counted), and the fix is a
    domain: ``Tensor(..., values=finite(max_magnitude=...))``."""
    if evaluation.overflow:
        from hypothesis.errors import UnsatisfiedAssumption
        raise UnsatisfiedAssumption("the reference passes fp32's range on this case")


@dataclass(frozen=True)
class Judge:
    """The tolerance functions of one defined op (``OpSpec.tolerance``/``grad_tolerance``)."""

    rule: Rule
    reference: Callable  # the fp64 torch reference, outputs as a tuple
    outputs: tuple[str, ...]
    output_dtypes: Mapping[str, torch.dtype | None]
    exact: frozenset[str]
    baseline: Callable | None  # (case, values) -> outputs in the input dtype, for parity

    def forward(self, case, inputs64, expected, p: Precision) -> dict[str, np.ndarray]:
        dtype = getattr(torch, case.dtype)
        out: dict[str, np.ndarray] = {}
        if isinstance(self.rule, Derived):
            tracked, evaluation = rounding.evaluate(self.reference, *_arguments(case, inputs64, case.args),
                                                    self.rule.units(p))
            _within_range(evaluation)
            tracked = tracked if isinstance(tracked, (tuple, list)) else (tracked,)
            for name, t in zip(self.outputs, tracked):
                y = t.value
                allowed = SAFETY * t.err + _store(y, self.output_dtypes[name] or dtype, p)
                out[name] = _as_numpy(allowed)
        elif isinstance(self.rule, Allclose):
            for name in self.outputs:
                e = np.asarray(expected[name], dtype=np.float64)
                out[name] = self.rule.atol + self.rule.rtol * np.abs(np.nan_to_num(e, posinf=0, neginf=0))
        else:
            out = self._parity(case, inputs64, expected, p)
        for name in self.exact:
            out[name] = np.zeros_like(np.asarray(expected[name], dtype=np.float64))
        return out

    def _parity(self, case, inputs64, expected, p: Precision) -> dict[str, np.ndarray]:
        dtype = getattr(torch, case.dtype)
        values = {a: (torch.as_tensor(inputs64[a]).to(case.tensors[a].torch_dtype) if a in case.tensors
                      else inputs64[a]) for a in case.args}
        with torch.no_grad():
            got = self.baseline(case, values)
        got = got if isinstance(got, (tuple, list)) else (got,)
        out = {}
        for name, g in zip(self.outputs, got):
            e = torch.as_tensor(np.asarray(expected[name], dtype=np.float64))
            gd = g.detach().to("cpu", torch.float64)
            both = torch.isfinite(e) & torch.isfinite(gd)
            worst = float((gd - e).abs()[both].max()) if bool(both.any()) else 0.0
            store = _store(e, self.output_dtypes[name] or dtype, p)
            out[name] = _as_numpy(self.rule.factor * worst + store)
        return out

    def backward(self, case, inputs64, outputs64, grads64, p: Precision, grad_inputs, grad_outputs
                 ) -> dict[str, np.ndarray]:
        rule = self.rule if isinstance(self.rule, Derived) else Derived()
        arguments, nominals = _arguments(case, inputs64, case.args)
        positions = [case.args.index(n) for n in grad_inputs]
        outs = [self.outputs.index(n) for n in grad_outputs]
        upstream, upstream_nominals = _arguments(case, inputs64, [f"d{n}" for n in grad_outputs])
        grads, evaluation = rounding.evaluate_gradients(self.reference, arguments, nominals, positions, outs,
                                                        upstream, upstream_nominals, rule.units(p))
        _within_range(evaluation)
        allowed = {}
        for name, g in zip(grad_inputs, grads):
            if isinstance(self.rule, Allclose):
                e = np.asarray(grads64[name], dtype=np.float64)
                allowed[f"d{name}"] = self.rule.atol + self.rule.rtol * np.abs(e)
                continue
            if g is None:
                allowed[f"d{name}"] = np.zeros_like(np.asarray(grads64[name], dtype=np.float64))
                continue
            input_dtype = case.tensors[name].torch_dtype
            allowed[f"d{name}"] = _as_numpy(SAFETY * g.err + _store(g.value, input_dtype, p))
        return allowed
