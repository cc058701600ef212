"""Declared limits: the part of the contract's domain a kernel accepts, and how they
steer generation.

A kernel that accepts part of the domain only (rows up to 65536, head dims 64 and
128, causal only, cos/sin in x's dtype, contiguous inputs) says so with
``fn.limits``; the strategies then draw inside those limits, so the kernel still gets
its full share of examples (filtering drawn cases with ``assume`` would discard most
of them). The vocabulary is one dict, validated against the op's named dims and
scalar arguments (``OpSpec.dims``, ``OpSpec.choices``)::

    fn.limits = {
        "max_size": {"N": 65536},           # a named dim's largest accepted size
        "min_size": {"N": 16},              # ... and smallest
        "sizes": {"D": (64, 128)},          # a named dim's accepted sizes, all of them
        "values": {"causal": (True,)},      # a scalar argument's accepted values
        "same_dtype": ("cos", "sin"),       # float tensors drawn in the case's dtype only
        "contiguous": True,                 # every tensor contiguous (or a tuple of names)
    }

What a kernel refuses without declaring it is counted as a refusal (see
``tritoncheck/refusals.py``); what it declares is never drawn, and the report lists it.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from hypothesis import strategies as st

from tritoncheck import shape_pool
from tritoncheck.calling import same_value
from tritoncheck.config import CONFIG
from tritoncheck.strategies import Case, Layout, lengths, sizes

KEYS = {
    "max_size": "{dim: n}: the largest size of a named dim the kernel accepts",
    "min_size": "{dim: n}: the smallest size of a named dim the kernel accepts",
    "sizes": "{dim: (n, ...)}: every size of a named dim the kernel accepts",
    "values": "{argument: (value, ...)}: the values of a scalar argument the kernel accepts",
    "same_dtype": "(tensor, ...): float tensor arguments the kernel accepts only in the case's dtype",
    "contiguous": "True, or (tensor, ...): tensor arguments the kernel accepts only contiguous",
}


class OutsideLimits(Exception):
    """A check needs cases that the implementation's declared limits exclude."""


class NotApplicable(OutsideLimits):
    """A check needs a value of an argument the implementation's signature cannot take."""


def _suggest(name: str, known: Sequence[str]) -> str:
    close = [k for k in known if k.lower() == name.lower()] or difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class Limits:
    """A kernel's declared limits, parsed by :meth:`parse` (the vocabulary is above)."""

    max_size: Mapping[str, int] = field(default_factory=dict)
    min_size: Mapping[str, int] = field(default_factory=dict)
    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    values: Mapping[str, tuple] = field(default_factory=dict)
    same_dtype: tuple[str, ...] = ()
    contiguous: tuple[str, ...] = ()
    # not declared: read from the implementation (tritoncheck/calling.py). ``fixed``: the
    # optional arguments its signature cannot take, held at their defaults; ``orders``: the
    # storage order that makes a tensor contiguous in its declared layout
    fixed: Mapping[str, Any] = field(default_factory=dict)
    orders: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, op: Any, declared: Any, owner: str) -> "Limits":
        """Validate ``declared`` (a kernel's ``fn.limits``) against ``op``; every error
        names the attribute, the bad entry and the fix."""
        where = f"{owner}.limits"
        if declared is None:
            return cls()
        if not isinstance(declared, Mapping):
            raise TypeError(f"{where} must be a dict with keys {sorted(KEYS)}, got {type(declared).__name__}")
        dims, tensors, choices = tuple(op.dims), op.tensor_arguments, op.choices
        out: dict[str, Any] = {}
        for key, value in declared.items():
            if key not in KEYS:
                if key in dims:
                    fix = f"a dim: write {{'max_size': {{{key!r}: n}}}} or {{'sizes': {{{key!r}: (n, ...)}}}}"
                elif key in choices:
                    fix = f"a scalar argument: write {{'values': {{{key!r}: (...)}}}}"
                else:
                    fix = f"known keys: {', '.join(KEYS)}{_suggest(str(key), tuple(KEYS))}"
                raise ValueError(f"{where}: unknown key {key!r}; {key!r} is {fix}" if key in dims or key in choices
                                 else f"{where}: unknown key {key!r}; {fix}")
            if key in ("max_size", "min_size", "sizes"):
                out[key] = cls._parse_dims(where, key, value, dims, op.name)
            elif key == "values":
                out[key] = cls._parse_values(where, value, choices, op.name)
            elif key == "contiguous" and isinstance(value, bool):
                out[key] = tensors if value else ()
            else:
                out[key] = cls._parse_names(where, key, value, tensors, op.name)
        limits = cls(**out)
        for dim in set(limits.min_size) & set(limits.max_size):
            if limits.min_size[dim] > limits.max_size[dim]:
                raise ValueError(f"{where}: min_size {dim}={limits.min_size[dim]} exceeds max_size "
                                 f"{dim}={limits.max_size[dim]}")
        for dim, allowed in limits.sizes.items():
            if not any(limits.min_size.get(dim, 1) <= n <= limits.max_size.get(dim, n) for n in allowed):
                raise ValueError(f"{where}: no size of {dim} in {allowed} is inside min_size/max_size")
        return limits

    @staticmethod
    def _parse_dims(where, key, value, dims, op) -> dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}[{key!r}] must be a dict of dim name to "
                            f"{'sizes' if key == 'sizes' else 'a size'}, got {value!r}")
        out = {}
        for dim, v in value.items():
            if dim not in dims:
                raise ValueError(f"{where}[{key!r}]: {op} has no dim {dim!r}; its dims are "
                                 f"{', '.join(dims) or 'none'}{_suggest(str(dim), dims)}")
            items = tuple(v) if key == "sizes" and isinstance(v, (tuple, list, set, frozenset)) else v
            check = items if key == "sizes" else (items,)
            if key == "sizes" and not isinstance(items, tuple) or not check or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in check):
                want = "a non-empty tuple of sizes >= 1" if key == "sizes" else "an int >= 1"
                raise ValueError(f"{where}[{key!r}][{dim!r}] must be {want}, got {v!r}")
            out[dim] = tuple(sorted(set(items))) if key == "sizes" else items
        return out

    @staticmethod
    def _parse_values(where, value, choices, op) -> dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where}['values'] must be a dict of argument name to accepted values, got {value!r}")
        out = {}
        for arg, v in value.items():
            if arg not in choices:
                raise ValueError(f"{where}['values']: {op} draws no argument {arg!r} from a set; limits apply to "
                                 f"{', '.join(choices) or 'none'}{_suggest(str(arg), tuple(choices))}")
            items = tuple(v) if isinstance(v, (tuple, list, set, frozenset)) else None
            if not items or any(x not in choices[arg] for x in items):
                raise ValueError(f"{where}['values'][{arg!r}] must be a non-empty tuple from {choices[arg]}, "
                                 f"got {v!r}")
            out[arg] = items
        return out

    @staticmethod
    def _parse_names(where, key, value, tensors, op) -> tuple[str, ...]:
        items = (value,) if isinstance(value, str) else value
        if not isinstance(items, (tuple, list)) or not items:
            raise TypeError(f"{where}[{key!r}] must be a tuple of tensor argument names"
                            f"{' or True' if key == 'contiguous' else ''}, got {value!r}")
        for name in items:
            if name not in tensors:
                raise ValueError(f"{where}[{key!r}]: {name!r} is not a tensor argument of {op}; its tensors are "
                                 f"{', '.join(tensors)}{_suggest(str(name), tensors)}")
        return tuple(items)

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in dataclasses.fields(self))

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name)}

    def describe(self) -> str:
        parts = []
        for dim in sorted(set(self.min_size) | set(self.max_size)):
            lo, hi = self.min_size.get(dim), self.max_size.get(dim)
            parts.append(f"{lo} <= {dim} <= {hi}" if lo and hi else f"{dim} >= {lo}" if lo else f"{dim} <= {hi}")
        parts += [f"{dim} in {list(v)}" for dim, v in self.sizes.items()]
        parts += [f"{arg} in {list(v)}" for arg, v in self.values.items()]
        if self.same_dtype:
            parts.append(f"{', '.join(self.same_dtype)} in the case's dtype")
        if self.contiguous:
            parts.append(f"{', '.join(self.contiguous)} contiguous")
        parts += [f"{arg} = {v!r} (its signature takes no {arg})" for arg, v in self.fixed.items()]
        return "; ".join(parts) or "none"

    def held(self, arg: str) -> bool:
        """Whether ``arg`` is an argument the implementation cannot take (held at its default)."""
        return arg in self.fixed

    def not_taken(self, arg: str, what: str) -> NotApplicable:
        return NotApplicable(f"not applicable: the implementation's signature takes no {arg}; this check needs {what}")

    # ------------------------------------------------------------------ steering

    def bounds(self, dim: str) -> bool:
        """Whether any size limit names ``dim``."""
        return dim in self.min_size or dim in self.max_size or dim in self.sizes

    def joined(self, dim: str, other: str) -> "Limits":
        """These limits with ``other``'s size limits added to ``dim``'s (two dims that
        must be equal, e.g. Nq and Nk of causal attention)."""
        lo = max(self.min_size.get(dim, 1), self.min_size.get(other, 1))
        hi = min(self.max_size.get(dim, 2**62), self.max_size.get(other, 2**62))
        allowed = set(self.sizes.get(dim, ())) or set(self.sizes.get(other, ()))
        if dim in self.sizes and other in self.sizes:
            allowed &= set(self.sizes[other])
            if not allowed:
                raise OutsideLimits(f"the declared sizes of {dim} and {other}, which must be equal here, share none")
        return dataclasses.replace(self, min_size={**self.min_size, dim: lo},
                                   max_size={**self.max_size, dim: hi},
                                   sizes={**self.sizes, **({dim: tuple(sorted(allowed))} if allowed else {})})

    def halved(self, dim: str) -> "Limits":
        """The limits of ``dim`` for a strategy that draws half of it (rope draws the
        number of pairs, D / 2)."""
        if not self.bounds(dim):
            return self
        sizes_ = {**self.sizes}
        if dim in self.sizes:
            sizes_[dim] = tuple(n // 2 for n in self.sizes[dim] if n % 2 == 0)
            if not sizes_[dim]:
                raise OutsideLimits(f"the declared sizes of {dim} hold no even size")
        lo = {**self.min_size, **({dim: -(-self.min_size[dim] // 2)} if dim in self.min_size else {})}
        hi = {**self.max_size, **({dim: max(1, self.max_size[dim] // 2)} if dim in self.max_size else {})}
        return dataclasses.replace(self, min_size=lo, max_size=hi, sizes=sizes_)

    def size(self, dim: str, lo: int, hi: int, *, blocks: Sequence[int] = ()) -> st.SearchStrategy[int]:
        """:func:`tritoncheck.strategies.sizes` for a named dim, inside the limits.

        ``[lo, hi]`` is what the op's strategy would draw (the profile's budget); the
        declared bounds narrow it. Declared sizes are drawn as they are: the ones in
        ``[lo, hi]``, else the smallest above ``hi`` (a kernel that accepts only large
        sizes is tested at the smallest it accepts, not skipped)."""
        lo2, hi2 = max(lo, self.min_size.get(dim, lo)), min(hi, self.max_size.get(dim, hi))
        if dim in self.sizes:
            allowed = [n for n in self.sizes[dim] if n >= lo and self.min_size.get(dim, 1) <= n
                       <= self.max_size.get(dim, n)]
            inside = [n for n in allowed if n <= hi]
            if inside or allowed:
                return st.sampled_from(inside or allowed[:1])
            raise OutsideLimits(f"declared sizes {dim} in {list(self.sizes[dim])} leave none >= {lo}")
        if lo2 > hi2:
            if lo2 > lo and self.min_size.get(dim, 0) > hi:
                return st.just(lo2)  # the smallest accepted size, past the profile's budget
            raise OutsideLimits(f"this check needs {dim} >= {lo}; the declared limits allow {dim} <= {hi2}")
        return sizes(lo2, hi2, blocks=blocks)

    def specialised(self, op: str, dim: str, lo: int, hi: int, *, blocks: Sequence[int] = (),
                    span: tuple[int, int] | None = None) -> st.SearchStrategy[int]:
        """:meth:`size` for a dim that kernels specialise or autotune on (head dims, heads,
        batch, a row-wise op's last dim): with ``--shapes N``, from the run's pool
        (:mod:`tritoncheck.shape_pool`) inside the limits. Declared sizes win over the pool;
        ``span`` is the widest range the op ever draws, so every worker builds one pool."""
        lo2, hi2 = max(lo, self.min_size.get(dim, lo)), min(hi, self.max_size.get(dim, hi))
        if CONFIG.shapes is None or dim in self.sizes or lo2 > hi2:
            return self.size(dim, lo, hi, blocks=blocks)
        return shape_pool.sizes(op, dim, lo2, hi2, blocks=blocks, span=span or (lo, hi))

    def length(self, op: str, dim: str, lo: int, hi: int, *, long_max: int, long_percent: int,
               blocks: Sequence[int] = ()) -> st.SearchStrategy[int]:
        """A row length: :func:`tritoncheck.strategies.lengths` (the everyday range, and
        now and then one past 4096, up to ``long_max``) inside the limits; with
        ``--shapes N`` or declared sizes, :meth:`specialised` over the whole range."""
        if CONFIG.shapes is not None or dim in self.sizes:
            return self.specialised(op, dim, lo, hi, blocks=blocks, span=(lo, max(hi, long_max)))
        # undeclared, the cap is the longest the op draws: an op without a long branch on
        # this backend (long_max below hi) still draws its everyday range through lengths
        cap = self.max_size.get(dim, max(hi, long_max))
        lo2 = max(lo, self.min_size.get(dim, lo))
        if lo2 > min(hi, cap):
            return self.size(dim, lo, hi, blocks=blocks)
        return lengths(lo2, min(hi, cap), long_max=min(long_max, cap), long_percent=long_percent, blocks=blocks)

    def specialised_pick(self, op: str, dim: str, pool: Sequence[int]) -> st.SearchStrategy[int]:
        """:meth:`pick` for a specialised dim drawn from a list (head dims): with
        ``--shapes N``, the boundaries among the allowed values and N others."""
        inside = [n for n in pool if self.min_size.get(dim, n) <= n <= self.max_size.get(dim, n)]
        if CONFIG.shapes is None or dim in self.sizes or not inside:
            return self.pick(dim, pool)
        return shape_pool.choice(op, dim, inside)

    def pick(self, dim: str, pool: Sequence[int]) -> st.SearchStrategy[int]:
        """A size of ``dim`` from the op's pool (e.g. head dims), inside the limits;
        declared sizes replace the pool."""
        if dim in self.sizes:
            return st.sampled_from(self.sizes[dim])
        inside = [n for n in pool if self.min_size.get(dim, n) <= n <= self.max_size.get(dim, n)]
        if not inside:
            raise OutsideLimits(f"no {dim} in {list(pool)} is inside the declared limits ({self.describe()})")
        return st.sampled_from(inside)

    def variant(self, arg: str, values: Sequence, *, off: Any, on: bool) -> st.SearchStrategy:
        """:meth:`choice` of a variant argument whose value ``off`` turns the variant off
        (no window, no softcap). With ``--shape-classes`` (opt-in, for the quick profile) only the
        values on one side are drawn, ``on`` saying which, when the limits leave one there:
        a strategy draws one ``on`` per case for all its variants, so that every variant
        is on or every one off, the variant flags a kernel compiles on taking two
        combinations per run instead of every one (a check that fixes a variant fixes its
        side). The gpu profile draws every combination."""
        if CONFIG.shape_classes is not None and arg not in self.fixed:
            side = [v for v in values if same_value(v, off) != on and v in self.values.get(arg, values)]
            if side:
                return self.choice(arg, side)
        return self.choice(arg, values)

    def choice(self, arg: str, values: Sequence) -> st.SearchStrategy:
        """A value of a scalar argument from ``values``, inside the limits; an argument the
        implementation cannot take is its default, or the check is not applicable."""
        if arg in self.fixed:
            if not any(same_value(v, self.fixed[arg]) for v in values):
                raise self.not_taken(arg, f"{arg} in {list(values)}")
            return st.just(self.fixed[arg])
        inside = [v for v in values if v in self.values.get(arg, values)]
        if not inside:
            raise OutsideLimits(f"this check needs {arg} in {list(values)}; the declared limits allow "
                                f"{list(self.values[arg])}")
        return st.sampled_from(inside)

    def fit(self, case: Case) -> Case:
        """``case`` with its tensors inside the dtype and layout limits (a layout or a
        table dtype changes no value the op's domain depends on)."""
        if not (self.same_dtype or self.contiguous or self.orders):
            return case
        specs = dict(case.tensors)
        for name in self.same_dtype:
            if name in specs and specs[name].torch_dtype.is_floating_point:
                specs[name] = dataclasses.replace(specs[name], dtype=case.dtype)
        for name in specs:
            # upstream gradients (not arguments) reach the kernel's backward: contiguous too
            if name in self.contiguous or (self.contiguous and name not in case.args):
                order = self.orders.get(name)
                specs[name] = dataclasses.replace(specs[name], layout=None if order is None else Layout(order=order))
        return dataclasses.replace(case, tensors=specs)

    def outside_call(self, op: Any, values: Mapping[str, Any], passed: Sequence[str]) -> None:
        """Raise :class:`OutsideLimits` where a call of the implementation with ``values``
        (the contract arguments ``passed``; tensors in the contract's layout) lies outside
        the declared limits: a scalar outside its declared ``values``, a named dim outside
        its sizes, a float tensor of ``same_dtype`` in another dtype than the first tensor.

        The one place every check's call passes (``Implementation.call``): a check that
        passes values of its own (attention's softcap 512 against a plain call, window
        equivalences' windows and causal flag) is bound by the declared domain as the drawn
        cases are, or not applicable (the harness discards such an example, and skips a
        test that could run none)."""
        if not (self.values or self.sizes or self.min_size or self.max_size or self.same_dtype):
            return
        for arg, allowed in self.values.items():
            if arg in passed and arg in values and not any(same_value(values[arg], v) for v in allowed):
                raise OutsideLimits(f"this check calls the implementation with {arg}={values[arg]!r}, outside its "
                                    f"declared limits ({arg} in {list(allowed)})")
        for dim, (tensor, axis) in op.dims.items():
            t = values.get(tensor)
            if not self.bounds(dim) or not hasattr(t, "shape") or t.dim() <= (axis if axis >= 0 else -axis - 1):
                continue
            n = t.shape[axis]
            if not self.min_size.get(dim, n) <= n <= self.max_size.get(dim, n) or n not in self.sizes.get(dim, (n,)):
                raise OutsideLimits(f"this check calls the implementation with {dim} = {n}, outside its declared "
                                    f"limits ({self.describe()})")
        tensors = [a for a in passed if hasattr(values.get(a), "dtype")]
        for name in self.same_dtype:
            t = values.get(name)
            if name in passed and tensors and t is not None and t.dtype.is_floating_point \
                    and t.dtype != values[tensors[0]].dtype:
                raise OutsideLimits(f"this check calls the implementation with {name} in {t.dtype}, outside its "
                                    f"declared limits ({name} in {tensors[0]}'s dtype)")

    def excludes(self, op: Any, case: Case) -> str | None:
        """Why ``case`` lies outside the limits, or None (for tests of the steering)."""
        for dim, (tensor, axis) in op.dims.items():
            if tensor not in case.tensors:  # an optional tensor argument the case does not pass
                continue
            n = case.tensors[tensor].shape[axis]
            if not self.min_size.get(dim, n) <= n <= self.max_size.get(dim, n) or n not in self.sizes.get(dim, (n,)):
                return f"{dim} = {n}"
        for arg, allowed in self.values.items():
            if case.params[arg] not in allowed:
                return f"{arg} = {case.params[arg]!r}"
        for arg, default in self.fixed.items():
            drawn = case.tensors.get(arg, case.params.get(arg, default))
            if not same_value(drawn, default):
                return f"{arg} = {drawn!r} (its signature takes no {arg})"
        for name in self.same_dtype:
            if name not in case.tensors:  # an optional tensor argument the case does not pass
                continue
            if case.tensors[name].torch_dtype.is_floating_point and case.tensors[name].dtype != case.dtype:
                return f"{name} in {case.tensors[name].dtype}"
        for name in self.contiguous:
            if name not in case.tensors:
                continue
            layout = case.tensors[name].layout
            if layout is not None and not layout.contiguous:
                return f"{name} {layout.describe()}"
        return None


NO_LIMITS = Limits()
