"""What sets the inputs an implementation raised on apart from the ones it ran on.

An implementation that raises on part of the domain (a rope that refuses cos in another
dtype than x, a causal-only attention, a kernel that stops at rows of 4096) is told what
it refused in the terms of the drawn cases, derived from the cases alone, for any op: each
:class:`Feature` reads one property of a case (a scalar argument, a tensor's dtype against
the first tensor's, its layout, a named dim's size, ...) and :func:`contrast` keeps the
properties that split the two groups without exception: a value (or set of values) that
every raised input has and no accepted one, or a size threshold between them. Each split
says what to declare where the op's limits vocabulary can say it (tritoncheck/limits.py):
``{"values": {"causal": (True,)}}``, ``{"same_dtype": ("cos",)}``, ``{"max_size": {"N": 64}}``.

A split is what was seen, not a proof: with few inputs a property can split them by
chance (the report says how many inputs were on each side).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tritoncheck.coverage import layouts_of
from tritoncheck.strategies import Case

MAX_SET = 4  # a split by a set of values names at most this many of them


@dataclass(frozen=True)
class Feature:
    """One property of a case: ``value(case)`` (hashable; None where the case lacks it),
    ``says(v)`` the words for "the case has value v", and ``limits(raised, accepted)`` the
    declaration that keeps the raised values out, where the limits vocabulary has one."""

    name: str
    value: Callable[[Case], Any]
    says: Callable[[Any], str]
    numeric: bool = False
    limits: Callable[[set, set], dict | None] = lambda raised, accepted: None


@dataclass(frozen=True)
class Split:
    """A property that splits the raised inputs from the accepted ones: ``inside`` (words for
    the raised side), ``outside`` (the accepted side), ``limits`` (a declaration, or None)."""

    inside: str
    outside: str
    limits: dict | None
    holds: Callable[[Case], bool]  # whether a case is on the raised side


def _float(spec) -> bool:
    return spec.family != "indices" and spec.torch_dtype.is_floating_point


def features(op: Any, cases: Sequence[Case]) -> list[Feature]:
    """The properties to try, simplest first: scalar arguments, tensors' dtypes against the
    first tensor argument's, optional tensors present or not, layouts, named dims, other
    dims, value families and scales."""
    out: list[Feature] = []
    params = sorted({k for c in cases for k in (*c.params, *c.kwargs)})
    choices = getattr(op, "choices", {})
    for name in params:
        def value(c, name=name):
            v = c.params.get(name, c.kwargs.get(name))
            return tuple(v) if isinstance(v, list) else v

        def limits(raised, accepted, name=name):
            kept = tuple(v for v in choices.get(name, ()) if v not in raised)
            return {"values": {name: kept}} if name in choices and kept else None

        numeric = all(isinstance(value(c), (int, float)) and not isinstance(value(c), bool) for c in cases)
        out.append(Feature(name, value, lambda v, name=name: f"{name}={v!r}", limits=limits))
        if numeric:
            out.append(Feature(name, value, lambda v, name=name: name, numeric=True))
    tensors = list(dict.fromkeys(n for c in cases for n in c.tensors))
    first = next((a for a in (cases[0].args if cases else ()) if a in cases[0].tensors), None)
    for name in tensors:
        if name == first:
            continue
        out.append(Feature(
            f"{name} dtype", lambda c, name=name: (c.tensors[name].dtype == c.tensors[first].dtype
                                                   if name in c.tensors and _float(c.tensors[name]) else None),
            lambda v, name=name: f"{name} in {first}'s dtype" if v else f"{name} in another dtype than {first}",
            limits=lambda raised, accepted, name=name: {"same_dtype": (name,)} if raised == {False} else None))
    for name in tensors:
        out.append(Feature(f"{name} given", lambda c, name=name: name in c.tensors,
                           lambda v, name=name: f"{name} given" if v else f"no {name}"))
    for name in tensors:
        out.append(Feature(
            f"{name} contiguous", lambda c, name=name: layouts_of(c.tensors[name]) == ["contiguous"]
            if name in c.tensors else None,
            lambda v, name=name: f"{name} contiguous" if v else f"{name} not contiguous",
            limits=lambda raised, accepted, name=name: {"contiguous": (name,)} if raised == {False} else None))
        out.append(Feature(f"{name} layout", lambda c, name=name: tuple(layouts_of(c.tensors[name]))
                           if name in c.tensors else None,
                           lambda v, name=name: f"{name} {'+'.join(v) if v else 'absent'}"))
    ranks = {n: max(len(c.tensors[n].shape) for c in cases if n in c.tensors) for n in tensors}
    named = {(tensor, axis % ranks[tensor] if ranks.get(tensor) else axis): dim
             for dim, (tensor, axis) in getattr(op, "dims", {}).items()}
    for (tensor, axis), dim in named.items():
        def value(c, tensor=tensor, axis=axis):
            return c.tensors[tensor].shape[axis] if tensor in c.tensors and len(c.tensors[tensor].shape) > axis else None

        out.append(Feature(dim, value, lambda v, dim=dim: dim, numeric=True,
                           limits=lambda raised, accepted, dim=dim: _size_limits(dim, raised, accepted)))
        out.append(Feature(dim, value, lambda v, dim=dim: f"{dim}={v}",
                           limits=lambda raised, accepted, dim=dim: {"sizes": {dim: tuple(sorted(accepted))}}
                           if accepted and None not in accepted else None))
    for name in tensors:
        for axis in range(ranks[name]):
            if (name, axis) in named:
                continue
            out.append(Feature(f"{name}.shape[{axis}]", lambda c, name=name, axis=axis: c.tensors[name].shape[axis]
                               if name in c.tensors and len(c.tensors[name].shape) > axis else None,
                               lambda v, name=name, axis=axis: f"{name}.shape[{axis}]", numeric=True))
    for name in tensors:
        out.append(Feature(f"{name} family", lambda c, name=name: c.tensors[name].family if name in c.tensors else None,
                           lambda v, name=name: f"{name} drawn {v!r}"))
        out.append(Feature(f"{name} special values", lambda c, name=name: bool(c.tensors[name].injections)
                           if name in c.tensors else None,
                           lambda v, name=name: f"{name} with injected special values" if v
                           else f"{name} without injected special values"))
    return out


def _size_limits(dim: str, raised: set, accepted: set) -> dict | None:
    if None in raised or None in accepted or not accepted:
        return None
    if min(raised) > max(accepted):
        return {"max_size": {dim: max(accepted)}}
    if max(raised) < min(accepted):
        return {"min_size": {dim: min(accepted)}}
    return None


def _phrase_set(feature: Feature, values: set) -> str:
    items = sorted(values, key=repr)
    if len(items) == 1:
        return feature.says(items[0])
    if all(isinstance(v, bool) for v in items):
        return f"any {feature.name}"
    return " or ".join(feature.says(v) for v in items)


def _split(feature: Feature, raised: list, accepted: list) -> tuple[float, Split] | None:
    """The split ``feature`` makes, with its rank (lower is simpler: one value on the raised
    side, then a threshold, then a set of values), or None."""
    r, a = set(raised), set(accepted)
    if feature.numeric:
        if None in r or None in a or not a:
            return None
        low, high = min(r), max(r)
        name = feature.says(None)
        if low > max(a):
            inside, outside = f"{name} >= {low:g}", f"{name} <= {max(a):g}"
            holds = lambda c: (v := feature.value(c)) is not None and v >= low  # noqa: E731
        elif high < min(a):
            inside, outside = f"{name} <= {high:g}", f"{name} >= {min(a):g}"
            holds = lambda c: (v := feature.value(c)) is not None and v <= high  # noqa: E731
        else:
            return None
        return 1.5, Split(inside, outside, feature.limits(r, a), holds)
    if r & a or len(r) > MAX_SET or not a:
        return None
    outside = _phrase_set(feature, a) if len(a) <= MAX_SET else f"other {feature.name}"
    return float(len(r)), Split(_phrase_set(feature, r), outside, feature.limits(r, a), lambda c: feature.value(c) in r)


def contrast(op: Any, raised: Sequence[Case], accepted: Sequence[Case], most: int = 3) -> list[Split]:
    """The properties (at most ``most``, simplest first) that every case in ``raised`` has and
    no case in ``accepted`` has; empty when no single property splits them, or when nothing
    was accepted (then there is nothing to tell them apart from)."""
    if not raised or not accepted:
        return []
    found: dict[str, tuple[float, int, Split]] = {}
    for order, feature in enumerate(features(op, [*raised, *accepted])):
        ranked = _split(feature, [feature.value(c) for c in raised], [feature.value(c) for c in accepted])
        if ranked is not None and ranked[1].inside not in found:
            found[ranked[1].inside] = (ranked[0], order, ranked[1])
    return [split for _, _, split in sorted(found.values(), key=lambda f: f[:2])][:most]
