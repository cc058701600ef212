"""The derived allowance of an op defined by its reference alone: a running error bound.

The fp64 reference is evaluated once more with every tensor carrying, beside its float64
value, a bound ``e >= 0`` on how far an implementation that evaluates the same expression
in the op's precision may be from that value (first order, per element), and its
*nominal* dtype: the dtype PyTorch eager would hold it in, run on the case's inputs as
they are (``float16`` for a float16 input; ``float32`` after ``.float()``; the promotion of
the operands' for an op; a cast's target). Every ATen op the reference runs adds its
rounding to what it inherits (PyTorch's decompositions open the composite ones:
``softmax`` becomes ``amax``, ``sub``, ``exp``, ``sum``, ``div``):

* inputs: ``e = 0`` (the implementation and the reference read the same rounded inputs),
  but ``|x|`` below fp32's smallest normal, which a GPU may flush to zero (FTZ);
* arithmetic (``add``, ``mul``, ``div``, ``where``, ``maximum``, ...), correctly rounded:
  ``e = sum_i |df/dx_i| e_i + r(z)``, ``mul`` adding the second-order ``e_x e_y``;
* any other pointwise function (``exp``, ``log``, ``erf``, ``tanh``, ``sigmoid``, ``pow``,
  ...): the same, plus its fp32 evaluation ``u32 (EXP_ULPS |z| + sum_i |x_i df/dx_i|)``:
  a library function's few-ulp error and its argument rounded once (the input rounding
  propagated: ``log`` costs ``u32`` absolute, ``exp`` ``u32 |x| |z|``);
* reductions over ``n`` terms (``sum``, ``mean``, ``cumsum``): ``e = sum e_i +
  sum_error(n, u_acc) sum |x_i| + r(z)`` (:func:`tritoncheck.tolerance.sum_error`, in the
  declared accumulation precision); ``amax``/``amin``: the largest ``e_i``;
* products (``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``mv``, ``dot``; ``matmul``,
  ``einsum`` and ``linear`` reach them): ``|A| e_B + e_A |B| + (u_dot + sum_error(K, u_acc))
  |A||B| + K tiny32 + r(z)``: the absolute-value product, ``u_dot`` the declared dot
  precision, each product flushed below fp32's smallest normal; a sum whose magnitudes
  pass fp32's range may overflow an fp32 accumulator (``Evaluation.overflow``);
* a composite op (softmax, layer norm, gelu, var, ...) as PyTorch eager runs it: one
  kernel, its inside in at least fp32, its result rounded once to its nominal dtype;
* rounding steps the reference takes on purpose (``round``, ``floor``, a cast to a
  narrower dtype): 0 where the value is farther than ``e`` from a step, else the step;
* moves of values (views, ``cat``, ``index``, ``gather``, ``where``'s choice, padding,
  ``clone``): the same move of the errors (a fill value moves 0);
* any other op: each input moved by its error with random signs, four times, the
  largest change, plus a library function's ``u32 EXP_ULPS |z|`` (listed in
  :attr:`Evaluation.perturbed`).

``r(z) = u(d) |z| + floor(d)``: one rounding to ``d``, the nominal dtype (at least fp32
under ``least=float32``, a fused kernel's promise); where ``|z|`` passes ``d``'s range, PyTorch
eager rounds it to inf and a fused kernel holds it in fp32: both are the op as written, so
the bound is infinite there and what depends on it unconstrained (not judged); past fp32's
range no fp32 implementation can hold it and the case is discarded (``Evaluation.overflow``). ``floor`` is
:func:`~tritoncheck.tolerance.underflow_floor`. Autograd runs through the same tensors,
so ``torch.autograd.grad`` of the tracked reference bounds the gradients.

A bound that stops meaning anything (a division by a value within its own error of 0, an
overflow) is infinite: those elements are *unconstrained*. Not modelled: a branch the
reference takes on a value within its error of the threshold (``where(x > 0, ...)`` at
``x ~ 0``), where an implementation may take the other branch; second-order terms beyond
``mul``'s, which ``SAFETY`` covers while the first-order bound is small.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import return_and_correct_aliasing

from tritoncheck.tolerance import EXP_ULPS, U32, U64, sum_error, ulp, underflow_floor, unit_roundoff

aten = torch.ops.aten
INTERMEDIATES = ("input", "float32")
F32_MAX = float(torch.finfo(torch.float32).max)
F32_TINY = float(torch.finfo(torch.float32).tiny)
F64_FLOOR = float(torch.finfo(torch.float64).tiny) * float(torch.finfo(torch.float64).eps)


@dataclass(frozen=True)
class Units:
    """The rounding units of one evaluation (module docstring). ``least``: intermediates in
    at least this dtype (None: the nominal dtypes as eager has them); ``exact``: every unit
    u(fp64), the fp64 reference's own error (``tolerance.reference_precision``)."""

    accumulate: float  # u_acc: the accumulator of sums and matrix products
    dot: float  # u_dot: per product of a matrix product
    function: float = U32  # the unit a library function (exp, erf, ...) is evaluated in
    least: torch.dtype | None = None
    exact: bool = False
    inside: bool = False  # within a composite op: at least fp32 (PyTorch's opmath)

    def dtype(self, nominal: torch.dtype | None) -> torch.dtype:
        """The dtype a result of nominal dtype ``nominal`` is rounded to."""
        if self.exact or nominal is None:
            return torch.float64
        d = nominal
        if self.least is not None:
            d = torch.promote_types(d, self.least)
        if self.inside and d.itemsize < 4:
            d = torch.promote_types(d, torch.float32)
        return d

    def round_off(self, z: torch.Tensor, nominal: torch.dtype | None) -> torch.Tensor:
        """r(z): one rounding of each element of ``z`` (module docstring)."""
        a = z.abs()
        d = self.dtype(nominal)
        if d == torch.float64:
            return U64 * a + (F64_FLOOR if self.exact else 0.0)
        held = unit_roundoff(d) * a + underflow_floor(d) if d.itemsize >= 2 else unit_roundoff(d) * a
        if d != torch.float32:  # past a narrow dtype's range: inf in eager, finite in a fused kernel
            held = torch.where(a <= float(torch.finfo(d).max), held, math.inf)
        return torch.where(a <= F32_MAX, held, math.inf)


@dataclass
class Evaluation:
    """What one tracked evaluation met: ops modelled by perturbation, and whether any value
    passed fp32's range (no fp32 implementation computes such a case)."""

    perturbed: set[str] = field(default_factory=set)
    overflow: bool = False


class _Active:
    """The evaluation in progress and its units, for every thread of the process: on CUDA,
    autograd runs a backward on its own device thread, which a context variable set by the
    caller does not reach (a tracked gradient on the GPU raised 'used outside tracking()').
    One evaluation at a time per process; the caller waits for its backward."""

    def __init__(self) -> None:
        self.stack: list[tuple[Units, Evaluation]] = []

    def get_units(self) -> Units | None:
        return self.stack[-1][0] if self.stack else None

    def get_evaluation(self) -> Evaluation | None:
        return self.stack[-1][1] if self.stack else None


_active = _Active()


def _sanitise(e: torch.Tensor) -> torch.Tensor:
    """A NaN bound (inf * 0) is no bound: infinite."""
    return torch.where(torch.isnan(e), math.inf, e)


class Tracked(torch.Tensor):
    """A float64 value, its error bound ``err`` and its ``nominal`` dtype, dispatched together."""

    @staticmethod
    def __new__(cls, value: torch.Tensor, err: torch.Tensor, nominal: torch.dtype | None = None,
                requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(
            cls, value.shape, strides=value.stride(), storage_offset=value.storage_offset(), dtype=value.dtype,
            device=value.device, layout=value.layout, requires_grad=requires_grad)

    def __init__(self, value: torch.Tensor, err: torch.Tensor, nominal: torch.dtype | None = None,
                 requires_grad: bool = False):
        self.value = value
        self.err = err
        self.nominal = nominal

    def __repr__(self) -> str:
        return f"Tracked(value={self.value}, err={self.err}, nominal={self.nominal})"

    def __tensor_flatten__(self):
        return ["value", "err"], self.nominal

    @staticmethod
    def __tensor_unflatten__(inner, nominal, outer_size, outer_stride):
        return Tracked(inner["value"], inner["err"], nominal)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        units = _active.get_units()
        if units is None:
            raise RuntimeError("a Tracked tensor was used outside tritoncheck.define.rounding.tracking()")
        out = _dispatch(func, args, kwargs, units)
        return return_and_correct_aliasing(func, args, kwargs, out)


def track(value: torch.Tensor, nominal: torch.dtype | None, err: torch.Tensor | None = None,
          requires_grad: bool = False) -> Tracked:
    """``value`` (held in float64) read as a ``nominal`` tensor, with error bound ``err``
    (default 0: an input, read as it is)."""
    value = value.detach().to(torch.float64)
    return Tracked(value, torch.zeros_like(value) if err is None else err.detach(), nominal, requires_grad)


def values_of(tree):
    return pytree.tree_map_only(Tracked, lambda t: t.value, tree)


@contextlib.contextmanager
def tracking(units: Units) -> Iterator[Evaluation]:
    """Inside, ops on :class:`Tracked` tensors carry their bounds with these units."""
    evaluation = Evaluation()
    _active.stack.append((units, evaluation))
    try:
        yield evaluation
    finally:
        _active.stack.pop()


# --------------------------------------------------------------------------- dispatch

def _packet(func) -> Any:
    return getattr(func, "overloadpacket", func)


def _err(a) -> torch.Tensor | float:
    return a.err if isinstance(a, Tracked) else 0.0


def _err_tensor(a, like: torch.Tensor) -> torch.Tensor:
    e = _err(a)
    return e if isinstance(e, torch.Tensor) else torch.zeros_like(like, dtype=torch.float64)


def _nominal(args) -> torch.dtype | None:
    """The promotion of the tracked operands' nominal dtypes (None: only exact constants)."""
    out = None
    for a in pytree.tree_leaves(args):
        if isinstance(a, Tracked) and a.nominal is not None:
            out = a.nominal if out is None else torch.promote_types(out, a.nominal)
    return out


def _wrap(value, err, nominal: torch.dtype | None) -> Any:
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    if not isinstance(err, torch.Tensor):
        err = torch.full_like(value, float(err))
    err = err.to(torch.float64)
    if err.shape != value.shape:
        err = err.expand(value.shape).contiguous()
    err = _sanitise(err)
    ev = _active.get_evaluation()
    if ev is not None and not ev.overflow and value.numel():
        finite = torch.isfinite(value)
        if bool((finite & (value.abs() > F32_MAX)).any()):
            ev.overflow = True
    return Tracked(value, err, nominal)


def _dispatch(func, args, kwargs, units: Units):
    packet = _packet(func)
    rule = _RULES.get(packet)
    if rule is not None:
        return rule(func, args, kwargs, units)
    if func.is_view or packet in _MOVES:
        return _moved(func, args, kwargs)
    if packet in _LOCAL_DECOMPOSITIONS:
        return _composite(lambda *a, **k: _LOCAL_DECOMPOSITIONS[packet](func, a, k), args, kwargs, units)
    if packet not in _FUNCTIONS and func in decomposition_table and func.namespace == "aten":
        return _composite(decomposition_table[func], args, kwargs, units)
    if torch.Tag.pointwise in func.tags:
        return _pointwise(func, args, kwargs, units, transcendental=True)
    return _perturbed(func, args, kwargs, units)


def _composite(decomposition: Callable, args, kwargs, units: Units):
    """A composite op as PyTorch eager runs it: one kernel whose inside is at least fp32
    (its decomposition evaluated so), its result rounded once to its nominal dtype."""
    nominal = _nominal((args, kwargs))
    _active.stack.append((dataclasses.replace(units, inside=True), _active.get_evaluation()))
    try:
        out = decomposition(*args, **kwargs)
    finally:
        _active.stack.pop()

    def rounded(t):
        if not isinstance(t, Tracked):
            return t
        return _wrap(t.value, t.err + (units.round_off(t.value, nominal) if not units.inside else 0.0), nominal)
    return pytree.tree_map(rounded, out)


def _plain(func, args, kwargs):
    """The op on the values alone."""
    return func(*values_of(args), **values_of(kwargs))


def _moved(func, args, kwargs):
    """Moves of values: the same move of the errors. A fill value (an argument of type
    number: ``masked_fill``'s, padding's, ``scatter``'s) and an untracked tensor are exact:
    they move 0."""
    value = _plain(func, args, kwargs)
    kinds = {a.name: a.type.kind() for a in func._schema.arguments}
    names = [a.name for a in func._schema.arguments]

    def exact(a, name=None):
        if isinstance(a, Tracked):
            return a.err
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            return torch.zeros_like(a, dtype=torch.float64)
        if name is not None and kinds.get(name) == "NumberType" and isinstance(a, (int, float)) \
                and not isinstance(a, bool):
            return 0.0
        return a

    err_args = [pytree.tree_map(exact, a) if isinstance(a, (list, tuple)) else
                exact(a, names[i] if i < len(names) else None) for i, a in enumerate(args)]
    err = func(*err_args, **{k: exact(v, k) for k, v in kwargs.items()})
    nominal = _nominal((args, kwargs))
    if isinstance(value, (tuple, list)):
        return type(value)(_wrap(v, e, nominal) for v, e in zip(value, err))
    return _wrap(value, err, nominal)


def _float_tensors(args) -> list[tuple[int, Any]]:
    return [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]


def _known_partials(func, args, kwargs, shape) -> list[torch.Tensor | float | None] | None:
    """The partials of add, sub, mul and div in closed form (the common case: no autograd)."""
    packet = _packet(func)
    if packet not in (aten.add, aten.sub, aten.mul, aten.div) or len(args) != 2 or \
            (packet is aten.div and kwargs.get("rounding_mode") is not None):
        return None
    x, y = (values_of(a) for a in args)
    if not all(isinstance(v, torch.Tensor) or isinstance(v, (int, float)) for v in (x, y)):
        return None
    alpha = kwargs.get("alpha", 1)
    if packet is aten.add:
        parts = [1.0, float(alpha)]
    elif packet is aten.sub:
        parts = [1.0, -float(alpha)]
    elif packet is aten.mul:
        parts = [y, x]
    else:
        parts = [1.0 / y, -x / (y * y) if isinstance(y, torch.Tensor) or y else math.inf]
    return [p for p, a in zip(parts, args) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]


def _partials(func, args, kwargs, shape) -> list[torch.Tensor | float | None]:
    """df/dx_i of a pointwise op at the values, per element of the output (inputs expanded
    to its shape first, so that a broadcast input's partial is not summed)."""
    known = _known_partials(func, args, kwargs, shape)
    if known is not None:
        return known
    values = list(values_of(args))
    leaves = {}
    for i, a in _float_tensors(values):
        leaf = a.detach().to(torch.float64).expand(shape).clone().requires_grad_(True)
        values[i] = leaf
        leaves[i] = leaf
    if not leaves:
        return []
    # inside __torch_dispatch__ the autograd keys are excluded: restore them (and keep the
    # Python key out: these are plain tensors) for the op's own derivative
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                         torch._C.DispatchKeySet(torch._C.DispatchKey.Python)), \
            torch.enable_grad():
        z = func(*values, **values_of(kwargs))
        if not (isinstance(z, torch.Tensor) and z.requires_grad):
            return [None for _ in leaves]
        return list(torch.autograd.grad(z, list(leaves.values()), torch.ones_like(z), allow_unused=True))


def _pointwise(func, args, kwargs, units: Units, transcendental: bool):
    value = _plain(func, args, kwargs)
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    nominal = _nominal((args, kwargs))
    e = torch.zeros_like(value)
    argument = torch.zeros_like(value)
    for (_, a), d in zip(_float_tensors(args), _partials(func, args, kwargs, value.shape)):
        if d is None:
            continue
        d = abs(d)
        e = e + d * _err(a)
        argument = argument + d * values_of(a).abs().expand(value.shape)
    e = e + units.round_off(value, nominal)
    if transcendental:
        unit = U64 if units.exact else units.function
        e = e + unit * (EXP_ULPS * value.abs() + argument)
    packet = _packet(func)
    if packet is aten.mul and len(args) > 1:
        e = e + _err(args[0]) * _err(args[1])
    pole = _POLES.get(packet)
    if pole is not None and len(args) > pole and isinstance(args[pole], Tracked):
        # a value within its own error of the op's pole (a divisor, a log's argument near 0):
        # the first-order bound means nothing there, nothing pins the result down
        x = args[pole]
        e = torch.where((x.value.abs() <= x.err).expand(value.shape), math.inf, e)
    return _wrap(value, e, nominal)


def _arithmetic(func, args, kwargs, units: Units):
    return _pointwise(func, args, kwargs, units, transcendental=False)


def _exact(func, args, kwargs, units: Units):
    """An op whose result takes no rounding (neg, abs): the bound moves through its partials."""
    value = _plain(func, args, kwargs)
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    e = torch.zeros_like(value)
    for (_, a), d in zip(_float_tensors(args), _partials(func, args, kwargs, value.shape)):
        if d is not None:
            e = e + abs(d) * _err(a)
    return _wrap(value, e, _nominal((args, kwargs)))


def _lipschitz(func, args, kwargs, units: Units):
    """max, min, clamp, relu-like: exact results whose error is at most the largest input's."""
    value = _plain(func, args, kwargs)
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    e = torch.zeros_like(value)
    for _, a in _float_tensors(args):
        e = torch.maximum(e, torch.as_tensor(_err(a), dtype=torch.float64, device=value.device).expand(value.shape))
    return _wrap(value, e, _nominal((args, kwargs)))


def _steps(func, args, kwargs, units: Units):
    """round, floor, ceil, trunc, sign: exact where the value is farther than its error from
    a step of the function; the step's height (1; 2 for sign) where it is not."""
    value = _plain(func, args, kwargs)
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    x, e = values_of(args[0]), _err_tensor(args[0], values_of(args[0]))
    packet = _packet(func)
    if packet is aten.sign:
        near, height = x.abs() <= e, 2.0
    elif packet is aten.round:
        near, height = ((x - torch.floor(x)) - 0.5).abs() <= e, 1.0
    else:
        frac = x - torch.floor(x)
        near, height = torch.minimum(frac, 1 - frac) <= e, 1.0
    return _wrap(value, torch.where(near & (e > 0), height, 0.0), _nominal(args))


def _to_copy(func, args, kwargs, units: Units):
    """A cast. To float64 it moves the values. To another float dtype the reference rounds
    on purpose (``.float()``, ``.to(torch.float8_e4m3fn)``): a kernel rounding the same value
    rounds the same, and one rounding a value off by ``e`` may land one step of the target
    away (where ``e > 0``); the value is held rounded, its nominal dtype the target. To an
    integer: a step where the value is within its error of one."""
    value = _plain(func, args, kwargs)
    source = args[0]
    target = kwargs.get("dtype", value.dtype if isinstance(value, torch.Tensor) else None)
    if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
        return value
    e = _err_tensor(source, value)
    if target is None or target == torch.float64:
        return _wrap(value, e, _nominal(args))
    rounded = value.to(torch.float64)
    step = ulp(rounded, target) if target.itemsize >= 2 else rounded.abs() * 2 * unit_roundoff(target)
    return _wrap(rounded, e + torch.where(e > 0, step, 0.0), target)


def _reduction_dims(func, args, kwargs) -> tuple[list[int] | None, bool]:
    """(the reduced dims, None for all; keepdim) of a sum/mean/amax-like call."""
    if len(args) < 2 and "dim" not in kwargs:
        return None, False
    dims = args[1] if len(args) > 1 else kwargs["dim"]
    dims = [dims] if isinstance(dims, int) else (list(dims) if dims is not None else None)
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    return (dims or None), bool(keepdim)


def _summed(t: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    return aten.sum.dim_IntList(t, dims, keepdim) if dims is not None else aten.sum.default(t)


def _accumulated(units: Units) -> float:
    return U64 if units.exact else units.accumulate


def _sum(func, args, kwargs, units: Units):
    """sum, mean over n terms: sum e_i + sum_error(n, u_acc) sum |x_i|, (over n), + r(z)."""
    value = _plain(func, args, kwargs)
    x = values_of(args[0])
    dims, keepdim = _reduction_dims(func, args, kwargs)
    n = max(1, x.numel() // max(1, value.numel()))
    magnitude = _summed(x.abs(), dims, keepdim)
    _flag_overflow(magnitude, units)
    e = _summed(_err_tensor(args[0], x), dims, keepdim) + sum_error(n, _accumulated(units)) * magnitude
    if _packet(func) is aten.mean:
        e = e / n
    nominal = _nominal(args)
    return _wrap(value, e.reshape(value.shape) + units.round_off(value, nominal), nominal)


def _cumsum(func, args, kwargs, units: Units):
    value = _plain(func, args, kwargs)
    x, dim = values_of(args[0]), args[1]
    counts = torch.arange(1, x.shape[dim] + 1, device=x.device, dtype=torch.float64)
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    e = aten.cumsum.default(_err_tensor(args[0], x), dim) + \
        sum_error(counts.reshape(shape), _accumulated(units)) * aten.cumsum.default(x.abs(), dim)
    nominal = _nominal(args)
    return _wrap(value, e + units.round_off(value, nominal), nominal)


def _extremum(func, args, kwargs, units: Units):
    """amax/amin, max/min over a dim (with indices) or over all: the chosen value's error is
    at most the largest error among the candidates; max/min of two tensors as ``maximum``."""
    if len(args) > 1 and isinstance(args[1], torch.Tensor):
        return _lipschitz(func, args, kwargs, units)
    value = _plain(func, args, kwargs)
    dims, keepdim = _reduction_dims(func, args, kwargs)
    e = _err_tensor(args[0], values_of(args[0]))
    err = aten.amax.default(e, dims, keepdim) if dims is not None else e.amax()
    nominal = _nominal(args)
    if isinstance(value, (tuple, list)):  # (values, indices)
        return type(value)([_wrap(value[0], err, nominal), *value[1:]])
    return _wrap(value, err.reshape(value.shape), nominal)


def _product(a_abs, b_abs, ea, eb, k: int, units: Units, mm) -> torch.Tensor:
    """The bound of a matrix product over ``k`` terms: each product flushed to zero below
    fp32's smallest normal (FTZ) adds up to that much, ``k`` of them per output; a sum of
    magnitudes past fp32's range may overflow an fp32 accumulator in some order (the case
    is then outside what an fp32 implementation computes: :class:`Evaluation`)."""
    dot = U64 if units.exact else units.dot
    magnitude = mm(a_abs, b_abs)
    _flag_overflow(magnitude, units)
    flushed = 0.0 if units.exact else k * F32_TINY
    return mm(a_abs, eb) + mm(ea, b_abs) + (dot + sum_error(k, _accumulated(units))) * magnitude + flushed


def _flag_overflow(magnitude: torch.Tensor, units: Units) -> None:
    """Mark the evaluation when a sum's magnitudes pass fp32's largest value: its partial
    sums may overflow an fp32 accumulator though the result is finite (cancelling terms)."""
    ev = _active.get_evaluation()
    if ev is not None and not units.exact and not ev.overflow and magnitude.numel():
        ev.overflow = bool(((magnitude > F32_MAX) & torch.isfinite(magnitude)).any())


def _matmul(func, args, kwargs, units: Units):
    """mm, bmm, mv, dot: |A| e_B + e_A |B| + (u_dot + sum_error(K)) |A||B| + r(z)."""
    value = _plain(func, args, kwargs)
    a, b = args[0], args[1]
    va, vb = values_of(a), values_of(b)
    e = _product(va.abs(), vb.abs(), _err_tensor(a, va), _err_tensor(b, vb), va.shape[-1], units, func)
    nominal = _nominal(args)
    return _wrap(value, e + units.round_off(value, nominal), nominal)


def _addmm(func, args, kwargs, units: Units):
    """beta bias + alpha (A @ B), baddbmm too: the product's bound, the bias's error, one
    rounding of the sum."""
    value = _plain(func, args, kwargs)
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    va, vb = values_of(a), values_of(b)
    mm = aten.bmm.default if _packet(func) is aten.baddbmm else aten.mm.default
    e = abs(alpha) * _product(va.abs(), vb.abs(), _err_tensor(a, va), _err_tensor(b, vb), va.shape[-1], units, mm)
    e = e + abs(beta) * torch.as_tensor(_err(bias), dtype=torch.float64, device=value.device)
    nominal = _nominal(args)
    return _wrap(value, e + units.round_off(value, nominal), nominal)


def _perturbed(func, args, kwargs, units: Units):
    """An op without a rule or a decomposition: each input moved by its error with random
    signs (four draws per input, fixed seed), the largest change of the result, plus a
    library function's evaluation error."""
    value = _plain(func, args, kwargs)
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point):
        return value
    ev = _active.get_evaluation()
    if ev is not None:
        ev.perturbed.add(str(_packet(func)))
    values = list(values_of(args))
    gen = torch.Generator(device="cpu").manual_seed(20261128)
    e = torch.zeros_like(value)
    for i, a in enumerate(args):
        if not isinstance(a, Tracked) or not bool((a.err > 0).any()):
            continue
        worst = torch.zeros_like(value)
        for _ in range(4):
            signs = (torch.randint(0, 2, a.value.shape, generator=gen) * 2 - 1).to(a.value)
            moved = list(values)
            moved[i] = a.value + signs * a.err
            worst = torch.maximum(worst, _sanitise((func(*moved, **values_of(kwargs)) - value).abs()))
        e = e + worst
    nominal = _nominal((args, kwargs))
    unit = U64 if units.exact else units.function
    return _wrap(value, e + unit * EXP_ULPS * value.abs() + units.round_off(value, nominal), nominal)


def _constant(func, args, kwargs, units: Units):
    """A tensor made from nothing tracked (zeros, full, arange, ..._like): exact."""
    return _wrap(_plain(func, args, kwargs), 0.0, None)


def _copy(func, args, kwargs, units: Units):
    value = _plain(func, args, kwargs)
    err = torch.as_tensor(_err(args[1]), dtype=torch.float64, device=value.device).expand(value.shape).clone()
    return _wrap(value, err, _nominal(args[1:]) or _nominal(args[:1]))


def _bound_arguments(func, args, kwargs) -> dict[str, Any]:
    """An ATen call's arguments by their schema names (defaults filled in)."""
    named = {}
    for i, argument in enumerate(func._schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            named[argument.name] = args[i]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
    return named


def _var_mean(func, args, kwargs):
    """(variance, mean) as two passes compute them: the mean, the squared deviations summed."""
    a = _bound_arguments(func, args, kwargs)
    x, dim, keepdim = a["self"], a.get("dim"), bool(a.get("keepdim", False))
    correction = a.get("correction")
    if correction is None:
        correction = 1 if a.get("unbiased", True) else 0
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim else None)
    mean = torch.mean(x, dim=dims, keepdim=True) if dims else torch.mean(x).reshape([1] * x.dim())
    n = x.numel() // max(1, mean.numel())
    squares = (x - mean) ** 2
    total = torch.sum(squares, dim=dims, keepdim=keepdim) if dims else torch.sum(squares)
    if keepdim and not dims:
        total = total.reshape([1] * x.dim())
    var = total / max(1, n - correction)
    return var, (mean if keepdim else mean.reshape(var.shape))


def _vector_norm(func, args, kwargs):
    a = _bound_arguments(func, args, kwargs)
    x, order, dim, keepdim = a["self"], a.get("ord", 2), a.get("dim"), bool(a.get("keepdim", False))
    dims = list(dim) if dim else None
    if order == math.inf:
        return torch.amax(x.abs(), dim=dims or [], keepdim=keepdim)
    total = torch.sum(x.abs() ** order, dim=dims, keepdim=keepdim) if dims else torch.sum(x.abs() ** order)
    return total ** (1.0 / order)


# composite ops whose PyTorch decompositions leave ATen for prims: written here in ATen ops
_LOCAL_DECOMPOSITIONS = {
    aten.var_mean: _var_mean,
    aten.var: lambda f, a, k: _var_mean(f, a, k)[0],
    aten.std: lambda f, a, k: _var_mean(f, a, k)[0].sqrt(),
    aten.std_mean: lambda f, a, k: (lambda vm: (vm[0].sqrt(), vm[1]))(_var_mean(f, a, k)),
    aten.linalg_vector_norm: _vector_norm,
}
# library functions: evaluated in fp32 to a few ulps of their (rounded) argument, whatever
# PyTorch's decomposition of them would say
_FUNCTIONS = {
    aten.exp, aten.exp2, aten.expm1, aten.log, aten.log2, aten.log10, aten.log1p, aten.erf, aten.erfc, aten.erfinv,
    aten.tanh, aten.sin, aten.cos, aten.tan, aten.asin, aten.acos, aten.atan, aten.sinh, aten.cosh, aten.asinh,
    aten.acosh, aten.atanh, aten.sigmoid, aten.rsqrt, aten.pow, aten.atan2, aten.lgamma, aten.digamma,
}
# the argument whose zero is a pole of the op
_POLES = {aten.div: 1, aten.true_divide: 1, aten.reciprocal: 0, aten.rsqrt: 0, aten.log: 0, aten.log2: 0,
          aten.log10: 0}
_MOVES = {
    aten.clone, aten.contiguous, aten.cat, aten.stack, aten.index, aten.index_select, aten.gather, aten.flip,
    aten.roll, aten.repeat, aten.constant_pad_nd, aten.masked_fill, aten.tril, aten.triu, aten.where,
    aten.scatter, aten.index_put, aten.lift_fresh, aten.lift_fresh_copy, aten.alias, aten.split_with_sizes,
    aten.unbind, aten.split, aten.fill, aten.index_fill, aten.detach, aten.slice_scatter,
    aten.select_scatter, aten.diagonal_scatter, aten.as_strided_scatter, aten.unfold, aten.embedding,
    aten.permute, aten.expand, aten.view, aten._unsafe_view, aten.reshape, aten.t, aten.transpose,
    aten.squeeze, aten.unsqueeze, aten.select, aten.slice, aten.narrow, aten.diagonal, aten.as_strided,
    aten.expand_copy, aten.view_copy, aten.permute_copy,
}
_RULES: dict[Any, Callable] = {}
for _p in (aten.add, aten.sub, aten.rsub, aten.mul, aten.div, aten.true_divide, aten.reciprocal, aten.addcmul,
           aten.addcdiv, aten.lerp, aten.square, aten.sqrt):
    _RULES[_p] = _arithmetic
for _p in (aten.neg, aten.abs, aten.positive):
    _RULES[_p] = _exact
for _p in (aten.maximum, aten.minimum, aten.fmax, aten.fmin, aten.clamp, aten.clamp_min, aten.clamp_max,
           aten.relu, aten.hardtanh):
    _RULES[_p] = _lipschitz
for _p in (aten.round, aten.floor, aten.ceil, aten.trunc, aten.sign):
    _RULES[_p] = _steps
for _p in (aten.sum, aten.mean):
    _RULES[_p] = _sum
for _p in (aten.amax, aten.amin, aten.max, aten.min):
    _RULES[_p] = _extremum
for _p in (aten.mm, aten.bmm, aten.mv, aten.dot):
    _RULES[_p] = _matmul
for _p in (aten.addmm, aten.baddbmm):
    _RULES[_p] = _addmm
for _p in (aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.zeros, aten.ones, aten.full,
           aten.arange, aten.scalar_tensor, aten.empty, aten.new_zeros, aten.new_ones, aten.new_full,
           aten.new_empty, aten.empty_strided, aten.new_empty_strided):
    _RULES[_p] = _constant
_RULES[aten.cumsum] = _cumsum
_RULES[aten._to_copy] = _to_copy
_RULES[aten.copy_] = _copy
_RULES[aten.copy] = _copy


# --------------------------------------------------------------------------- evaluation

def read_floor(value: torch.Tensor, units: Units) -> torch.Tensor:
    """The error of reading ``value``: 0, except below fp32's smallest normal, where a GPU
    kernel may flush the input to zero on load or at its first operation (FTZ; fp32 and
    bfloat16 subnormals lie there): up to |x|. An fp16 input never lies there."""
    v = value.detach().to(torch.float64)
    if units.exact:
        return torch.zeros_like(v)
    a = v.abs()
    return torch.where(a < F32_TINY, a, 0.0)


def _tracked(arguments: Sequence[Any], nominals: Sequence[torch.dtype | None], units: Units,
             differentiable=()) -> list:
    out = []
    for i, (a, nominal) in enumerate(zip(arguments, nominals)):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            out.append(track(a, nominal, read_floor(a, units), requires_grad=i in differentiable))
        else:
            out.append(a)
    return out


def evaluate(reference: Callable, arguments: Sequence[Any], nominals: Sequence[torch.dtype | None], units: Units
             ) -> tuple[Any, Evaluation]:
    """``reference(*arguments)`` with every float tensor argument tracked from its
    :func:`read_floor`, read as its nominal dtype: its outputs as :class:`Tracked` tensors, and what the evaluation met."""
    tracked = _tracked(arguments, nominals, units)
    with tracking(units) as evaluation, torch.no_grad():
        out = reference(*tracked)
    return out, evaluation


def evaluate_gradients(reference: Callable, arguments: Sequence[Any], nominals: Sequence[torch.dtype | None],
                       differentiable: Sequence[int], outputs: Sequence[int], upstream: Sequence[torch.Tensor],
                       upstream_nominals: Sequence[torch.dtype | None], units: Units
                       ) -> tuple[list[Tracked | None], Evaluation]:
    """The gradients of the reference's outputs ``outputs`` (positions in its result) with
    respect to its arguments ``differentiable`` (positions), given exact upstream gradients,
    each with its error bound."""
    tracked = _tracked(arguments, nominals, units, differentiable)
    with tracking(units) as evaluation, torch.enable_grad():
        out = reference(*tracked)
        out = out if isinstance(out, (tuple, list)) else (out,)
        grads = torch.autograd.grad([out[i] for i in outputs], [tracked[i] for i in differentiable],
                                    [track(g, n) for g, n in zip(upstream, upstream_nominals)], allow_unused=True)
    return list(grads), evaluation
