"""What a kernel declares about itself, read from attributes of its function and
validated: an unknown attribute that looks like a misspelt known one, or a value
outside the allowed ones, is an error naming the attribute and what is allowed
(a declaration silently ignored would test the kernel against a promise it never
made, or skip what it did promise).

Expected failures are scoped by check, dtype and backend: a strict xfail applies
only where the declaration says the check fails, and elsewhere the check runs and
must pass (``{"deterministic": "atomics"}`` scoped to ``cuda`` does not make a CPU
run, where the interpreter runs programs in order, fail with XPASS).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

BACKEND_NAMES = ("cuda", "interpret")
# the exception types a wrapper declines an input with (tritoncheck/refusals.py): a refusal
# when declared, a failure with its traceback otherwise
REFUSAL_TYPES = (ValueError, TypeError, NotImplementedError)
DOT_PRECISIONS = ("tf32", "tf32x3", "ieee")

# What any implementation may declare. An op's own declarations (rms_norm_cast, chunk_sizes,
# ...) live on its record (``OpSpec.declarations``, :class:`Declaration` below).
ATTRIBUTES = {
    "dtypes": "a tuple of torch dtypes of the op (float32, float16, bfloat16); others are skipped",
    "supports_backward": "True or False; False skips the gradient checks",
    "expected_failures": "a dict of check name (or (check, dtype or backend, ...)) to reason, or a tuple of "
                         "ExpectedFailure",
    "fp32_dot_precision": f"one of {', '.join(repr(p) for p in DOT_PRECISIONS)}: the precision of fp32 tl.dot",
    "fp8_accumulation": "a dict {'fraction_bits': F, 'promote_every': L}: an fp8 tl.dot's accumulation on the "
                        "GPU keeps F fraction bits (an int in [1, 23], truncating) and its partial sum is added "
                        "into fp32 every L products (an int >= 1, or None: never); the fp8 ops' rules follow it",
    "uses_triton": "True or False; False: plain PyTorch, no interpreter limits apply",
    "limits": "a dict of declared limits (docs/contract.md, Declared limits)",
    "refuses": "a message pattern (regex) or a tuple of them, each a str (a ValueError, TypeError or "
               "NotImplementedError whose message it matches is a declared refusal) or an (exception type, str) "
               "pair (that type instead; never AssertionError)",
    "returns": "a tuple of the op's output names the function returns, in the op's order (e.g. ('o',) for "
               "attention without lse); the checks that need the others are not applicable",
    "layout": "the name of one of the op's tensor layouts (attention, linear attention: 'bhnd', the "
              "contract's, or 'bnhd'); its tensors are passed and returned in it",
    "argument_names": "a dict of the op's argument names to the function's own parameter names "
                      "(e.g. {'sm_scale': 'softmax_scale', 'causal': 'is_causal'})",
    "autotuned": "a tuple of the triton.autotune'd kernels it launches (tritoncheck/autotune_configs.py; "
                 "--autotune-config and benchmarks/autotune_sweep.py pin them)",
    "memory_budget": "a number >= 0: the most device memory a call (forward and backward) allocates besides its "
                     "arguments, outputs and gradients, as a multiple of their bytes (e.g. 1.0; a kernel that "
                     "materialises N x N attention scores has none); the large-index check holds it to it",
}


def _bool(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class Declaration:
    """An attribute the implementations of some ops may set (listed on their records,
    ``OpSpec.declarations``): its name, what it means, and the values it takes
    (``validate(value, owner)`` returns the value or raises an error naming the fix)."""

    name: str
    meaning: str
    validate: Callable[[Any, str], Any]

    def __post_init__(self):
        if not self.name.isidentifier() or self.name in ATTRIBUTES:
            raise ValueError(f"Declaration {self.name!r}: an identifier that is not a generic attribute "
                             f"({', '.join(ATTRIBUTES)})")


def flag(name: str, meaning: str) -> Declaration:
    """A True/False declaration."""
    return Declaration(name, f"True or False; {meaning}", lambda value, owner: _bool(owner, name, value))


def one_of(name: str, values: tuple, meaning: str) -> Declaration:
    text = f"one of {', '.join(repr(v) for v in values)}: {meaning}"

    def validate(value, owner):
        if value not in values:
            raise ValueError(f"{owner}.{name} must be {text}, got {value!r}")
        return value
    return Declaration(name, text, validate)


def _positive_ints(value, owner):
    if not isinstance(value, (tuple, list)) or not value or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in value):
        raise ValueError(f"{owner}.chunk_sizes must be {CHUNK_SIZES.meaning}, got {value!r}")
    return tuple(value)


# Declarations several ops' records list
CHUNK_SIZES = Declaration("chunk_sizes", "a tuple of ints >= 1: the chunk_size keyword values the kernel accepts",
                          _positive_ints)
BATCH_INVARIANT = flag("batch_invariant", "True: each row's outputs are bitwise the same whatever other rows are in "
                                          "the call (the batch_invariant check holds it to that)")
BF16_DOT_UPCAST = flag("bf16_dot_upcast", "True: bf16 is upcast before tl.dot (checked in bf16 on the interpreter)")
E5M2_DOT_UPCAST = flag("e5m2_dot_upcast", "True: float8_e5m2 is upcast before tl.dot under the interpreter (checked "
                                          "in e5m2 on the interpreter)")


def declared(op: Any, fn: Callable, owner: str) -> dict[str, Any]:
    """The op's own declarations ``fn`` sets, validated."""
    return {d.name: d.validate(getattr(fn, d.name), owner) for d in getattr(op, "declarations", ())
            if hasattr(fn, d.name)}


@dataclass(frozen=True)
class ExpectedFailure:
    """``check`` is expected to fail, for ``reason``, in ``dtypes`` (names; None: all)
    on ``backends`` ("cuda", "interpret"; None: both). ``strict``: an unexpected pass
    fails (XPASS strict); False for a failure that shows on some inputs only."""

    check: str
    reason: str
    dtypes: tuple[str, ...] | None = None
    backends: tuple[str, ...] | None = None
    strict: bool = True

    def __post_init__(self):
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"ExpectedFailure({self.check!r}): reason must be a non-empty string")
        if self.backends is not None and not set(self.backends) <= set(BACKEND_NAMES):
            raise ValueError(f"ExpectedFailure({self.check!r}): backends {self.backends} not among {BACKEND_NAMES}")

    def applies(self, check: str, dtype: torch.dtype, backend: str) -> bool:
        name = str(dtype).replace("torch.", "")
        return (check == self.check and (self.dtypes is None or name in self.dtypes)
                and (self.backends is None or backend in self.backends))

    def describe(self) -> str:
        scope = [*(self.dtypes or ()), *(self.backends or ())]
        return f"{self.check}" + (f" ({', '.join(scope)})" if scope else "")


def expected_failures(op: Any, declared: Any, owner: str) -> tuple[ExpectedFailure, ...]:
    """Parse ``fn.expected_failures``; every check, dtype and backend named must exist."""
    where = f"{owner}.expected_failures"
    if declared is None:
        return ()
    items: list[ExpectedFailure] = []
    if isinstance(declared, Mapping):
        for key, reason in declared.items():
            check, *scope = key if isinstance(key, tuple) else (key,)
            dtypes = tuple(s for s in scope if s not in BACKEND_NAMES)
            backends = tuple(s for s in scope if s in BACKEND_NAMES)
            items.append(ExpectedFailure(check, reason, dtypes or None, backends or None))
    elif isinstance(declared, (tuple, list)) and all(isinstance(e, ExpectedFailure) for e in declared):
        items = list(declared)
    else:
        raise TypeError(f"{where} must be {ATTRIBUTES['expected_failures']}, got {declared!r}")
    checks = [c.name for c in op.checks]
    dtypes = [str(d).replace("torch.", "") for d in op.dtypes]
    for e in items:
        if e.check not in checks:
            close = difflib.get_close_matches(str(e.check), checks, n=1)
            raise ValueError(f"{where}: {op.name} has no check {e.check!r}"
                             + (f"; did you mean {close[0]!r}?" if close else f"; its checks: {', '.join(checks)}"))
        bad = [d for d in (e.dtypes or ()) if d not in dtypes]
        if bad:
            raise ValueError(f"{where}[{e.check!r}]: {bad} are neither dtypes of {op.name} ({', '.join(dtypes)}) "
                             f"nor backends ({', '.join(BACKEND_NAMES)})")
    return tuple(items)


def dtypes(op: Any, declared: Any, owner: str) -> tuple[torch.dtype, ...] | None:
    if declared is None:
        return None
    items = tuple(declared) if isinstance(declared, (tuple, list, set, frozenset)) else None
    if not items or not all(isinstance(d, torch.dtype) for d in items):
        raise TypeError(f"{owner}.dtypes must be {ATTRIBUTES['dtypes']}, got {declared!r}")
    foreign = [d for d in items if d not in op.dtypes]
    if foreign:
        raise ValueError(f"{owner}.dtypes: {foreign} are not dtypes of {op.name}: "
                         f"{', '.join(str(d).replace('torch.', '') for d in op.dtypes)}")
    return items


def refuses(declared: Any, owner: str) -> tuple[tuple[tuple[type, ...], re.Pattern], ...]:
    """Parse ``fn.refuses`` into (exception types, compiled pattern) pairs (see
    :mod:`tritoncheck.refusals`). A pattern must name something: one that matches the
    empty message (``""``, ``".*"``) would make every exception of its types a refusal,
    a typo's ``TypeError`` included, which is what declaring refusals exists to stop."""
    if declared is None:
        return ()
    entries = declared if isinstance(declared, (tuple, list)) and not _is_typed_entry(declared) else (declared,)
    parsed = []
    for entry in entries:
        types, pattern = (entry if _is_typed_entry(entry) else (REFUSAL_TYPES, entry))
        types = types if isinstance(types, tuple) else (types,)
        if not isinstance(pattern, str) or not all(isinstance(t, type) and issubclass(t, Exception) for t in types):
            raise TypeError(f"{owner}.refuses must be {ATTRIBUTES['refuses']}, got entry {entry!r}")
        if any(issubclass(t, AssertionError) for t in types):
            raise ValueError(f"{owner}.refuses: {entry!r} declares AssertionError, which is a failed check, "
                             "never a refusal")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{owner}.refuses: {pattern!r} is not a regular expression ({exc})") from None
        if compiled.search(""):
            raise ValueError(f"{owner}.refuses: {pattern!r} matches any message; name the refusal's own words")
        parsed.append((types, compiled))
    return tuple(parsed)


def _is_typed_entry(entry: Any) -> bool:
    """An ``(exception type or types, pattern)`` pair."""
    return (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str)
            and (isinstance(entry[0], type) or (isinstance(entry[0], tuple) and entry[0]
                                                and all(isinstance(t, type) for t in entry[0]))))


def memory_budget(declared: Any, owner: str) -> float | None:
    """Parse ``fn.memory_budget`` (:data:`ATTRIBUTES`): a finite number >= 0, or None (undeclared).

    Why a multiple, not bytes: the large-index check's problem is one size per op, a user's
    run another; a kernel's extra memory scales with its problem (a flash attention's lse
    and workspace are a fraction of q, k and v; a plain attention's scores grow as N^2),
    and a multiple of the call's own tensors says which kind it is at any size."""
    if declared is None:
        return None
    if isinstance(declared, bool) or not isinstance(declared, (int, float)) or not 0 <= declared < float("inf"):
        raise TypeError(f"{owner}.memory_budget must be {ATTRIBUTES['memory_budget']}, got {declared!r}")
    return float(declared)


def check_attributes(fn: Callable, owner: str, op: Any = None, others: Mapping[str, tuple[str, ...]] | None = None
                     ) -> None:
    """Validate every generic attribute's value and ``op``'s own declarations
    (:func:`declared`), and reject an attribute whose name is a near miss of a known one
    (``supports_backwards``, ``dtype``) or a declaration of other ops only (``others``:
    declaration name -> the ops that list it). The cutoff 0.88 of difflib's ratio catches a
    dropped or added letter in any of these names (ratios 0.9-0.97) and lets a kernel's own
    different attributes be (the project's ``dot_precisions`` beside
    ``fp32_dot_precision`` scores 0.81)."""
    own = {d.name: d.meaning for d in getattr(op, "declarations", ())}
    known = {**ATTRIBUTES, **own}
    for name in getattr(fn, "__dict__", {}):
        if name.startswith("_") or name in known:
            continue
        if others and name in others:
            raise ValueError(f"{owner}.{name} is a declaration of {', '.join(others[name])}, not of "
                             f"{getattr(op, 'name', 'this op')}; remove it")
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.88)
        if close:
            raise ValueError(f"{owner} has an attribute {name!r}, which the suite does not read; did you mean "
                             f"{close[0]!r} ({known[close[0]]})?")
    for name in ("supports_backward", "uses_triton"):
        if hasattr(fn, name):
            _bool(owner, name, getattr(fn, name))
    precision = getattr(fn, "fp32_dot_precision", None)
    if precision is not None and precision not in DOT_PRECISIONS:
        raise ValueError(f"{owner}.fp32_dot_precision must be {ATTRIBUTES['fp32_dot_precision']}, got {precision!r}")
    if hasattr(fn, "autotuned"):
        from tritoncheck.autotune_configs import autotuned_kernels  # imports triton: after the backend is chosen
        autotuned_kernels(fn)
    refuses(getattr(fn, "refuses", None), owner)
    _fp8_accumulation(getattr(fn, "fp8_accumulation", None), owner)
    memory_budget(getattr(fn, "memory_budget", None), owner)
    if op is not None:
        declared(op, fn, owner)


def _fp8_accumulation(declared: Any, owner: str) -> None:
    if declared is None:
        return
    bits, every = (declared.get("fraction_bits"), declared.get("promote_every")) if isinstance(declared, Mapping) \
        else (None, None)
    if (not isinstance(declared, Mapping) or set(declared) != {"fraction_bits", "promote_every"}
            or not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 23
            or not (every is None or (isinstance(every, int) and not isinstance(every, bool) and every >= 1))):
        raise ValueError(f"{owner}.fp8_accumulation must be {ATTRIBUTES['fp8_accumulation']}, got {declared!r}")


def returns(op: Any, declared: Any, owner: str) -> tuple[str, ...] | None:
    """Parse ``fn.returns``: a non-empty tuple of the op's outputs, in the op's order (the
    order the function returns them in)."""
    if declared is None:
        return None
    items = (declared,) if isinstance(declared, str) else declared
    if not isinstance(items, (tuple, list)) or not items or not all(isinstance(n, str) for n in items):
        raise TypeError(f"{owner}.returns must be {ATTRIBUTES['returns']}, got {declared!r}")
    unknown = [n for n in items if n not in op.outputs]
    if unknown:
        raise ValueError(f"{owner}.returns: {unknown} are not outputs of {op.name}; its outputs are "
                         f"{', '.join(op.outputs)}")
    if list(items) != [n for n in op.outputs if n in items]:
        raise ValueError(f"{owner}.returns must list the outputs in {op.name}'s order {op.outputs}, got {declared!r}")
    return tuple(items)


def layout(op: Any, declared: Any, owner: str) -> str | None:
    """Parse ``fn.layout``: one of the op's named layouts (``OpSpec.layouts``)."""
    if declared is None:
        return None
    if not op.layouts:
        raise ValueError(f"{owner}.layout: {op.name} has one tensor layout, the contract's; declare none")
    if declared not in op.layouts:
        raise ValueError(f"{owner}.layout must be one of {', '.join(repr(k) for k in op.layouts)} for {op.name}, "
                         f"got {declared!r}")
    return declared


def argument_names(op: Any, declared: Any, owner: str, parameters: Mapping[str, Any] | None) -> dict[str, str]:
    """Parse ``fn.argument_names``: the op's argument names to the function's parameter
    names, each a parameter of the function (``parameters``: its signature's, None where
    it cannot be read or has ``**kwargs``), none named twice."""
    if declared is None:
        return {}
    where = f"{owner}.argument_names"
    if not isinstance(declared, Mapping) or not all(isinstance(k, str) and isinstance(v, str) and v.isidentifier()
                                                    for k, v in declared.items()):
        raise TypeError(f"{where} must be {ATTRIBUTES['argument_names']}, got {declared!r}")
    for key in declared:
        if key not in op.arguments:
            close = difflib.get_close_matches(key, list(op.arguments), n=1)
            raise ValueError(f"{where}: {op.name} has no argument {key!r}"
                             + (f"; did you mean {close[0]!r}?" if close else f"; its arguments: "
                                f"{', '.join(op.arguments)}"))
    values = list(declared.values())
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"{where}: {twice} named for more than one argument")
    if parameters is not None:
        absent = [v for v in values if v not in parameters]
        if absent:
            raise ValueError(f"{where}: the function has no parameter {', '.join(map(repr, absent))}; its "
                             f"parameters: {', '.join(parameters)}")
    return dict(declared)
