"""The registry: one record per op, and the implementations under test.

An :class:`OpSpec` pairs everything the suite knows about an op: the contract
signature, the fp64 references, the input strategy, the tolerance rule, the checks
that apply and which inputs have gradients. Tests are parametrised from it, so a
new op is one ``properties/<family>.py`` that calls :func:`register` (found by
:func:`load`, not listed), and no engine module or test file learns its name.

An :class:`Implementation` is a function that follows the contract: the project's
kernel by default, or whatever a user names with ``--impl OP=module:function`` or
:func:`register_implementation`. What it does not support (dtypes, backward) it
says with attributes on the function; the suite skips those with the reason.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.machinery
import inspect
import pkgutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from hypothesis import strategies as st

from tritoncheck import declarations, refusals
from tritoncheck.backend import BackendLimit
from tritoncheck.bad_input import BadInput
from tritoncheck.calling import Calling, signature_of
from tritoncheck.declarations import Declaration, ExpectedFailure
from tritoncheck.large_problem import LargeProblem
from tritoncheck.limits import Limits
from tritoncheck.strategies import FLOAT_DTYPES, Case

_loaded: list[bool] = []  # load() imports the family modules once


@dataclass(frozen=True)
class Check:
    """A property or reference comparison that must hold for every case.

    ``run(case, impl)`` raises ``AssertionError`` when the property fails.
    ``cases(op, dtype)`` (optional) replaces the op's strategy for this check; ``requires``
    (optional) returns a reason when an implementation cannot be checked this way.
    ``false_alarm``: for a statistical check (one that a correct implementation fails with
    a small probability, e.g. a binomial test of a dropout mask), that probability per
    example; None for checks that a correct implementation never fails. The report adds
    them up per test and per run (a union bound).
    ``needs_arguments``: optional arguments the check passes whatever its cases drew
    (``window_equivalences`` passes a window); ``needs_outputs``: outputs it cannot do
    without (a key-split merge weighs blocks by their lse). An implementation whose
    signature cannot take one, or which declares it does not return one, is not checked
    by it (skipped with the reason; tritoncheck/calling.py).
    """

    name: str
    run: Callable[[Case, "Implementation"], None]
    cases: Callable[["OpSpec", torch.dtype], st.SearchStrategy[Case]] | None = None
    requires: Callable[["Implementation"], str | None] | None = None
    false_alarm: float | None = None
    needs_arguments: tuple[str, ...] = ()
    needs_outputs: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"Check name must be an identifier, got {self.name!r}")
        if not callable(self.run):
            raise TypeError(f"Check {self.name!r}: run must be callable")
        if self.false_alarm is not None and (isinstance(self.false_alarm, bool)
                                             or not isinstance(self.false_alarm, float)
                                             or not 0.0 < self.false_alarm < 1.0):
            raise ValueError(f"Check {self.name!r}: false_alarm must be a float in (0, 1) (the probability per "
                             f"example that a correct implementation fails it) or None, got {self.false_alarm!r}")

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.run) or ""


def _float64(v):
    """A floating-point tensor as float64 where it is; anything else as it is."""
    if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
        return v.detach().to(torch.float64)
    return v


@dataclass(frozen=True)
class NotApplicable:
    """A record's declared absence of a side check (``large_problem``, ``bad_input``) and
    why: the record is complete with it, and the side check skips the op with the reason."""

    reason: str

    def __post_init__(self):
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("NotApplicable needs a reason: why the side check cannot apply to the op")


@dataclass(frozen=True)
class OpSpec:
    """Everything the suite knows about one op of the contract (``docs/contract.md``,
    generated from these records).

    ``meaning`` is the contract's sentence on shapes and semantics; ``scalars`` names the
    arguments that are not tensors; ``dims`` names the sizes a kernel may declare limits
    on, each as (tensor argument, axis); ``choices`` the scalar arguments whose values the
    strategy draws from a set, with that set (a kernel may narrow it).

    What the self-test and the side checks need of the op is on the record too:
    ``controls`` (correct plain-PyTorch implementations, ``module:function``, that must pass
    every check), ``baseline`` (the same computation in plain PyTorch in the input dtype,
    ``(case, values, outs) -> outputs``, for ``--tolerance parity``), ``large_problem`` (its
    input past 2**31 elements) and ``bad_input`` (invalid calls its wrapper must refuse), or
    :class:`NotApplicable` with the reason. tests/test_registry.py fails for an op that lacks any of them.

    ``distributed``: the op's implementations run on ``CONFIG.world_size`` ranks at once
    (``--cp-world-size``; tritoncheck/rank_pool.py), each rank a process of its own, called by
    the op's checks rather than by ``Case.call``; the self-test hunts them in its own process
    (the ranks already keep a planted bug's crash out of it, and a daemonic hunt child could
    not start them).
    """

    name: str
    signature: str
    arguments: tuple[str, ...]  # positional arguments, contract order
    outputs: tuple[str, ...]  # names of the returned tensors, in order
    kernel: str | None  # "module:function" of the project's kernel (None: a defined op without one)
    reference: Callable[..., Any]  # fp64 NumPy, same signature
    cases: Callable[[torch.dtype], st.SearchStrategy[Case]]
    tolerance: Callable[..., dict[str, np.ndarray]]  # (case, inputs64, expected, precision) -> allowed
    checks: tuple[Check, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    grad_inputs: tuple[str, ...] = ()  # inputs that receive gradients
    grad_outputs: tuple[str, ...] = ()  # outputs that carry them
    torch_reference: Callable[..., Any] | None = None  # fp64 PyTorch, differentiable
    grad_tolerance: Callable[..., dict[str, np.ndarray]] | None = None
    output_shapes: Callable[[Case], dict[str, tuple[int, ...]]] | None = None  # for upstream gradients
    output_dtypes: Mapping[str, torch.dtype] = field(default_factory=dict)  # outputs not in the input dtype
    # the other outputs' dtype, read from the case, for an op whose dtype axis is not its outputs'
    # dtype (scaled_mm's is its input format; its output is in the case's out_dtype)
    result_dtype_of: Callable[[Case], torch.dtype] | None = None
    meaning: str = ""
    scalars: tuple[str, ...] = ()
    dims: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    choices: Mapping[str, tuple] = field(default_factory=dict)
    controls: tuple[str, ...] = ()
    baseline: Callable[[Case, Mapping[str, Any], Mapping[str, torch.Tensor]], Any] | None = None
    large_problem: LargeProblem | NotApplicable | None = None
    bad_input: BadInput | NotApplicable | None = None
    distributed: bool = False
    # layouts an implementation may declare (``fn.layout``) besides the contract's: name ->
    # {tensor (argument or output): the contract's axes in the order the implementation has them}
    layouts: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    # what a backend is known not to run for this op's kernels (tritoncheck/backend.py): a skip
    backend_limits: tuple[BackendLimit, ...] = ()
    # attributes an implementation of this op may declare beyond the generic ones
    # (tritoncheck/declarations.py: rms_norm_cast, chunk_sizes, batch_invariant, ...)
    declarations: tuple[Declaration, ...] = ()
    # "module:qualname" of the definition of an op defined with tritoncheck.op (a replay imports
    # its module to find the op again); "" for an op the suite's properties/ register
    origin: str = ""

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"OpSpec name must be an identifier, got {self.name!r}")
        if not set(self.scalars) <= set(self.arguments):
            raise ValueError(f"OpSpec {self.name!r}: scalars {sorted(set(self.scalars) - set(self.arguments))} "
                             "are not arguments")
        for dim, (tensor, _axis) in self.dims.items():
            if tensor not in self.tensor_arguments:
                raise ValueError(f"OpSpec {self.name!r}: dim {dim!r} names {tensor!r}, not a tensor argument")
        if not set(self.choices) <= set(self.scalars) or not all(self.choices.values()):
            raise ValueError(f"OpSpec {self.name!r}: choices must map scalar arguments to non-empty value sets")
        names = [c.name for c in self.checks]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"OpSpec {self.name!r}: checks named more than once: {sorted(dup)}")
        if self.kernel is not None and ":" not in self.kernel:
            raise ValueError(f"OpSpec {self.name!r}: kernel must be 'module:function', got {self.kernel!r}")
        if self.grad_inputs:
            if None in (self.torch_reference, self.grad_tolerance, self.output_shapes) or not self.grad_outputs:
                raise ValueError(f"OpSpec {self.name!r}: grad_inputs need grad_outputs, torch_reference, "
                                 "grad_tolerance and output_shapes")
            missing = set(self.grad_inputs) - set(self.arguments)
            if missing:
                raise ValueError(f"OpSpec {self.name!r}: grad_inputs {sorted(missing)} are not arguments")
        if not set(self.grad_outputs) <= set(self.outputs):
            raise ValueError(f"OpSpec {self.name!r}: grad_outputs must be among outputs {self.outputs}")
        bad = [c for c in self.controls if not isinstance(c, str) or ":" not in c]
        if bad:
            raise ValueError(f"OpSpec {self.name!r}: controls must be 'module:function' strings, got {bad}")
        if self.baseline is not None and not callable(self.baseline):
            raise TypeError(f"OpSpec {self.name!r}: baseline must be callable")
        if not isinstance(self.distributed, bool):
            raise TypeError(f"OpSpec {self.name!r}: distributed must be a bool")
        for name, kind in (("large_problem", LargeProblem), ("bad_input", BadInput)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (kind, NotApplicable)):
                raise TypeError(f"OpSpec {self.name!r}: {name} must be a {kind.__name__} or NotApplicable(reason), "
                                f"got {type(value).__name__}")
        for check in self.checks:
            if not set(check.needs_arguments) <= set(self.arguments) or not set(check.needs_outputs) <= set(
                    self.outputs):
                raise ValueError(f"OpSpec {self.name!r}: check {check.name!r} needs arguments or outputs the op "
                                 "does not have")
        for layout, axes in self.layouts.items():
            unknown = set(axes) - set(self.tensor_arguments) - set(self.outputs)
            if unknown:
                raise ValueError(f"OpSpec {self.name!r}: layout {layout!r} permutes {sorted(unknown)}, not tensors")
        self._check_large_problem()
        if isinstance(self.bad_input, BadInput):
            unknown = {s.argument for s in self.bad_input.spoilers} - set(self.arguments)
            if unknown:
                raise ValueError(f"OpSpec {self.name!r}: bad_input spoils {sorted(unknown)}, not arguments")

    def _check_large_problem(self) -> None:
        problem = self.large_problem
        if not isinstance(problem, LargeProblem):
            return
        if not set(problem.sliced) <= set(self.tensor_arguments):
            raise ValueError(f"OpSpec {self.name!r}: large_problem slices {problem.sliced}, not all tensor arguments")
        if not set(problem.whole_sum_grads) <= set(self.grad_inputs):
            raise ValueError(f"OpSpec {self.name!r}: large_problem's whole_sum_grads must be among grad_inputs")
        missing = set(self.scalars) - set(self.reference_defaults()) - set(problem.params or {})
        if missing:
            raise ValueError(f"OpSpec {self.name!r}: large_problem needs params for {sorted(missing)} (no default "
                             "in the reference's signature)")

    def reference_defaults(self) -> dict[str, Any]:
        """The arguments' defaults (``alibi_slopes=None`` too), read from the fp64 reference's signature."""
        params = inspect.signature(self.reference).parameters
        return {a: params[a].default for a in self.arguments
                if a in params and params[a].default is not inspect.Parameter.empty}

    def result_dtype(self, case: Case) -> torch.dtype:
        """The dtype the outputs are computed for (rounded into) in ``case``: the case's dtype, or
        what ``result_dtype_of`` reads from it."""
        return self.result_dtype_of(case) if self.result_dtype_of is not None else getattr(torch, case.dtype)

    def dtype_of(self, output: str, case: Case) -> torch.dtype:
        """The contract's dtype of ``output`` in ``case``."""
        return self.output_dtypes.get(output) or self.result_dtype(case)

    @property
    def tensor_arguments(self) -> tuple[str, ...]:
        return tuple(a for a in self.arguments if a not in self.scalars)

    def present_grad_inputs(self, values: Mapping[str, Any]) -> tuple[str, ...]:
        """The differentiable inputs a call passes as tensors: an optional one (a bias, an
        initial state) passed as None has no gradient to check."""
        return tuple(n for n in self.grad_inputs if isinstance(values.get(n), torch.Tensor))

    def unpack(self, result) -> dict[str, torch.Tensor]:
        """Name the outputs an implementation returned, checking their number and type."""
        items = result if isinstance(result, (tuple, list)) else (result,)
        if len(items) != len(self.outputs):
            raise AssertionError(
                f"{self.name} must return {len(self.outputs)} tensor(s) {self.outputs}, got {len(items)}")
        for name, item in zip(self.outputs, items):
            if not isinstance(item, torch.Tensor):
                raise AssertionError(f"{self.name} output {name!r} is a {type(item).__name__}, not a tensor")
        return dict(zip(self.outputs, items))

    def expected(self, case: Case, values: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The fp64 reference on the same (already rounded) inputs: the NumPy reference, or,
        for inputs on a GPU, the op's fp64 torch reference run there (the two are checked
        against each other in tests/test_registry.py; on the GPU the N x N work of
        attention's reference no longer waits on one host thread per worker).

        Returns the reference outputs and the fp64 inputs it was given (NumPy)."""
        inputs64 = {k: (v.detach().to("cpu", torch.float64).numpy() if isinstance(v, torch.Tensor)
                        and v.dtype.is_floating_point else
                        (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v))
                    for k, v in values.items()}
        on_gpu = any(isinstance(values[a], torch.Tensor) and values[a].is_cuda for a in case.args)
        if self.torch_reference is not None and on_gpu:
            with torch.no_grad():
                out = self.torch_reference(*(_float64(values[a]) for a in case.args))
        else:
            out = self.reference(*(inputs64[a] for a in case.args))
        out = out if isinstance(out, tuple) else (out,)
        out = tuple(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t for t in out)
        return dict(zip(self.outputs, out, strict=True)), inputs64


@dataclass(frozen=True)
class Implementation:
    """A function under test for one op, and what it declares it supports."""

    op: str
    name: str
    fn: Callable
    kind: str = "kernel"  # kernel | user | mutant | control
    dtypes: tuple[torch.dtype, ...] | None = None  # None: every dtype of the op
    supports_backward: bool = True
    expected_failures: tuple[ExpectedFailure, ...] = ()
    target: str | None = None  # "module:function", for replay commands
    limits: Limits = field(default_factory=Limits)
    calling: Calling | None = None  # None: the contract's own (every argument, positionally)
    declared: Mapping[str, Any] = field(default_factory=dict)  # its op-specific declarations, validated

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"implementation {self.name!r} of {self.op!r} is not callable")
        if self.kind not in ("kernel", "user", "mutant", "control"):
            raise ValueError(f"implementation kind must be kernel, user, mutant or control, got {self.kind!r}")

    @classmethod
    def of(cls, op: str, fn: Callable, name: str | None = None, kind: str = "user",
           target: str | None = None) -> "Implementation":
        """Read and validate what ``fn`` declares (``tritoncheck/declarations.py`` lists the
        attributes: ``dtypes``, ``supports_backward``, ``expected_failures``, ``limits``, ...)."""
        load()
        if op not in OPS:
            raise unknown_op(op)
        spec = OPS[op]
        name = name or getattr(fn, "__name__", None) or getattr(fn, "name", "impl")
        owner = target or _target_of(fn) or name
        declarations.check_attributes(fn, owner, spec, _declarations_of_other_ops(op))
        calling = _calling(spec, fn, owner)
        limits = Limits.parse(spec, getattr(fn, "limits", None), owner)
        # what the signature cannot take is never drawn; the declared layout's tensors are
        # contiguous where the function sees them contiguous
        limits = dataclasses.replace(limits, fixed=calling.fixed(), orders=calling.storage_orders())
        return cls(op=op, name=name, fn=fn, kind=kind,
                   dtypes=declarations.dtypes(spec, getattr(fn, "dtypes", None), owner),
                   supports_backward=getattr(fn, "supports_backward", True),
                   expected_failures=declarations.expected_failures(spec, getattr(fn, "expected_failures", None),
                                                                    owner),
                   limits=limits, target=target or _target_of(fn), calling=calling,
                   declared=declarations.declared(spec, fn, owner))

    @property
    def returns(self) -> tuple[str, ...]:
        return self.calling.returns if self.calling is not None else OPS[self.op].outputs

    def not_applicable(self, check: Check) -> str | None:
        """Why ``check`` cannot check this implementation (an argument its signature cannot
        take, an output it does not return), or None."""
        if self.calling is None:
            return None
        return self.calling.lacks(check.needs_arguments) or self.calling.missing_outputs(check.needs_outputs)

    def call(self, values: Mapping[str, Any], passed: tuple[str, ...], extra: Mapping[str, Any] | None = None):
        """The function on ``values``, passing the contract arguments ``passed`` (the others
        keep its defaults) and ``extra`` keywords, as its calling convention says; a refusal
        (tritoncheck/refusals.py) comes out as ``Refused``, a call outside the declared limits
        as ``OutsideLimits``. The raw result."""
        self.limits.outside_call(OPS[self.op], values, passed)  # a check's own values obey the declared limits
        if self.calling is None:
            return refusals.call(self.fn, [values[a] for a in passed], dict(extra or {}))
        args, kwargs = self.calling.call_arguments(values, passed)
        return refusals.call(self.fn, args, {**kwargs, **(extra or {})})

    def outputs(self, result) -> dict[str, torch.Tensor]:
        """The outputs of a call, named (and in the contract's layout)."""
        if self.calling is None:
            return OPS[self.op].unpack(result)
        return self.calling.outputs(result)

    def expected_failure(self, check: str, dtype: torch.dtype) -> ExpectedFailure | None:
        """The declared expected failure of ``check`` in ``dtype`` on this run's backend."""
        from tritoncheck import backend
        return next((e for e in self.expected_failures if e.applies(check, dtype, backend.current())), None)

    def unsupported(self, dtype: torch.dtype) -> str | None:
        if self.dtypes is not None and dtype not in self.dtypes:
            return f"{self.name} declares dtypes {[str(d).replace('torch.', '') for d in self.dtypes]}"
        return None


def _declarations_of_other_ops(op: str) -> dict[str, tuple[str, ...]]:
    """Declaration name -> the ops that list it, for those ``op`` does not list."""
    own = {d.name for d in OPS[op].declarations}
    out: dict[str, list[str]] = {}
    for name, spec in OPS.items():
        for d in spec.declarations:
            if d.name not in own:
                out.setdefault(d.name, []).append(name)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def _calling(spec: OpSpec, fn: Callable, owner: str) -> Calling:
    """``fn``'s calling convention: its signature and its declared ``argument_names``,
    ``layout`` and ``returns``, validated."""
    sig = signature_of(fn)
    params = None if sig is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()) \
        else sig.parameters
    names = declarations.argument_names(spec, getattr(fn, "argument_names", None), owner, params)
    return Calling.of(spec, fn, names=names, layout=declarations.layout(spec, getattr(fn, "layout", None), owner),
                      returns=declarations.returns(spec, getattr(fn, "returns", None), owner))


def _target_of(fn: Callable) -> str | None:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}:{qualname}" if module and qualname and "<" not in qualname else None


OPS: dict[str, OpSpec] = {}
_user_impls: dict[str, list[Implementation]] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in OPS and OPS[spec.name] is not spec:
        raise ValueError(f"op {spec.name!r} is registered twice")
    OPS[spec.name] = spec
    return spec


def unknown_op(op: str) -> ValueError:
    """The usage error for a name the registry has no op of: the closest op, and every one."""
    close = difflib.get_close_matches(op, list(OPS), n=1)
    return ValueError(f"unknown op {op!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                      + f"; known ops: {', '.join(sorted(OPS))}. An op of your own is defined with @tritoncheck.op "
                      "in a module the run imports: --op-module MODULE, OP written as module:op, or "
                      "[tool.tritoncheck] op-modules in pyproject.toml (docs/your-op.md)")


def modules_of(package: str) -> tuple[str, ...]:
    """The modules of one of the suite's packages, by name: the op families are found, not listed."""
    found = importlib.import_module(package)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(found.__path__)))


def load() -> dict[str, OpSpec]:
    """Import every module of ``tritoncheck.properties`` (the family modules register their ops)."""
    if not _loaded:
        for name in modules_of("tritoncheck.properties"):
            importlib.import_module(f"tritoncheck.properties.{name}")
        _loaded.append(True)
    return OPS


def resolve(target: str) -> Callable:
    """Import ``package.module:function`` and return the function; a clear error otherwise."""
    if ":" not in target:
        raise ValueError(f"{target!r} is not of the form package.module:function")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the module raised, the user is told where
        raise ValueError(_import_failure(target, exc)) from exc
    _refuse_shadowed(target, module)
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"{target!r} is a {type(fn).__name__}, not a callable")
    return fn


def _import_failure(target: str, exc: Exception) -> str:
    """Why ``target``'s module did not import, and what to do: the module (or a package on
    its path) is not found, or one of the suite's folders shadows that package (a checkout
    first on sys.path), or the module was found and its own code raised (an import inside
    it that fails: the error, and where)."""
    module_name = target.partition(":")[0]
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and (module_name == missing or module_name.startswith(f"{missing}.")):
        parent = missing.rpartition(".")[0]
        found = sys.modules.get(parent) if parent else None
        where = Path(getattr(found, "__file__", None) or "").resolve()
        if found is not None and not module_name.startswith("tritoncheck.") \
                and any(where.is_relative_to(f) for f in _suite_folders()):
            return (f"cannot import {module_name!r}: {parent!r} is the suite's own {where.parent}"
                    f"{_found_elsewhere(parent)}. The suite's checkout comes first on sys.path here and its "
                    f"{parent.split('.')[0]}/ shadows yours: run `tritoncheck OP=module:function` from your "
                    "project's directory (or pytest there with tritoncheck installed), or rename your package")
        return (f"cannot import {module_name!r}: no module named {missing!r}; is it on PYTHONPATH or in the current "
                f"directory ({Path.cwd()})?")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return (f"importing {module_name!r} for {target} failed inside it: {type(exc).__name__}: {exc}{where}; "
            "the module was found, its own code raised")


def _suite_folders() -> tuple[Path, ...]:
    """The suite's own op folders in a checkout (installed, they live inside the package)."""
    import tritoncheck
    checkout = Path(tritoncheck.__file__).resolve().parent.parent
    if not (checkout / "pyproject.toml").is_file():
        return ()
    return tuple(checkout / name for name in ("kernels", "references", "properties", "controls", "mutants"))


def _refuse_shadowed(target: str, module) -> None:
    """A user's package named like one of the suite's folders (``kernels``), imported while
    the suite's checkout is first on ``sys.path``, resolves to the suite's own code: the run
    would check the suite's kernel under the user's name. Spelled ``tritoncheck.kernels...``
    it is the suite's on purpose; spelled bare, it is an error that names both files."""
    module_name = module.__name__
    path = Path(getattr(module, "__file__", None) or "").resolve()
    if module_name.split(".")[0] == "tritoncheck" or not any(path.is_relative_to(f) for f in _suite_folders()):
        return
    suite_root = _suite_folders()[0].parent
    top = module_name.split(".")[0]
    raise ValueError(
        f"--impl {target}: {module_name!r} resolved to the suite's own {path}, not to your code"
        f"{_found_elsewhere(top)}. The suite's checkout ({suite_root}) comes first on sys.path here and its {top}/ "
        "shadows yours: run `tritoncheck OP=module:function` from your project's directory (or pytest there with "
        "tritoncheck installed), or rename your package.")


def _found_elsewhere(package: str) -> str:
    """Where ``package``'s top-level name is found on sys.path past the suite's checkout, in words."""
    suite_root = _suite_folders()[0].parent
    top = package.split(".")[0]
    others = [Path(entry or ".").resolve() for entry in sys.path if Path(entry or ".").resolve() != suite_root]
    spec = importlib.machinery.PathFinder.find_spec(top, [str(p) for p in others])
    return (f"; the package {top!r} found elsewhere on sys.path is {spec.origin or spec.submodule_search_locations[0]}"
            if spec is not None else "")


def register_implementation(op: str, fn: Callable | str, name: str | None = None) -> Implementation:
    """Test ``fn`` for ``op`` instead of the project's kernel (the Python form of ``--impl``).

    Once any implementation is registered, only the ops that have one are run.
    """
    load()
    if op not in OPS:
        raise unknown_op(op)
    label = fn if isinstance(fn, str) else None
    if isinstance(fn, str):
        fn = resolve(fn)
    impl = Implementation.of(op, fn, name=name or (label.rpartition(":")[2] if label else None), kind="user",
                             target=label)
    impls = _user_impls.setdefault(op, [])
    # an earlier clash named its implementations by path: a third of that name clashes too
    same = [i for i in impls if i.name == impl.name
            or (i.target and i.name == i.target.replace(":", ".") and i.target.rpartition(":")[2] == impl.name)]
    if any(i.fn is impl.fn for i in same):
        return next(i for i in same if i.fn is impl.fn)  # named twice: one implementation, checked once
    if same:
        # two functions of one name from different modules (a kernel and its fix, two libraries'):
        # each is named by its import path, so that their tests, report rows and replay files
        # stay apart (pytest would number the ids, and the report would merge their rows)
        if name is not None:
            raise ValueError(f"register_implementation({op!r}, ..., name={name!r}): that name is already "
                             f"{same[0].target or same[0].name}'s; give each implementation its own")
        impls[:] = [_named_by_path(i) if i.name == impl.name else i for i in impls]
        impl = _named_by_path(impl)
    impls.append(impl)
    return impl


def _named_by_path(impl: Implementation) -> Implementation:
    path = (impl.target or _target_of(impl.fn) or "").replace(":", ".")
    return dataclasses.replace(impl, name=path or f"{impl.name}.{id(impl.fn):x}")


def user_implementations() -> dict[str, list[Implementation]]:
    """The implementations registered with ``--impl`` or :func:`register_implementation`, by op."""
    return {op: list(impls) for op, impls in _user_impls.items()}


def clear_implementations() -> None:
    _user_impls.clear()


def implementations(op: str) -> list[Implementation]:
    """What is under test for ``op``: the user's implementations if any op has one
    (only those ops then), else the project's kernel."""
    if _user_impls:
        return list(_user_impls.get(op, []))
    spec = OPS[op]
    if spec.kernel is None:  # a defined op without a default kernel: checked only through --impl
        return []
    return [Implementation.of(op, resolve(spec.kernel), name="triton", kind="kernel", target=spec.kernel)]
