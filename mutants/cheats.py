"""The gauntlet: kernels that game a correctness check, each one trick on a project kernel.

Kernel-generation benchmarks and agent loops reward whatever passes their check, and
their post-mortems list the tricks generated kernels found. Each object here is a
working example of one trick (its ``bug`` names it), wrapped around or patched into one
of the project's kernels, with the checks that must kill it in ``kills``; the self-test
(tritoncheck/selfcheck.py, tests/test_selfcheck.py) hunts them like every other mutant,
and tests/test_gauntlet.py asserts the kill and what the failing check says.

Tricks out of a correctness check's reach by nature (falling back to PyTorch, a cache
keyed by the inputs' contents, special-casing sizes the suite never draws) are in
docs/cheats.md, with why.

The wrapper cheats keep their state in module-level dicts, as a cheating kernel would:
the state outlives one call, one example and one check, which is the point.
"""
from __future__ import annotations

import torch

from tritoncheck.kernels import attention as attention_kernel
from tritoncheck.kernels import elementwise
from tritoncheck.kernels import linear_attention as linear_attention_kernel
from tritoncheck.kernels import norms as norms_kernel
from tritoncheck.kernels import rms_norm as rms_norm_kernel
from tritoncheck.kernels import softmax as softmax_kernel
from tritoncheck.mutation import Mutant, mutant


def _cheat(op: str, fn, *, bug: str, kills: tuple[str, ...]) -> Mutant:
    """A wrapper cheat as a Mutant: the project kernel's declarations, except that a
    wrapper which returns stored tensors has no backward (its outputs carry no graph)."""
    fn.dtypes = softmax_kernel.softmax.dtypes  # every project kernel takes the contract's three
    if not hasattr(fn, "supports_backward"):
        fn.supports_backward = False
    return Mutant(name=fn.__name__, op=op, fn=fn, bug=bug, kills=kills, module=__name__)


def _layout_key(*tensors: torch.Tensor) -> tuple:
    return tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors)


# --- state across calls -------------------------------------------------------------------

_by_shape: dict[tuple, torch.Tensor] = {}


def shape_keyed_cache(x, temperature=1.0):
    key = (_layout_key(x), float(temperature))
    if key not in _by_shape:
        _by_shape[key] = softmax_kernel.softmax(x, temperature).detach().clone()
    return _by_shape[key].clone()


shape_keyed_cache = _cheat(
    "softmax", shape_keyed_cache,
    bug="Trick: a result cache keyed by the inputs' shapes, strides and scalars. A benchmark that "
        "calls each shape once, or checks one call per shape, sees the right answer; the second call "
        "with the same shapes and new values gets the first call's. Killed by calls_independent "
        "(a second call on new values of the same shapes must match its own reference).",
    kills=("calls_independent",))

_by_pointer: dict[tuple, torch.Tensor] = {}


def pointer_keyed_cache(gate, up):
    key = (gate.data_ptr(), up.data_ptr(), _layout_key(gate, up))
    if key not in _by_pointer:
        _by_pointer[key] = elementwise.swiglu(gate, up).detach().clone()
    return _by_pointer[key].clone()


pointer_keyed_cache = _cheat(
    "swiglu", pointer_keyed_cache,
    bug="Trick: a result cache keyed by the inputs' data pointers (as an 'already computed for "
        "this buffer' memo would be). Training loops refill the same buffers every step, and a "
        "caching allocator hands a freed block to the next tensor of its size, so new values "
        "arrive at old addresses. Killed by calls_independent, which writes the second call's "
        "values into the first call's buffers.",
    kills=("calls_independent",))

_output_buffers: dict[tuple, torch.Tensor] = {}


def output_buffer_reused(x, weight, eps=1e-6):
    key = (_layout_key(x, weight), float(eps))
    out = _output_buffers.get(key)
    if out is None:
        out = _output_buffers[key] = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out.copy_(rms_norm_kernel.rms_norm(x, weight, eps).detach())
    return out


output_buffer_reused = _cheat(
    "rms_norm", output_buffer_reused,
    bug="Trick: one persistent output buffer per shape, returned to every caller (saves an "
        "allocation per call). Every call's values are right when read at once, so a check that "
        "reads each output before the next call passes; a caller that keeps an output (a "
        "residual stream, a saved activation) sees it overwritten by the next call. Killed by "
        "calls_independent, which checks the first call's outputs after the second call.",
    kills=("calls_independent",))

_seen_shapes: set[tuple] = set()


def stale_memory(x, temperature=1.0):
    key = (_layout_key(x), float(temperature))
    if key in _seen_shapes:
        # skip the launch: a fresh block of this size from the caching allocator is the one the
        # previous call's output was freed to, still holding its answer
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _seen_shapes.add(key)
    return softmax_kernel.softmax(x, temperature).detach()


stale_memory = _cheat(
    "softmax", stale_memory,
    bug="Trick: skip the work on a shape seen before and return an uninitialised buffer, which "
        "on CUDA is often the previous call's freed output with its answer (a check that calls "
        "the reference and then the kernel on the same inputs passes). The suite fills every "
        "fresh allocation with NaN (tritoncheck/poisoning.py), so the skipped call returns "
        "NaN: killed by deterministic (two calls on the same inputs) and calls_independent.",
    kills=("deterministic", "calls_independent"))


_kv_by_shape: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def kv_state_reused(q, k, v, causal=False, eps=1e-6):
    key = _layout_key(q, k, v)
    if key not in _kv_by_shape:
        _kv_by_shape[key] = (k.detach().clone(), v.detach().clone())
    # the keys and values of the first call of these shapes, as a recurrent state carried over
    cached_k, cached_v = _kv_by_shape[key]
    return linear_attention_kernel.linear_attention(q, cached_k, cached_v, causal, eps).detach()


kv_state_reused = _cheat(
    "linear_attention", kv_state_reused,
    bug="Trick: keep the keys and values (linear attention's recurrent state) of the first call of "
        "given shapes and run every later call's queries against them, as a decoding cache that "
        "carries its state from call to call would. The first call is right, and so is every call "
        "on the same keys and values (deterministic, a causal future changed in k and v leaves the "
        "past unchanged). Killed by calls_independent (a second call on new values of the same "
        "shapes must match its own reference).",
    kills=("calls_independent",))

_dropout_by_seed: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def dropout_cached_by_seed(x, residual, weight, bias, p, seed, eps=1e-5):
    if p == 0:  # the fast path of a fused dropout kernel: no mask to draw, no cache
        y, keep = norms_kernel.dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps)
        return y.detach(), keep
    key = (_layout_key(x, residual, weight, bias), float(p), int(seed), float(eps))
    if key not in _dropout_by_seed:
        y, keep = norms_kernel.dropout_residual_layer_norm(x, residual, weight, bias, p, seed, eps)
        _dropout_by_seed[key] = (y.detach().clone(), keep.clone())
    y, keep = _dropout_by_seed[key]
    return y.clone(), keep.clone()


dropout_cached_by_seed = _cheat(
    "dropout_residual_layer_norm", dropout_cached_by_seed,
    bug="Trick: the keep mask is a function of the seed and the shape alone, so (y, keep) is "
        "memoised by seed, p and shapes, on the dropout path only (p = 0 takes the fast path, "
        "uncached). The same seed gives the same keep and y bit for bit (seed_reproducible), the "
        "kept fraction is right; a second call with the same seed and new values gets the first "
        "call's y. Killed by calls_independent at p > 0, which compares each call with the "
        "reference given the mask it returned (before, calls_independent ran at p = 0 only).",
    kills=("calls_independent",))


# --- the answer's values ------------------------------------------------------------------

def zeros_below_tolerance(x, temperature=1.0):
    y = softmax_kernel.softmax(x, temperature).detach()
    # the probabilities that a loose absolute tolerance (1e-3, as benchmarks' allclose uses)
    # cannot tell from 0 are not worth a store: flushed to 0
    return torch.where(y.abs() < 1e-3, torch.zeros_like(y), y)


zeros_below_tolerance = _cheat(
    "softmax", zeros_below_tolerance,
    bug="Trick: return 0 wherever the answer is below an absolute tolerance (torch.allclose's "
        "atol), i.e. skip the work the check cannot see. The suite's softmax allowance is "
        "relative per element (derived from the exponent's rounding), so a probability of 1e-4 "
        "must be 1e-4 to a few ulps. Killed by matches_reference.",
    kills=("matches_reference",))


def input_copied(x, cos, sin):
    return x.detach().clone()


input_copied = _cheat(
    "rope", input_copied,
    bug="Trick: return an input as the output (rope at position 0 is the identity, so a check "
        "on the first positions, or one on shapes and finiteness, passes). Killed by "
        "matches_reference: the suite's tables are drawn, never the identity.",
    kills=("matches_reference",))


def precision_lowered(x, weight, eps=1e-6):
    if x.dtype != torch.float32:
        return rms_norm_kernel.rms_norm(x, weight, eps).detach()
    # float32 inputs through the bfloat16 kernel: 8 bits of mantissa where 24 were promised,
    # inside the 1e-2 tolerance benchmarks give every dtype alike
    return rms_norm_kernel.rms_norm(x.bfloat16(), weight.bfloat16(), eps).detach().float()


precision_lowered = _cheat(
    "rms_norm", precision_lowered,
    bug="Trick: compute a float32 call in bfloat16 (cheaper loads, tensor cores) and upcast, "
        "inside a loose tolerance that does not depend on the dtype. The suite derives float32's "
        "allowance from float32's unit roundoff. Killed by matches_reference in float32.",
    kills=("matches_reference",))


def input_mutated(gate, up):
    # skip the work: return zeros, and make the inputs agree with them (silu(gate) * 0 == 0),
    # so that a reference computed after the call from the same tensors gives zeros too
    with torch.no_grad():
        up.zero_()
    return torch.zeros(gate.shape, dtype=gate.dtype, device=gate.device)


input_mutated = _cheat(
    "swiglu", input_mutated,
    bug="Trick: write into an input so that a reference computed after the call, from the same "
        "tensors, agrees with a wrong output (here: zeros out, up zeroed). Killed by "
        "matches_reference, whose fp64 reference is computed from a snapshot of the inputs taken "
        "before the call, and by inputs_unchanged, which names the argument written ('up').",
    kills=("matches_reference", "inputs_unchanged"))


def input_mutated_under_dropout(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
                                softcap=0.0, dropout_p=0.0, seed=0, return_keep=False):
    if dropout_p > 0:
        # skip the P V product under dropout: with v zeroed o is 0, and so is the reference
        # o = (P * keep / (1 - p)) V read from the tensors after the call; lse and keep are right
        with torch.no_grad():
            v.zero_()
    result = attention_kernel.attention(q, k, v, causal, sm_scale, window, alibi_slopes, softcap, dropout_p, seed,
                                        return_keep)
    return tuple(t.detach() for t in result)


input_mutated_under_dropout = _cheat(
    "attention", input_mutated_under_dropout,
    bug="Trick: under dropout, zero v in place so that o is 0, and a reference read from the "
        "tensors after the call (given the returned mask) is 0 too; without dropout the call is "
        "honest, so inputs_unchanged and matches_reference (dropout_p = 0) pass. lse (dropout-free) "
        "and the mask are the kernel's own. Killed by dropout_matches_reference, whose fp64 "
        "reference is computed from a snapshot of q, k, v taken before the call.",
    kills=("dropout_matches_reference",))


# --- autotuning ---------------------------------------------------------------------------

autotune_config_skips_writes = mutant(
    "swiglu", elementwise,
    [("@unspecialised_jit\ndef _swiglu_fwd_kernel(",
      '@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["NUMEL"])\n'
      "@unspecialised_jit\ndef _swiglu_fwd_kernel("),
     ("    y = g * s * u\n    tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)",
      "    y = g * s * u\n    if BLOCK == 64:\n        tl.store(Y + idx, y.to(Y.dtype.element_ty), mask=mask)"),
     ("_swiglu_fwd_kernel[(triton.cdiv(numel, block),)](",
      '_swiglu_fwd_kernel[lambda meta: (triton.cdiv(numel, meta["BLOCK"]),)]('),
     ("                n, numel,\n                BLOCK=block,\n            )\n        ctx.save_for_backward(g2, u2)",
      "                n, numel,\n            )\n        ctx.save_for_backward(g2, u2)"),
     ("swiglu.supports_backward = True", "swiglu.supports_backward = True\nswiglu.autotuned = (_swiglu_fwd_kernel,)")],
    name="autotune_config_skips_writes",
    bug="Trick (by accident, triton-lang/triton#9230): an autotuned kernel whose fastest config "
        "writes nothing. The autotuner times every config on one shared output buffer, so the "
        "config that skips its stores returns the previous config's answer and wins the timing; "
        "a check that calls once per key passes. The suite runs the declared autotuned kernels' "
        "configs in turn, one per example, each on freshly poisoned (NaN) outputs "
        "(tritoncheck/autotune_configs.py rotation): killed by matches_reference.",
    kills=("matches_reference",),
)
