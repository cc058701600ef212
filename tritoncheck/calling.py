"""How the suite calls an implementation: which of the contract's arguments its signature
takes and how, under which names, in which tensor layout, and which outputs it returns.

Read from the function's signature (for a ``torch.autograd.Function``'s ``apply``, which
shows ``(*args, **kwargs)``, from its ``forward`` less ``ctx``) and from what it declares
(``argument_names``, ``layout``, ``returns``: tritoncheck/declarations.py validates them).
The contract's arguments without a default are passed positionally, in the contract's
order; an optional one by keyword where the signature binds it so (a parameter of that
name, keyword-only included, or ``**kwargs``), else positionally where a parameter sits
at its place in the contract's order, else not at all: the function cannot take it. An
argument it cannot take is held at its default when cases are drawn (the limits'
``fixed``), and a check that needs it is not applicable (``Calling.lacks``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class NotTaken(RuntimeError):
    """A case passes a non-default value of an argument the implementation cannot take:
    the strategies should never have drawn it (a bug of the suite, not of the kernel)."""


def _is_function_apply(fn: Callable) -> type | None:
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", None) == "apply" and isinstance(owner, type) \
            and issubclass(owner, torch.autograd.Function):
        return owner
    return None


def signature_of(fn: Callable) -> inspect.Signature | None:
    """``fn``'s signature as Python binds a call of it, or None where none can be read (a
    builtin: then every argument is passed positionally, as the contract orders them).
    An autograd Function's ``apply`` binds as its ``forward`` does, less ``ctx`` (absent
    from ``forward`` when the Function defines ``setup_context``), and positionally only:
    ``apply`` hands its keyword arguments to the C++ ``_FunctionBase.apply``, which takes
    none in the PyTorch releases most users run ("TypeError: apply() takes no keyword
    arguments" from torch 2.11 on a GPU machine, where 2.13 on the CPU accepted them), so
    a parameter after ``*`` or ``**kwargs`` of ``forward`` cannot be reached through it."""
    function = _is_function_apply(fn)
    try:
        if function is None:
            return inspect.signature(fn)
        sig = inspect.signature(function.forward)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    own_setup = function.setup_context is not torch.autograd.Function.setup_context
    return sig.replace(parameters=[p.replace(kind=inspect.Parameter.POSITIONAL_ONLY) if p.kind in POSITIONAL else p
                                   for p in (params if own_setup else params[1:])
                                   if p.kind in POSITIONAL or p.kind is inspect.Parameter.VAR_POSITIONAL])


def same_value(value: Any, default: Any) -> bool:
    if isinstance(value, torch.Tensor) or isinstance(default, torch.Tensor):
        return value is default
    if isinstance(value, (tuple, list)) and isinstance(default, (tuple, list)):
        return tuple(value) == tuple(default)
    return value is default or (type(value) is type(default) and value == default)


def _inverse(axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(range(len(axes)), key=lambda i: axes[i]))


@dataclass(frozen=True)
class Calling:
    """How to call one implementation of one op (see the module's docstring).

    ``modes`` maps each contract argument the function takes to "positional" or "keyword"
    (one it cannot take is absent); ``names`` the renamed ones to the function's parameter
    names; ``defaults`` the optional arguments to their contract defaults; ``axes`` the
    tensors (arguments and outputs) the declared layout permutes, to the contract axes in
    the function's order; ``returns`` the outputs the function returns, in order."""

    op: str
    arguments: tuple[str, ...]
    returns: tuple[str, ...]
    modes: Mapping[str, str]
    names: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    axes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    layout: str | None = None
    text: str = ""  # the signature as read, for messages

    @classmethod
    def of(cls, spec: Any, fn: Callable, names: Mapping[str, str] | None = None, layout: str | None = None,
           returns: tuple[str, ...] | None = None) -> "Calling":
        names = dict(names or {})
        defaults = spec.reference_defaults()
        sig = signature_of(fn)
        function = _is_function_apply(fn)
        label = f"{function.__qualname__}.apply" if function is not None else \
            getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "fn")
        axes = dict(spec.layouts.get(layout, {})) if layout else {}
        common = dict(op=spec.name, arguments=spec.arguments, returns=tuple(returns or spec.outputs), names=names,
                      defaults=defaults, axes=axes, layout=layout)
        if sig is None:
            return cls(modes={a: "positional" for a in spec.arguments}, text=f"{label}(...)", **common)
        calling = cls(modes=_modes(spec.arguments, defaults, names, sig), text=f"{label}{sig}", **common)
        calling._check_binds(sig, getattr(spec, "signature", spec.name))
        return calling

    def _check_binds(self, sig: inspect.Signature, contract: str) -> None:
        """Raise TypeError where ``sig`` cannot bind the suite's call that passes every
        argument the function takes (a parameter too few for the contract's required
        arguments, a required one the contract never passes). No input can fix such a
        signature, so it is found when the implementation is loaded: a usage error, not a
        failure in every test."""
        args, kwargs = self.call_arguments({a: f"<{a}>" for a in self.arguments}, tuple(self.modes))
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            call = ", ".join([*(str(a) for a in args), *(f"{k}={v}" for k, v in kwargs.items())])
            raise TypeError(
                f"{self.text} cannot be called as the suite calls {self.op}: {exc} (Python's binding of "
                f"{self.text.partition('(')[0]}({call})). Its parameters: {sig}; the op's contract: {contract}, whose "
                "required arguments are passed positionally in that order and the optional ones where the signature "
                "takes them (fn.argument_names maps the contract's names to other parameter names)") from None

    def takes(self, argument: str) -> bool:
        return argument in self.modes

    def lacks(self, arguments: Sequence[str]) -> str | None:
        """Why a check that passes ``arguments`` cannot run here, or None."""
        missing = [a for a in arguments if not self.takes(a)]
        if not missing:
            return None
        return f"not applicable: {self.text} takes no {', '.join(missing)}"

    def missing_outputs(self, outputs: Sequence[str]) -> str | None:
        """Why a check that needs ``outputs`` cannot run here, or None."""
        missing = [o for o in outputs if o not in self.returns]
        if not missing:
            return None
        return (f"not applicable: the implementation returns {', '.join(self.returns)} only (declared returns), "
                f"no {', '.join(missing)}")

    def fixed(self) -> dict[str, Any]:
        """The optional arguments the function cannot take, at the defaults cases hold them to."""
        return {a: d for a, d in self.defaults.items() if not self.takes(a)}

    def call_arguments(self, values: Mapping[str, Any], passed: Sequence[str]) -> tuple[list, dict]:
        """``(args, kwargs)`` of the call that passes ``passed`` (contract arguments; the
        others keep the function's defaults) with ``values``, tensors in the declared layout."""
        for a in passed:
            if not self.takes(a) and not same_value(values.get(a, self.defaults.get(a)), self.defaults.get(a)):
                raise NotTaken(f"{self.op}: the case passes {a}={values[a]!r}, which {self.text} cannot take; "
                               "the suite's strategy should have held it at its default")
        wanted = [a for a in self.arguments if self.takes(a) and (a in passed or a not in self.defaults)]
        positional = [i for i, a in enumerate(self.arguments) if a in wanted and self.modes[a] == "positional"]
        last = max(positional, default=-1)
        # a gap before the last positional one is filled at its contract default: not passed
        args = [self._value(a, values if a in wanted else {}) for a in self.arguments[:last + 1]]
        kwargs = {self.names.get(a, a): self._value(a, values) for a in wanted
                  if self.arguments.index(a) > last}
        return args, kwargs

    def _value(self, argument: str, values: Mapping[str, Any]) -> Any:
        value = values[argument] if argument in values else self.defaults[argument]
        if argument in self.axes and isinstance(value, torch.Tensor):
            return value.permute(self.axes[argument])
        return value

    def outputs(self, result: Any) -> dict[str, torch.Tensor]:
        """Name the outputs the function returned (its declared ``returns``), checking their
        number and type, each back in the contract's layout."""
        items = result if isinstance(result, (tuple, list)) else (result,)
        if len(items) != len(self.returns):
            raise AssertionError(f"{self.op} must return {len(self.returns)} tensor(s) {self.returns}, "
                                 f"got {len(items)}")
        for name, item in zip(self.returns, items):
            if not isinstance(item, torch.Tensor):
                raise AssertionError(f"{self.op} output {name!r} is a {type(item).__name__}, not a tensor")
        return {name: self.restored(name, item) for name, item in zip(self.returns, items)}

    def restored(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """An output in the function's layout, seen in the contract's."""
        return tensor.permute(_inverse(self.axes[name])) if name in self.axes else tensor

    def storage_orders(self) -> dict[str, tuple[int, ...]]:
        """For each permuted argument, the storage order (contract axes, outermost first)
        that makes it contiguous as the function sees it."""
        orders = {a: tuple(axes) for a, axes in self.axes.items() if a in self.arguments}
        # an output's upstream gradient reaches the function's backward in its layout too
        orders.update({f"d{o}": tuple(axes) for o, axes in self.axes.items() if o in self.returns})
        return orders


def _modes(arguments: tuple[str, ...], defaults: Mapping[str, Any], names: Mapping[str, str],
           sig: inspect.Signature) -> dict[str, str]:
    """Contract argument -> how it is passed (see :class:`Calling`); one that cannot be is left out."""
    params = sig.parameters
    kinds = [p.kind for p in params.values()]
    positional = [p.name for p in params.values() if p.kind in POSITIONAL]
    var_positional = inspect.Parameter.VAR_POSITIONAL in kinds
    var_keyword = inspect.Parameter.VAR_KEYWORD in kinds
    own = [names.get(a, a) for a in arguments]
    claimed = set(own)

    def fits_at(i: int) -> bool:
        # contract argument i can be passed positionally: a parameter at its place in the
        # contract's order that is its own or no other argument's, and so are all before it
        if i >= len(positional):
            return var_positional and (not positional or fits_at(len(positional) - 1))
        return all(positional[j] == own[j] or positional[j] not in claimed for j in range(i + 1))

    modes = {}
    for i, a in enumerate(arguments):
        p = params.get(own[i])
        if a not in defaults:  # the contract's required arguments: positionally, whatever their names
            modes[a] = "positional"
        elif (p is not None and p.kind in BY_KEYWORD) or (p is None and var_keyword):
            modes[a] = "keyword"
        elif fits_at(i):
            modes[a] = "positional"
    return modes
