"""Inputs past 2**31 elements, for the bug no small case reaches: a 32-bit element offset.

A kernel that computes ``row * stride`` (or ``b * stride_b + h * stride_h``) in int32
is right until the product passes 2**31 - 1, then reads and writes somewhere else. The
fuzzed cases stay far below that (the fp64 references run on every element), so this
check builds one input per op whose flattened size passes 2**31, runs the
implementation on all of it (forward and, where the op has gradients, backward), and
compares a sample of independent slices against the fp64 reference: rows for row-wise
ops, (batch, head) pairs for attention-shaped ones. The sample always holds the first
and last slices and the slices on both sides of the 2**31-th element, where an int32
offset first wraps.

Each slice is a valid smaller problem of the same op (rows and heads are independent
by the contract), so its reference and allowance are the op's own, unchanged. Two
outputs are not slices of anything: layer norm's dweight and dbias sum over every row;
their kernels run on the whole input here, but only dx is compared.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from tritoncheck import declarations, generic, refusals
from tritoncheck.large_problem import PAST_INT32, LargeProblem, randn
from tritoncheck.oracle import assert_close, to_numpy
from tritoncheck.registry import OPS, Implementation
from tritoncheck.strategies import Case, TensorSpec

SAMPLE = 6  # slices compared besides the ones at the ends and at the 2**31 boundary
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_AMOUNT = r"([\d.]+) (B|bytes|KiB|MiB|GiB|TiB)"


class OutOfMemory(Exception):
    """The implementation ran out of device memory on the large problem. Not a wrong answer
    (the problem is huge on purpose: a plain attention that materialises its scores asked
    for 128 GiB on a 141 GB H200): the test skips with what it asked for and what the device
    has, unless ``over_budget``: the request passes the memory budget it declared
    (``fn.memory_budget``), a failure."""

    def __init__(self, text: str, over_budget: bool):
        self.over_budget = over_budget
        super().__init__(text)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _amount(pattern: str, message: str) -> int | None:
    found = re.search(pattern + _AMOUNT, message)
    return int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's ``OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` before 2.5), or a
    RuntimeError that says so (an extension's allocator, cuBLAS's workspace)."""
    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
                  if k is not None)
    return isinstance(exc, kinds) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def out_of_memory(exc: BaseException, name: str, budget: float | None, arguments: int,
                  largest: int) -> OutOfMemory:
    """What ``exc`` (an out-of-memory error of ``name``'s call) means: the amount it asked for
    and the device's memory, read from torch's message ("Tried to allocate 128.25 GiB. GPU 0
    has a total capacity of 139.72 GiB of which 101.35 GiB is free"), else from the device;
    over budget where the request passes ``budget`` x the ``arguments``' bytes plus the
    ``largest`` argument's (an output or gradient that size is not workspace)."""
    message = str(exc)
    asked = _amount(r"[Tt]ried to allocate ", message)
    total, free = _amount(r"total capacity of ", message), _amount(r"of which ", message)
    if total is None and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
    device = (f"the device has {_gib(total)}" + (f", {_gib(free)} of it free" if free is not None else "")
              if total is not None else "the device's memory is unknown")
    wanted = f"asked for {_gib(asked)} at once" if asked is not None else "ran out of memory (no size in the error)"
    head = f"{name} {wanted} on the large problem; {device} ({type(exc).__name__}: {message.splitlines()[0][:160].rstrip('.')})"
    if budget is None:
        return OutOfMemory(f"{head}. Not a wrong answer: the problem is past 2**31 elements on purpose (declare "
                           f"{name}.memory_budget to make a request past it a failure)", over_budget=False)
    allowed = budget * arguments + largest
    if asked is not None and asked > allowed:
        return OutOfMemory(f"{head}. Its declared memory_budget of {budget:g} x its arguments' {_gib(arguments)} "
                           f"(plus one output of the largest argument's size) allows {_gib(allowed)}: over it",
                           over_budget=True)
    return OutOfMemory(f"{head}. Within its declared memory_budget ({budget:g} x its arguments' "
                       f"{_gib(arguments)}): the device is too small for the problem", over_budget=False)


def _problem(op: str) -> LargeProblem:
    problem = OPS[op].large_problem
    if not isinstance(problem, LargeProblem):
        raise ValueError(f"{op}'s record declares no large_problem"
                         + (f": {problem.reason}" if problem is not None else ""))
    return problem


def values_of(op: str, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """Every argument of the op's large problem: what it builds, the rest at the fp64
    reference's defaults."""
    return {**OPS[op].reference_defaults(), **_problem(op).values(dtype, device)}


def bytes_needed(op: str, dtype: torch.dtype) -> int:
    """A generous estimate of the device memory one run needs: inputs, outputs, upstream
    gradients and gradients, each about PAST_INT32 elements."""
    spec, problem = OPS[op], _problem(op)
    tensors = len(problem.sliced) + len(spec.outputs) + 2 * len(spec.grad_inputs)
    return tensors * PAST_INT32 * torch.tensor([], dtype=dtype).element_size() + 2**30


def _slices(count: int, per_slice: int, seed: int) -> list[int]:
    """The first and last slices, the two around element 2**31, and SAMPLE others."""
    boundary = 2**31 // per_slice
    picks = {0, count - 1, boundary - 1, boundary, boundary + 1}
    rng = np.random.default_rng(seed)
    picks.update(int(i) for i in rng.integers(0, count, SAMPLE))
    return sorted(i for i in picks if 0 <= i < count)


def _cut(t: torch.Tensor, split: str, index: list[int]) -> torch.Tensor:
    if split == "rows":
        return t[index].clone()
    return t.flatten(0, 1)[index].unsqueeze(0).clone()


class _SequenceCutter:
    """Whole sequences ``index`` of a packed problem: a sliced tensor's rows by its own
    offsets, an output's (or upstream gradient's) token axis by the first sliced tensor's;
    ``offsets`` holds the rebuilt offsets of the cut problem."""

    def __init__(self, problem: LargeProblem, values: dict[str, Any], index: list[int]):
        self.problem = problem
        self.rows, self.offsets = {}, {}
        for name in set(problem.offsets.values()):
            cu = values[name].tolist()
            lengths = [cu[i + 1] - cu[i] for i in index]
            device = values[name].device
            self.rows[name] = torch.cat([torch.arange(cu[i], cu[i + 1], device=device) for i in index])
            self.offsets[name] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=values[name].dtype,
                                              device=device)
        self.tokens = values[problem.sliced[0]].shape[0]

    def __call__(self, name: str, t: torch.Tensor) -> torch.Tensor:
        offsets = self.problem.offsets
        if name in offsets:
            return t.index_select(0, self.rows[offsets[name]]).clone()
        axis = next(a for a, n in enumerate(t.shape) if n == self.tokens)
        return t.index_select(axis, self.rows[offsets[self.problem.sliced[0]]]).clone()


def _case(op: str, dtype: torch.dtype, values: dict[str, Any]) -> Case:
    """The slice as a Case: what the op's tolerance rules read (shapes, dtypes, scalars)."""
    spec = OPS[op]
    tensors = {k: TensorSpec(tuple(v.shape), str(v.dtype).replace("torch.", ""))
               for k, v in values.items() if isinstance(v, torch.Tensor)}
    params = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
    return Case(op, str(dtype).replace("torch.", ""), spec.arguments, tensors, params)


def check(op: str, impl: Implementation, dtype: torch.dtype, device: torch.device, seed: int = 0) -> int:
    """Run ``impl`` on the op's input past 2**31 elements and compare the sampled slices
    (outputs, and gradients where the op has them) with the fp64 reference; raises
    AssertionError on the first slice that is off. Returns the number of slices compared."""
    spec, problem = OPS[op], _problem(op)
    torch.manual_seed(seed)
    values = values_of(op, dtype, device)
    for name, held in (impl.limits.fixed.items() if impl.limits else ()):
        if name in values:
            values[name] = held  # a scalar its signature does not take (declared limits): its default
    for name, allowed in (impl.limits.values.items() if impl.limits else ()):
        if name in values and values[name] not in allowed:
            values[name] = allowed[0]  # a value its declared limits exclude: the problem at one they allow
    # the gradients of the inputs the problem passes (an optional one it leaves out is None)
    grad_inputs = spec.present_grad_inputs(values)
    grads_wanted = bool(grad_inputs) and impl.supports_backward
    for name in grad_inputs if grads_wanted else ():
        values[name] = values[name].detach().requires_grad_(True)
    budget = declarations.memory_budget(getattr(impl.fn, "memory_budget", None), impl.name)
    sizes = [v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor)]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    grads, dys = {}, {}
    try:
        outs = impl.outputs(impl.call(values, spec.arguments))
        if grads_wanted:
            dys = {n: randn(outs[n].shape, outs[n].dtype, device) for n in spec.grad_outputs}
            got = refusals.gradients(impl.fn, [outs[n] for n in spec.grad_outputs], [values[a] for a in grad_inputs],
                                     [dys[n] for n in spec.grad_outputs])
            grads = dict(zip(grad_inputs, got))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory(exc, impl.name, budget, sum(sizes), max(sizes)) from exc
    if budget is not None and device.type == "cuda":
        _within_budget(impl.name, budget, torch.cuda.max_memory_allocated(device) - before, sum(sizes),
                       [*outs.values(), *grads.values(), *dys.values()])
    first = values[problem.sliced[0]]
    if problem.split == "sequences":
        count = values[problem.offsets[problem.sliced[0]]].numel() - 1
    else:
        count = first.shape[0] if problem.split == "rows" else first.shape[0] * first.shape[1]
    index = _slices(count, first.numel() // count, seed)
    cut = _SequenceCutter(problem, values, index) if problem.split == "sequences" else \
        (lambda name, t: _cut(t, problem.split, index))
    sub = {k: (cut(k, v.detach()) if k in problem.sliced else
               (v.detach() if isinstance(v, torch.Tensor) else v)) for k, v in values.items()}
    if problem.split == "sequences":
        sub.update(cut.offsets)
    case = _case(op, dtype, sub)
    where = f"{op} on {count} {problem.split} of {first.numel() // count} elements ({first.numel()} in all)"
    expected, inputs64 = spec.expected(case, sub)
    allowed = spec.tolerance(case, inputs64, expected, generic.precision(impl, case))
    for name in spec.outputs:
        got, out_dtype = cut(name, outs[name].detach()), spec.dtype_of(name, case)
        if not out_dtype.is_floating_point:  # a mask: exactly the reference's
            wrong = int((got.cpu().numpy() != expected[name]).sum())
            if wrong:
                raise AssertionError(f"past 2**31 elements ({where}, slices {index}): output {name!r} differs from "
                                     f"the reference in {wrong} of {got.numel()} elements")
            continue
        assert_close(name, got, expected[name], allowed[name], what=f"past 2**31 elements ({where}, slices {index})",
                     dtype=out_dtype, record=False)
    if grads_wanted:
        _compare_grads(spec, grad_inputs, case, sub, {n: cut(n, d) for n, d in dys.items()},
                       {n: cut(n, g) for n, g in grads.items() if n not in problem.whole_sum_grads},
                       impl, where, index)
    return len(index)


def _within_budget(name: str, budget: float, peak: int, arguments: int, made: list[torch.Tensor]) -> None:
    """Fail where the call's peak device memory, less the outputs, gradients and upstream
    gradients it left (``made``), passed ``budget`` x the arguments' bytes."""
    kept = sum(t.numel() * t.element_size() for t in made)
    workspace = peak - kept
    if workspace > budget * arguments:
        raise AssertionError(f"{name} allocated {_gib(workspace)} at its peak on the large problem besides its outputs "
                             f"and gradients, more than its declared memory_budget of {budget:g} x its arguments' "
                             f"{_gib(arguments)} ({_gib(budget * arguments)})")


def _compare_grads(spec, grad_inputs, case, sub, dys, grads, impl, where, index) -> None:
    args64 = {k: (v.detach().to("cpu", torch.float64 if v.dtype.is_floating_point else v.dtype)
                  .requires_grad_(k in grad_inputs) if isinstance(v, torch.Tensor) else v)
              for k, v in sub.items()}
    outs64 = spec.unpack(spec.torch_reference(*(args64[a] for a in spec.arguments)))
    grads64 = torch.autograd.grad([outs64[n] for n in spec.grad_outputs], [args64[a] for a in grad_inputs],
                                  [dys[n].to("cpu", torch.float64) for n in spec.grad_outputs])
    np_in = {k: to_numpy(v) if isinstance(v, torch.Tensor) else v for k, v in args64.items()}
    np_in.update({f"d{n}": to_numpy(d) for n, d in dys.items()})
    np_out = {k: to_numpy(v) for k, v in outs64.items()}
    np_grads = {n: to_numpy(g) for n, g in zip(grad_inputs, grads64)}
    allowed = spec.grad_tolerance(case, np_in, np_out, np_grads, generic.precision(impl, case))
    for name, got in grads.items():
        assert_close(f"d{name}", got, np_grads[name], allowed[f"d{name}"],
                     what=f"gradient past 2**31 elements ({where}, slices {index})", dtype=got.dtype, record=False)


def verdict_of(target: str, op: str, dtype_name: str):
    """The check on the implementation ``target`` as a self-test verdict (failed or not),
    for running it in an isolated child (a wild offset can break the CUDA context)."""
    from tritoncheck import backend, registry
    from tritoncheck.selfcheck import Verdict
    from tritoncheck.strategies import dtype_from_name
    registry.load()
    fn, dtype = registry.resolve(target), dtype_from_name(dtype_name)
    try:
        check(op, Implementation.of(op, fn, kind="mutant", target=target), dtype, backend.device())
    except AssertionError as exc:
        return Verdict(True, dtype, str(exc))
    return Verdict(False, dtype, "")
