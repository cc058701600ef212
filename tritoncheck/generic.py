"""Checks that apply to every op: the reference comparisons, and the contract's
promises that need no reference (inputs are not modified, results are deterministic).

Each family module builds its :class:`~tritoncheck.registry.OpSpec` with
``generic_checks(...)`` plus its own properties.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from tritoncheck import backend, parity, refusals, rounding_bias, tolerance
from tritoncheck.oracle import allowance_mostly_vacuous, assert_identical, to_numpy
from tritoncheck.phases import timed
from tritoncheck.registry import OPS, Check, Implementation, OpSpec
from tritoncheck.strategies import Case, tensors
from tritoncheck.tolerance import Precision

UPSTREAM_FAMILIES = ("normal", "outlier", "constant")


def precision(impl: Implementation, case: Case) -> Precision:
    spec = OPS.get(case.op)  # a rank process of a distributed op may not have loaded the registry
    dtype = spec.result_dtype(case) if spec is not None else getattr(torch, case.dtype)
    declared = getattr(impl.fn, "fp32_dot_precision", None)
    p = tolerance.declared_dot(Precision.of(dtype, backend.current(), declared), declared)
    p = tolerance.declared_fp8_accumulation(p, getattr(impl.fn, "fp8_accumulation", None))
    return dataclasses.replace(p, declared=tuple(sorted(impl.declared.items()))) if impl.declared else p


def rule_name(fn) -> str:
    """``module.function`` of a tolerance binding, for messages about its allowances (a defined
    op's rule says what it is: ``rule_description``)."""
    if getattr(fn, "rule_description", None):
        return fn.rule_description
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def run(case: Case, impl: Implementation, values: Mapping[str, Any] | None = None):
    """Materialise ``case`` (unless ``values`` are given), call ``impl`` as its signature and
    declarations say (tritoncheck/calling.py), name the outputs it returns."""
    if values is None:
        with timed("inputs"):
            values = case.materialise(backend.device())
    with timed("kernel"):
        return dict(values), impl.outputs(impl.call(values, case.args, case.kwargs))


def _check_output_types(op: OpSpec, case: Case, outs: Mapping[str, torch.Tensor]) -> None:
    for name, t in outs.items():
        want = op.dtype_of(name, case)
        if t.dtype != want:
            raise AssertionError(f"{op.name} output {name!r} has dtype {t.dtype}, the contract says {want}")


def snapshot(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of every tensor in ``values`` (whole storage, same strides and offset): the
    inputs as they were before a call, whatever the call then writes into them."""
    out = {}
    for name, v in values.items():
        if isinstance(v, torch.Tensor):
            out[name] = _whole_storage(v).clone().as_strided(v.shape, v.stride(), v.storage_offset())
        else:
            out[name] = v
    return out


def matches_reference(case: Case, impl: Implementation) -> None:
    """Every output matches the fp64 NumPy reference, run on the same rounded inputs as
    they were before the call, within the op's derived tolerance."""
    op = OPS[case.op]
    with timed("inputs"):
        values = case.materialise(backend.device())
        before = snapshot(values)
    _, outs = run(case, impl, values)  # the outputs the implementation returns (its declared ``returns``)
    assert_matches_reference(op, case, impl, before, outs)


def assert_matches_reference(op: OpSpec, case: Case, impl: Implementation, inputs: Mapping[str, Any],
                             outs: Mapping[str, torch.Tensor]) -> None:
    """``outs`` against the fp64 reference of ``inputs``: taken before the call (a kernel
    that wrote its wrong answer's preimage into its inputs would otherwise agree with a
    reference computed after it)."""
    _check_output_types(op, case, outs)
    with timed("reference"):
        expected, inputs64 = op.expected(case, inputs)
    with timed("allowance"):
        p = precision(impl, case)
        allowed = op.tolerance(case, inputs64, expected, p)
        noise = op.tolerance(case, inputs64, expected, tolerance.reference_precision(p))
    with timed("torch baseline"):
        baseline = parity.baseline_errors(op.name, op.result_dtype(case), case, inputs, outs, expected)
    with timed("compare"):
        for name in outs:
            parity.assert_close(name, outs[name], expected[name], allowed[name], baseline[name],
                                dtype=op.dtype_of(name, case), computed_in=op.result_dtype(case),
                                rule=rule_name(op.tolerance),
                                noise=noise[name])


def with_upstream(op: OpSpec, dtype: torch.dtype) -> st.SearchStrategy[Case]:
    """The op's cases plus an upstream gradient ``d<output>`` for each output that
    carries gradients, in the output's shape and dtype (``op.output_dtypes``) and any layout."""

    def add(case: Case) -> st.SearchStrategy[Case]:
        shapes = op.output_shapes(case)
        grads = {f"d{n}": tensors(shapes[n], op.output_dtypes.get(n, dtype), families=UPSTREAM_FAMILIES,
                                  scales=(1.0, 1e-3, 1e3))
                 for n in op.grad_outputs}
        return st.fixed_dictionaries(grads).map(lambda g: case.replace(tensors=g))

    return op.cases(dtype).flatmap(add)


def require_grad_fn(op: OpSpec, impl: Implementation, outs: Mapping[str, torch.Tensor]) -> None:
    """Fail when an output the contract differentiates carries no ``grad_fn``.

    Called only for implementations that did not declare ``supports_backward = False``:
    for them the contract promises a gradient on every input, so a detached output (on
    some inputs only, e.g. a wrapper that bypasses its autograd Function for long rows)
    is a broken promise, not a case to skip."""
    for name in op.grad_outputs:
        if outs[name].grad_fn is None:
            raise AssertionError(
                f"output {name!r} of {impl.name} carries no grad_fn although its inputs "
                f"{', '.join(repr(n) for n in op.grad_inputs)} require grad: the contract promises a "
                f"gradient of {op.name} (declare `{impl.name}.supports_backward = False` if it has no backward)")


def _graph(op: OpSpec, case: Case, impl: Implementation, values: dict[str, Any]):
    """Run ``impl`` with its differentiable inputs requiring grad: the outputs, and the
    (outputs, inputs, upstream gradients) that ``torch.autograd.grad`` takes."""
    names = op.present_grad_inputs(values)
    for name in names:
        values[name] = values[name].detach().requires_grad_(True)
    _, outs = run(case, impl, values)
    require_grad_fn(op, impl, outs)
    return (outs, [outs[n] for n in op.grad_outputs], [values[n] for n in names],
            [values[f"d{n}"] for n in op.grad_outputs])


def _backward(op: OpSpec, case: Case, impl: Implementation, values: dict[str, Any]):
    outs, ys, xs, dys = _graph(op, case, impl, values)
    names = op.present_grad_inputs(values)
    grads = refusals.gradients(impl.fn, ys, xs, dys, allow_unused=True)
    for name, g in zip(names, grads):
        if g is None:
            raise AssertionError(f"no gradient reached input {name!r} through {impl.name}")
    return outs, dict(zip(names, grads))


def gradients_match_reference(case: Case, impl: Implementation, in_domain=None, max_allowed: float | None = None) -> None:
    """Gradients of every differentiable input match fp64 PyTorch autograd on the
    same rounded inputs and upstream gradients, within the derived tolerance.

    ``in_domain(case, inputs64, outputs64, grads64)`` (NumPy arrays) lets an op reject
    (``assume``) a case outside its gradient domain, and ``max_allowed`` rejects a case
    whose derived allowance passes it (a rule that admits any value checks nothing).
    Both run after the fp64 reference and before the implementation: a rejected case
    costs no kernel call, and the fp64 autograd is computed once for both."""
    op = OPS[case.op]
    with timed("inputs"):
        values = case.materialise(backend.device())
    with timed("reference"):
        np_in, np_out, np_grads = _autograd_reference(op, case, values)
    if in_domain is not None:
        in_domain(case, np_in, np_out, np_grads)
    with timed("allowance"):
        p = precision(impl, case)
        allowed = op.grad_tolerance(case, np_in, np_out, np_grads, p)
        noise = op.grad_tolerance(case, np_in, np_out, np_grads, tolerance.reference_precision(p))
    if max_allowed is not None:
        assume(max(float(np.max(a)) for a in allowed.values()) <= max_allowed)
    # An example in which the derived allowance would accept 0 for most elements of a
    # gradient checks nothing there: discard it (counted, and shown in the summary's
    # discard table) and draw another, instead of counting it as a pass. On CPU in
    # bfloat16 most attention gradient examples were such (the CI run of this round).
    assume(not any(allowance_mostly_vacuous(np_grads[n], allowed[f"d{n}"], values[n].dtype, noise[f"d{n}"])
                   for n in np_grads))
    # before the implementation: a kernel may write into its inputs (Liger's cross-entropy
    # stores the gradient in the logits), and PyTorch must see the inputs as drawn
    with timed("torch baseline"):
        baseline = parity.baseline_grad_errors(op.name, case, values, np_grads)
    with timed("kernel"):
        _, grads = _backward(op, case, impl, values)
    for name in np_grads:
        if grads[name].dtype != values[name].dtype:
            raise AssertionError(f"gradient of {name!r} has dtype {grads[name].dtype}, input has {values[name].dtype}")
        with timed("compare"):
            parity.assert_close(f"d{name}", grads[name], np_grads[name], allowed[f"d{name}"], baseline[f"d{name}"],
                                dtype=values[name].dtype, rule=rule_name(op.grad_tolerance), noise=noise[f"d{name}"])


def _autograd_reference(op: OpSpec, case: Case, values: dict[str, Any]):
    """fp64 PyTorch autograd on the drawn (rounded) inputs: inputs, outputs and gradients
    as NumPy arrays, for the allowance rules. It runs where the inputs are: on a GPU the
    fp64 backward of attention's N x N scores takes milliseconds where one host thread
    per xdist worker took most of the example's time."""
    args64 = {}
    for name, v in values.items():
        if isinstance(v, torch.Tensor):
            t = v.detach().to(dtype=torch.float64 if v.dtype.is_floating_point else v.dtype, copy=True)
            args64[name] = t.requires_grad_(name in op.grad_inputs)
        else:
            args64[name] = v
    names = op.present_grad_inputs(args64)
    outs64 = op.unpack(op.torch_reference(*(args64[a] for a in case.args)))
    dys64 = [args64[f"d{n}"] for n in op.grad_outputs]
    grads64 = torch.autograd.grad([outs64[n] for n in op.grad_outputs], [args64[n] for n in names], dys64)
    np_in = {k: to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in args64.items()}
    np_out = {k: to_numpy(v) for k, v in outs64.items()}
    np_grads = {n: to_numpy(g) for n, g in zip(names, grads64)}
    return np_in, np_out, np_grads


def _whole_storage(t: torch.Tensor) -> torch.Tensor:
    n = t.untyped_storage().nbytes() // t.element_size()
    return t.detach().as_strided((n,), (1,), 0)


def inputs_unchanged(case: Case, impl: Implementation) -> None:
    """The call leaves every input's storage bit for bit as it was, the gaps of
    strided views and the bytes before a storage offset included."""
    values = case.materialise(backend.device())
    before = {k: _whole_storage(v).clone() for k, v in values.items() if isinstance(v, torch.Tensor)}
    run(case, impl, values)
    for name, snapshot in before.items():
        assert_identical(name, snapshot, _whole_storage(values[name]), f"{impl.name} wrote into its input {name!r}")


def _new_values(case: Case) -> Case:
    """``case`` with the same shapes, layouts and scalars and other values: every tensor's
    seed moved (a cheat's cache key sees the same call; its values are not the same).
    ``dataclasses.replace`` keeps the case's class: a subclass that maps its values into
    the op's domain when materialised (linear attention's FeatureCase) still does."""
    return dataclasses.replace(case, tensors={k: dataclasses.replace(spec, seed=spec.seed + 1)
                                              for k, spec in case.tensors.items()})


def calls_independent(case: Case, impl: Implementation, compare=assert_matches_reference) -> None:
    """Each call's outputs are those of its own inputs, and stay so: call A, then call B
    (same shapes, layouts and scalars, other values) written into A's buffers, so that it
    has A's data pointers too. Each must match the fp64 reference of its inputs, and A's
    outputs must be bit for bit unchanged by the later call. A result cache keyed by
    shapes or pointers, a skipped launch that returns an uninitialised (or previous)
    buffer, and one output buffer returned to every caller each fail here; one call per
    case (matches_reference) cannot see them.

    ``compare(op, case, impl, inputs, outs)`` checks one call's outputs against the
    reference of its inputs as they were before the call (default: the op's fp64
    reference, :func:`assert_matches_reference`). An op whose reference needs an output
    (dropout's keep mask: the fp64 reference given the mask the call returned) passes its
    own; the scalars, a dropout seed among them, are the same in both calls."""
    op = OPS[case.op]
    second = _new_values(case)
    a = case.materialise(backend.device())
    a_before = snapshot(a)
    _, first = run(case, impl, a)
    kept = {name: t.detach().clone() for name, t in first.items()}
    compare(op, case, impl, a_before, first)
    b = second.materialise(backend.device())
    with torch.no_grad():
        for name in second.tensors:
            a[name].copy_(b[name])  # B's values at A's addresses
    b_before = snapshot(a)
    _, then = run(second, impl, a)
    try:
        compare(op, second, impl, b_before, then)
    except AssertionError as exc:
        raise AssertionError(_second_call_wrong(op, case, second, impl, compare, kept, then, exc)) from None
    for name, t in first.items():
        assert_identical(name, kept[name], t.detach(), f"a later call of {impl.name} changed the output of an "
                                                       "earlier one (an output buffer shared between calls)")


def _second_call_wrong(op: OpSpec, first: Case, second: Case, impl: Implementation, compare,
                       kept: Mapping[str, torch.Tensor], then: Mapping[str, torch.Tensor], exc: AssertionError) -> str:
    """Why the second call of :func:`calls_independent` was wrong: state kept across calls
    only where a call shows it (the second inputs alone, on fresh buffers, are right; the
    first inputs, right on the first call, are now wrong; or the second call returned the
    first's outputs bit for bit), else both readings: state that a fresh call reads too, or
    a plain wrong answer on the second inputs."""
    inputs = f"the second call's inputs: the case below with every tensor's seed + 1:\n{second.describe()}"
    fresh = second.materialise(backend.device())
    fresh_before = snapshot(fresh)
    _, alone = run(second, impl, fresh)
    try:
        compare(op, second, impl, fresh_before, alone)
    except AssertionError as wrong:
        again = first.materialise(backend.device())
        again_before = snapshot(again)
        _, redo = run(first, impl, again)
        try:
            compare(op, first, impl, again_before, redo)
        except AssertionError:
            return (f"the implementation keeps state across calls: the first inputs, right on the first call, are "
                    f"wrong when called again, and so is a second call on other values ({inputs})\n{exc}")
        if all(torch.equal(kept[n], then[n].detach()) for n in then if n in kept):
            return (f"the implementation keeps state across calls: a second call on other values returned the "
                    f"first call's outputs bit for bit ({inputs})\n{exc}")
        # A fresh call cannot clear state kept in the process (a cache keyed by shapes answers
        # it too), so a wrong fresh call leaves both readings open: say both.
        return (f"a second call on other values of the same shapes is wrong, on fresh buffers as well: either the "
                f"implementation keeps state across calls that a fresh call also reads (a cache keyed by shapes), "
                f"or it is wrong on these values alone, which matches_reference on them shows ({inputs})\n{wrong}")
    return (f"a second call on other values of the same shapes, in the first call's buffers, is wrong where the same "
            f"values alone, on fresh buffers, are right: the implementation keeps state across calls ({inputs})\n{exc}")


def deterministic(case: Case, impl: Implementation) -> None:
    """Two calls on the same inputs give bitwise identical outputs (and gradients,
    where the implementation has a backward)."""
    op = OPS[case.op]
    values = case.materialise(backend.device())
    _, first = run(case, impl, values)
    _, second = run(case, impl, values)
    for name in first:
        assert_identical(name, first[name], second[name], f"{impl.name} is not deterministic")
    if op.grad_inputs and impl.supports_backward and set(op.grad_outputs) <= set(first):
        _, g1 = _backward(op, case, impl, dict(values))
        _, g2 = _backward(op, case, impl, dict(values))
        for name in g1:
            assert_identical(f"d{name}", g1[name], g2[name], f"{impl.name}'s backward is not deterministic")


def backward_repeatable(case: Case, impl: Implementation) -> None:
    """A second backward through the same graph (``retain_graph=True``, as gradient
    penalties and some pipeline schedules do) gives the first backward's gradients bit
    for bit, and leaves the gradients the first one returned untouched: a backward that
    writes its results into the tensors it saved in forward is right once only."""
    op = OPS[case.op]
    values = case.materialise(backend.device())
    _, ys, xs, dys = _graph(op, case, impl, values)
    first = refusals.gradients(impl.fn, ys, xs, dys, retain_graph=True, allow_unused=True)
    kept = [g.clone() if g is not None else None for g in first]
    second = refusals.gradients(impl.fn, ys, xs, dys, allow_unused=True)
    for name, g1, k1, g2 in zip(op.present_grad_inputs(values), first, kept, second):
        if k1 is None or g2 is None:
            raise AssertionError(f"no gradient reached input {name!r} through {impl.name}")
        assert_identical(f"d{name}", k1, g2, f"a second backward through {impl.name}'s graph differs from the first")
        assert_identical(f"d{name}", k1, g1, f"a second backward through {impl.name}'s graph changed the "
                                             "gradient the first one returned")


def observed(case: Case, impl: Implementation):
    """One call: the outputs, the fp64 reference of the inputs as they were before it, the
    fp64 inputs and the implementation's Precision (rounding_bias.Observe)."""
    values = case.materialise(backend.device())
    before = snapshot(values)
    _, outs = run(case, impl, values)
    expected, inputs64 = OPS[case.op].expected(case, before)
    return outs, expected, inputs64, precision(impl, case)


def unbiased_rounding(case: Case, impl: Implementation) -> None:
    """Each output narrower than fp32 (float16, bfloat16) has a mean signed error against
    the fp64 reference, toward zero and toward -inf, within what round-to-nearest allows:
    the fp32 arithmetic's bound, 1/16 ulp, and a self-normalised statistical margin at a
    false-alarm rate of 1e-8 per example, over the elements of calls on reseeded inputs
    (the derivation and its assumptions: tritoncheck/rounding_bias.py). A store that
    truncates or rounds down, within an ulp at every element, fails here."""
    rounding_bias.judge(*rounding_bias.measure(case, impl, observed))


def autotune_configs_agree(case: Case, impl: Implementation) -> None:
    """Every autotune config of the kernels the implementation declares (``fn.autotuned``,
    tritoncheck/autotune_configs.py) answers the same inputs alike: each config pinned
    alone passes the op's own reference checks (``matches_reference``, and
    ``gradients_match_reference`` where the case carries upstream gradients), so any two
    agree within the sum of their allowances; and the kernels left to autotune (every
    config run on the call's own buffers, then the choice:
    :func:`autotune_configs.autotuning`) return bit for bit what the choice returns alone.

    Configs in turn (one per example, the other checks) meet each input once per config
    count; here every config meets every input. The autotuned run shows what no pinned
    run can: state the timing runs leave behind (an output accumulated into without
    ``reset_to_zero``, triton#3004), a choice that returns another config's writes
    (triton#9230)."""
    from tritoncheck import autotune_configs
    op, fn = OPS[case.op], impl.fn
    count = autotune_configs.config_count(fn)
    grads = _needs_backward(impl) is None and bool(op.grad_inputs) and all(
        f"d{n}" in case.tensors for n in op.grad_outputs)

    def described(i: int) -> str:
        return ", ".join(f"{autotune_configs.name(k)} {autotune_configs.describe(cs[i % len(cs)])}"
                         for k in autotune_configs.autotuned_kernels(fn) for cs in [autotune_configs.configs_of(k)])

    own = {c.name: c.run for c in op.checks}  # the op's own reference checks (its domains, its references)
    for i in range(count):
        with autotune_configs.pinned_all(fn, i):
            try:
                own.get("matches_reference", matches_reference)(case, impl)
                if grads:
                    own.get("gradients_match_reference", gradients_match_reference)(case, impl)
            except AssertionError as exc:
                raise AssertionError(f"autotune config {i} of {count} ({described(i)}), on the same inputs as the "
                                     f"others:\n{exc}") from None

    def outputs() -> dict[str, torch.Tensor]:
        values = case.materialise(backend.device())
        if not grads:
            return run(case, impl, values)[1]
        outs, got = _backward(op, case, impl, values)
        return {**outs, **{f"d{n}": g for n, g in got.items()}}

    fastest = sum(spec.seed for spec in case.tensors.values()) % count  # which config the emulated clock favours
    with autotune_configs.autotuning(fn, fastest) as chosen:
        tuned = {k: t.detach().clone() for k, t in outputs().items()}
    with autotune_configs.pinned_to(fn, chosen):
        alone = outputs()
    picked = ", ".join(f"{autotune_configs.name(k)} {autotune_configs.describe(chosen.get(id(k)))}"
                       for k in autotune_configs.autotuned_kernels(fn))
    for name, t in tuned.items():
        assert_identical(name, t, alone[name].detach(),
                         f"left to autotune ({picked} chosen after every config ran on the same buffers), "
                         f"{impl.name} differs from that choice run alone on the same inputs")


def declares_autotuned(impl: Implementation) -> str | None:
    if not getattr(impl.fn, "autotuned", None):
        return f"not applicable: {impl.name} declares no autotuned kernels (fn.autotuned)"
    return None


def _needs_backward(impl: Implementation) -> str | None:
    if not impl.supports_backward:
        return f"{impl.name} declares supports_backward = False"
    missing = [o for o in OPS[impl.op].grad_outputs if o not in impl.returns]
    if missing:
        return (f"not applicable: {impl.name} returns {', '.join(impl.returns)} only (declared returns); the "
                f"gradients flow through {', '.join(missing)}")
    return None


def generic_checks(grad: bool) -> tuple[Check, ...]:
    """The checks every op gets; ``grad`` adds the gradient comparison."""
    checks = [Check("matches_reference", matches_reference)]
    if grad:
        checks.append(Check("gradients_match_reference", gradients_match_reference, cases=with_upstream, requires=_needs_backward))
    checks.append(Check("inputs_unchanged", inputs_unchanged))
    checks.append(Check("calls_independent", calls_independent))
    checks.append(Check("deterministic", deterministic, cases=with_upstream if grad else None))
    if grad:
        checks.append(Check("backward_repeatable", backward_repeatable, cases=with_upstream,
                            requires=_needs_backward))
    checks.append(Check("unbiased_rounding", unbiased_rounding, cases=rounding_bias.narrowing_cases,
                        false_alarm=rounding_bias.FALSE_ALARM))
    checks.append(Check("autotune_configs_agree", autotune_configs_agree, cases=with_upstream if grad else None,
                        requires=declares_autotuned))
    return tuple(checks)

