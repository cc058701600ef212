"""``tritoncheck.op``: an op defined by its signature and an fp64 reference, checked as deeply
as the suite's own.

    import torch
    import tritoncheck as tc

    @tc.op(inputs={"a": tc.Tensor("M", "K"), "b": tc.Tensor("K", "N")}, grads=("a", "b"),
           independent=("M",), large=("M",))
    def matmul(a, b):
        return a @ b

The decorated function is the reference: it receives float64 tensors (integer tensors as
int64) and returns the outputs (a tensor, or a tuple in ``outputs``' order), differentiable
where ``grads`` asks for gradients. Nothing else is needed: the cases come from the
signature (tritoncheck/define/cases.py), the allowance from the reference
(tritoncheck/define/rules.py, ``derived()`` by default), and every generic check applies
(tritoncheck/define/checks.py lists them). ``tritoncheck --ops mypkg.ops
matmul=mypkg.kernels:matmul`` checks a kernel against it (docs/your-op.md).

The decorator returns a :class:`Definition`, callable as the reference, and registers the
op under its name; the suite's built-in ops use the same door for the parts they share.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from tritoncheck.bad_input import BadInput
from tritoncheck.define import rules
from tritoncheck.define.cases import cases as define_cases
from tritoncheck.define.signature import Dim, DimExpression, Output, Scalar, Signature, Tensor
from tritoncheck.large_problem import LargeProblem
from tritoncheck.limits import NO_LIMITS, Limits
from tritoncheck.registry import OPS, Check, NotApplicable, OpSpec
from tritoncheck.strategies import FLOAT_DTYPES, Case

Rule = rules.Rule | Callable[..., dict[str, np.ndarray]]


@dataclass(frozen=True, eq=False, repr=False)  # eq=False: hashed by identity (a cache key)
class Definition:
    """One op as its author defined it (see :func:`op` for every field)."""

    name: str
    reference: Callable
    signature: Signature
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    grads: tuple[str, ...] = ()
    independent: tuple[str, ...] = ()
    large: tuple[str, ...] = ()
    tolerance: Rule = field(default_factory=rules.derived)
    grad_tolerance: Callable | None = None
    meaning: str = ""
    kernel: str | None = None
    controls: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    numpy: bool = False
    cases: Callable | None = None
    baseline: Callable | None = None
    bad_input: BadInput | NotApplicable | None = None
    large_problem: LargeProblem | NotApplicable | None = None
    numpy_reference: Callable | None = None  # a NumPy twin of the reference, cross-checked by the tests
    layouts: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    origin: str = ""  # "module:qualname" of the reference: where a replay finds the definition

    def __post_init__(self):
        where = f"tritoncheck.op {self.name!r}"
        if not self.name.isidentifier():
            raise ValueError(f"{where}: the name must be an identifier")
        if not callable(self.reference):
            raise TypeError(f"{where}: the reference must be callable")
        params = list(inspect.signature(self.reference).parameters)
        if params[:len(self.signature.inputs)] != list(self.signature.inputs):
            raise ValueError(f"{where}: the reference's parameters {params} must start with the inputs, in their "
                             f"order: {list(self.signature.inputs)}")
        if not self.dtypes or any(not isinstance(d, torch.dtype) for d in self.dtypes):
            raise TypeError(f"{where}: dtypes must be a non-empty tuple of torch dtypes")
        tensors = self.signature.tensors
        for g in self.grads:
            if g not in tensors:
                raise ValueError(f"{where}: grads names {g!r}, not a tensor input ({sorted(tensors)})")
            if tensors[g].dtype is not None and not all(
                    d is None or d.is_floating_point for d in (tensors[g].dtype if isinstance(tensors[g].dtype, tuple)
                                                               else (tensors[g].dtype,))):
                raise ValueError(f"{where}: grads names {g!r}, whose dtype is not floating point")
        if self.grads and self.numpy:
            raise ValueError(f"{where}: gradients need a PyTorch reference (autograd); this one is NumPy")
        dims = set(self.signature.dim_names)
        for group, names in (("independent", self.independent), ("large", self.large)):
            unknown = set(names) - dims
            if unknown:
                raise ValueError(f"{where}: {group} names {sorted(unknown)}, not dims of the op ({sorted(dims)})")
        for d in self.large:
            if d not in self.independent:
                raise ValueError(f"{where}: large grows {d!r}, which must also be independent (its slices are "
                                 "checked one by one against the reference)")
            for t, spec in tensors.items():
                if d in spec.dim_names and not (isinstance(spec.shape[0], DimExpression) and spec.shape[0].name == d
                                                and spec.shape[0].factor == spec.shape[0].divisor == 1):
                    raise ValueError(f"{where}: large grows {d!r}, which must be the first axis of every tensor that "
                                     f"has it ({t} is {spec.describe()})")
        if self.numpy and isinstance(self.tolerance, (rules.Derived, rules.Parity)):
            raise ValueError(f"{where}: the derived rule follows the reference through PyTorch's ops, and parity runs "
                             "it in the input dtype: a NumPy reference can have neither. Write the reference in "
                             "PyTorch, or give tolerance=tritoncheck.allclose(atol=..., rtol=...)")
        if not (isinstance(self.tolerance, (rules.Derived, rules.Parity, rules.Allclose)) or callable(self.tolerance)):
            raise TypeError(f"{where}: tolerance must be tritoncheck.derived(), parity(), allclose() or a rule function")
        if self.kernel is not None and ":" not in self.kernel:
            raise ValueError(f"{where}: kernel must be 'module:function', got {self.kernel!r}")

    def __call__(self, *args, **kwargs):
        return self.reference(*args, **kwargs)

    def __repr__(self) -> str:
        return f"tritoncheck.op {self.name!r} ({self.origin})"

    # ------------------------------------------------------------------ references

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.signature.outputs)

    @property
    def exact(self) -> frozenset[str]:
        return frozenset(n for n, o in self.signature.outputs.items() if o.exact)

    def torch_reference(self, *args):
        """The reference on float64 tensors, its outputs as a tuple, exact outputs rounded to
        their dtype (and held in float64) as the kernel must round them."""
        if self.numpy:
            arrays = [a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a for a in args]
            out = self.reference(*arrays)
            out = out if isinstance(out, tuple) else (out,)
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), "cpu")
            out = tuple(torch.as_tensor(np.asarray(o), device=device) for o in out)
        else:
            out = self.reference(*args)
            out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(self.outputs):
            raise ValueError(f"the reference of {self.name} returned {len(out)} output(s); the op has "
                             f"{len(self.outputs)}: {self.outputs}")
        return tuple(self._rounded(name, o) for name, o in zip(self.outputs, out))

    def _rounded(self, name: str, out):
        spec = self.signature.outputs[name]
        if not spec.exact or spec.dtype is None or not isinstance(out, torch.Tensor):
            return out
        if spec.dtype.is_floating_point:
            return out.to(spec.dtype).to(torch.float64)
        return (torch.round(out) if out.dtype.is_floating_point else out).to(spec.dtype)

    def numpy_reference_of_torch(self, *args):
        """The reference on NumPy float64 arrays (OpSpec.reference's form)."""
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in args]
        with torch.no_grad():
            out = self.torch_reference(*tensors)
        out = tuple(o.detach().cpu().numpy() for o in out)
        return out if len(out) > 1 else out[0]

    def baseline_of(self, case: Case, values: Mapping[str, Any], outs=None):
        """The reference run in the input dtype on the case's inputs: PyTorch's own error, the
        yardstick of ``--tolerance parity`` and of the report's ``vs torch`` column."""
        if self.numpy:
            raise ValueError("a NumPy reference has no run in the input dtype")
        return self.reference(*(values[a] for a in case.args))

    # ------------------------------------------------------------------ shapes

    def output_shapes(self, case: Case) -> dict[str, tuple[int, ...]]:
        """Each output's shape for ``case``: declared, or read from the reference run on meta
        tensors (no values computed)."""
        return dict(zip(self.outputs, _meta_shapes(self, tuple((a, tuple(case.tensors[a].shape),
                                                                  case.tensors[a].dtype) if a in case.tensors
                                                                 else (a, None, case.params[a]) for a in case.args))))

    # ------------------------------------------------------------------ the record

    def spec(self) -> OpSpec:
        from tritoncheck.define import checks
        sig = self.signature
        judge = rules.Judge(rule=self.tolerance if not callable(self.tolerance) else rules.derived(),
                            reference=self.torch_reference, outputs=self.outputs,
                            output_dtypes={n: o.dtype for n, o in sig.outputs.items()}, exact=self.exact,
                            baseline=None if self.numpy else (lambda case, values: self.baseline_of(case, values)))
        tolerance = self.tolerance if callable(self.tolerance) else _described(judge.forward, self.tolerance)
        grad_outputs = tuple(n for n in self.outputs if n not in self.exact and
                             (sig.outputs[n].dtype is None or sig.outputs[n].dtype.is_floating_point))
        grad_tolerance = None
        if self.grads:
            grad_tolerance = self.grad_tolerance or _described(
                functools.partial(_grad_rule, judge, self.grads, grad_outputs),
                self.tolerance if not callable(self.tolerance) else rules.derived())
        dims = {d: sig.first_axis(d) for d in sig.dim_names}
        return OpSpec(
            name=self.name,
            signature=f"{self.name}({', '.join(sig.inputs)}) -> {', '.join(self.outputs)}",
            meaning=self.meaning or _meaning(self),
            arguments=tuple(sig.inputs),
            outputs=self.outputs,
            kernel=self.kernel,
            reference=self.numpy_reference or self.numpy_reference_of_torch,
            torch_reference=None if self.numpy else self.torch_reference,
            cases=self.cases or functools.partial(_cases, self),
            tolerance=tolerance,
            grad_tolerance=grad_tolerance,
            checks=checks.of(self, grad_outputs) + self.checks,
            dtypes=self.dtypes,
            grad_inputs=self.grads,
            grad_outputs=grad_outputs if self.grads else (),
            output_shapes=self.output_shapes,
            output_dtypes={n: o.dtype for n, o in sig.outputs.items() if o.dtype is not None},
            scalars=tuple(sig.scalars),
            dims=dims,
            choices={n: s.choices for n, s in sig.scalars.items() if s.choices},
            controls=self.controls,
            baseline=self.baseline or (None if self.numpy else
                                       (lambda case, values, outs: self.baseline_of(case, values))),
            large_problem=self.large_problem if self.large_problem is not None else checks.large_problem(self),
            bad_input=self.bad_input if self.bad_input is not None else NotApplicable(
                "a defined op's wrapper checks are its author's: declare bad_input=BadInput(...) to check them"),
            layouts=self.layouts,
            origin=self.origin,
        )


def _cases(definition: Definition, dtype: torch.dtype, limits: Limits = NO_LIMITS):
    return define_cases(definition, dtype, limits)


def _described(fn: Callable, rule: rules.Rule) -> Callable:
    fn = functools.partial(fn)
    fn.rule_description = rule.describe()  # read by tritoncheck.generic.rule_name
    return fn


def _grad_rule(judge: rules.Judge, grad_inputs, grad_outputs, case, inputs64, outputs64, grads64, p):
    present = tuple(n for n in grad_inputs if n in grads64)  # an optional input passed as None has none
    return judge.backward(case, inputs64, outputs64, grads64, p, present, grad_outputs)


def _meaning(d: Definition) -> str:
    sig = d.signature
    parts = []
    for name, spec in sig.inputs.items():
        if isinstance(spec, Tensor):
            dtype = "" if spec.dtype is None else f" {spec.dtype}"
            parts.append(f"`{name} {spec.describe()}`{dtype}, {spec.values.describe()}")
        else:
            parts.append(f"`{name}` in {list(spec.choices) if spec.choices else [spec.low, spec.high]}")
    doc = inspect.getdoc(d.reference)
    return (doc.splitlines()[0] + " " if doc else "") + "; ".join(parts)


@functools.lru_cache(maxsize=256)
def _meta_shapes(definition: Definition, arguments: tuple) -> tuple[tuple[int, ...], ...]:
    declared = [o.shape for o in definition.signature.outputs.values()]
    if all(s is not None for s in declared) and not definition.signature.has_batch:
        sizes = _sizes_from(definition, arguments)
        return tuple(tuple(e if isinstance(e, int) else e.size(sizes) for e in s) for s in declared)
    if definition.numpy:
        raise ValueError(f"{definition.name}: a NumPy reference cannot run on meta tensors; declare every output's "
                         "shape: outputs={'y': tritoncheck.Output('M', 'N')}")
    def run(device: str):
        args = []
        for _name, shape, dtype in arguments:
            if shape is None:
                args.append(dtype)  # a scalar's value
                continue
            torch_dtype = getattr(torch, dtype)
            args.append(torch.zeros(shape, dtype=torch.float64 if torch_dtype.is_floating_point else torch_dtype,
                                    device=device))
        with torch.no_grad():
            out = definition.reference(*args)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return tuple(tuple(o.shape) for o in out)

    try:
        return run("meta")
    except (NotImplementedError, RuntimeError):
        # a data-dependent step (nonzero, a routing's index lists, .item()) has no meta form: the
        # reference on zeros (index 0 everywhere, in every integer domain) gives the shapes
        try:
            return run("cpu")
        except Exception as exc:  # noqa: BLE001 - any failure of the user's reference: name the fix
            raise ValueError(f"{definition.name}: the output shapes could not be read from the reference on "
                             f"meta tensors (a data-dependent step) nor on zeros ({type(exc).__name__}: {exc}); "
                             "declare them: outputs={'y': tritoncheck.Output('T', 'H')}") from exc


def _sizes_from(definition: Definition, arguments: tuple) -> dict[str, int]:
    return definition.signature.sizes({name: shape for name, shape, _ in arguments if shape is not None})


def _as_outputs(outputs) -> dict[str, Output]:
    if outputs is None:
        return {"out": Output()}
    if isinstance(outputs, str):
        return {outputs: Output()}
    if isinstance(outputs, Mapping):
        bad = {k: v for k, v in outputs.items() if not isinstance(v, Output)}
        if bad:
            raise TypeError(f"outputs: each value must be a tritoncheck.Output(...), got {bad}")
        return dict(outputs)
    if isinstance(outputs, Sequence) and all(isinstance(o, str) for o in outputs):
        return {o: Output() for o in outputs}
    raise TypeError(f"outputs must be a name, a tuple of names or a dict of name to Output(...), got {outputs!r}")


def op(name: str | None = None, *, inputs: Mapping[str, Tensor | Scalar], outputs=None,
       dims: Mapping[str, Dim] | None = None, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
       grads: Sequence[str] = (), independent: Sequence[str] = (), large: Sequence[str] = (),
       tolerance: Rule | None = None, grad_tolerance: Callable | None = None, meaning: str = "",
       kernel: str | None = None, controls: Sequence[str] = (), checks: Sequence[Check] = (),
       numpy: bool = False, cases: Callable | None = None, baseline: Callable | None = None,
       bad_input: BadInput | NotApplicable | None = None,
       large_problem: LargeProblem | NotApplicable | None = None,
       numpy_reference: Callable | None = None,
       layouts: Mapping[str, Mapping[str, tuple[int, ...]]] | None = None) -> Callable[[Callable], Definition]:
    """Define an op from its fp64 reference (the decorated function) and register it.

    ``inputs``: argument name -> :class:`Tensor` or :class:`Scalar`, in call order.
    ``outputs``: a name, names, or name -> :class:`Output` (default one output, ``out``).
    ``dims``: dim name -> :class:`Dim`, where a size needs bounds, a multiple or blocks.
    ``dtypes``: the case dtypes (an input or output whose dtype is None takes it).
    ``grads``: tensor inputs whose gradients are checked (fp64 autograd of the reference).
    ``independent``: dims along which outputs depend only on the same index of the inputs
    (rows); the ``rows_independent`` check holds them to it. ``large``: independent dims
    grown past 2**31 elements for the large-index check (the first axis of their tensors).
    ``tolerance``: ``derived()`` (default), ``parity()``, ``allclose(atol, rtol)``, or a rule
    function ``(case, inputs64, expected, precision) -> {output: allowed}``.
    ``kernel``: the default implementation (``module:function``); ``controls``: correct
    plain-PyTorch implementations that must pass every check (the self-test runs them).
    ``checks``: properties of your own (:class:`tritoncheck.Check`), run beside the generic.
    ``numpy``: the reference takes and returns NumPy arrays (no gradients, no derived rule).
    ``cases``: a strategy ``(dtype, limits) -> SearchStrategy[Case]`` replacing the drawn
    cases (the suite's own ops keep their hand-built ones this way). ``numpy_reference``: a
    NumPy twin of the reference (tests/test_registry.py checks that the two agree); by
    default the reference itself serves on NumPy arrays. ``controls``, ``baseline``,
    ``bad_input``, ``large_problem``: as on :class:`tritoncheck.OpSpec` (by default the
    baseline is the reference run in the input dtype and the large problem follows
    ``large``). ``layouts``: tensor layouts a kernel may declare (``fn.layout = "nk"``)
    besides the signature's, name -> {tensor: the signature's axes in the kernel's order},
    e.g. ``{"nk": {"b": (1, 0)}}`` for a kernel that takes ``b`` as ``[N, K]``."""
    def decorate(reference: Callable) -> Definition:
        sig = Signature(inputs=dict(inputs), outputs=_as_outputs(outputs), dims=dict(dims or {}))
        definition = Definition(
            name=name or reference.__name__, reference=reference, signature=sig, dtypes=tuple(dtypes),
            grads=tuple(grads), independent=tuple(independent), large=tuple(large),
            tolerance=tolerance if tolerance is not None else rules.derived(), grad_tolerance=grad_tolerance,
            meaning=meaning, kernel=kernel, controls=tuple(controls), checks=tuple(checks), numpy=numpy,
            cases=cases, baseline=baseline, bad_input=bad_input, large_problem=large_problem,
            numpy_reference=numpy_reference, layouts=dict(layouts or {}),
            origin=f"{reference.__module__}:{reference.__qualname__}")
        _register(definition)
        return definition
    return decorate


def _register(definition: Definition) -> None:
    """Register the op; the same definition imported again (a module reached under two
    names, a worker's second import) replaces its earlier self, another op of that name is
    an error."""
    spec = definition.spec()
    known = OPS.get(definition.name)
    earlier = _where(DEFINITIONS.get(definition.name))
    if known is not None and (earlier != _where(definition) if earlier else known.origin != spec.origin):
        raise ValueError(f"op {definition.name!r} is defined twice: by {known.origin or 'the suite'} and by "
                         f"{spec.origin}; give one of them another name (tritoncheck.op(name=...))")
    OPS[definition.name] = spec
    DEFINITIONS[definition.name] = definition


def _where(definition: Definition | None) -> tuple | None:
    """Where a definition's reference is written (file and line): the same definition
    imported twice is written in the same place."""
    code = getattr(getattr(definition, "reference", None), "__code__", None)
    return None if code is None else (code.co_filename, code.co_firstlineno)


DEFINITIONS: dict[str, Definition] = {}
