"""flash-linear-attention's Triton kernels behind the tritoncheck contract (docs/third-party/fla.md).

    PYTHONPATH=examples/fla python -m pytest tests/test_checks.py --impl linear_attention=adapters:linear_attention ...

fla-core 0.6.0 (``pip install --no-deps fla-core==0.6.0 einops``). What each adapter runs:

- ``elu_feature_map``: fla's ``ELUPlusOneFunction`` (the autotuned ``elu_p1_fwd_kernel`` and
  ``elu_p1_bwd_kernel``), what ``fla.modules.activations.elu_p1`` calls for a GPU tensor.
- ``linear_attention``: ``fused_chunk_linear_attn(normalize=False, scale=1.0)`` for the
  numerator ``sum_{j<=i} (q_i . k_j) v_j`` (``chunk_linear_attention``: ``chunk_linear_attn``,
  fla's other kernel path), then fla's own normalisation step with the contract's ``eps``
  (:func:`normalise`).
- fla has causal linear attention only (its kernels mask ``j <= i``; no bidirectional
  form): ``causal=False`` is refused with a ``ValueError`` and declared in ``limits``, so
  the suite draws causal cases only and skips ``last_causal_equals_bidirectional``.
- Layout: fla takes ``[B, T, H, D]``, the contract ``[B, H, N, D]``: declared (``layout =
  "bnhd"``), the suite passes and reads back that layout, strided views included (fla's
  ``input_guard`` copies them contiguous).
- ``gated_delta_rule``: ``chunk_gated_delta_rule(..., output_final_state=True)`` as it is: the
  contract is fla's convention and layout ([B, T, H, K], the state [N, H, K, V] float32, q and
  k used as given: ``use_qk_l2norm_in_kernel=False``, fla's default); ``chunk_size`` (16, 32,
  64) passed through, so chunk-size invariance is checked. ``fused_gated_delta_rule``:
  ``fused_recurrent_gated_delta_rule`` the same way, forward only (its backward raises
  ``NotImplementedError`` by design), no chunk size.

fla's kernels do not run under the Triton interpreter (3.9), which ``conftest.py`` selects
without a GPU: its autotuner times configs through a GPU driver (``RuntimeError: 0 active
drivers``), and pinned to one config the kernels still fail there (``i_t.to(tl.int64)`` on
the interpreter's Python int loop counter in the linear-attention kernels,
``libdevice.exp`` resolving to None in ``elu_p1``). On the interpreter the adapters refuse
every call with ``NotImplementedError`` saying so, so a CPU run reports skips with that
reason instead of failures that are not fla's.
"""
from __future__ import annotations

import torch
from fla.modules.activations.ops import ELUPlusOneFunction, elu_p1_bwd_kernel, elu_p1_fwd_kernel
from fla.ops.common.fused_chunk import fused_chunk_fwd_kernel
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from fla.ops.linear_attn import chunk_linear_attn, fused_chunk_linear_attn
from fla.ops.utils.cumsum import chunk_global_cumsum, chunk_global_cumsum_vector_kernel

from tritoncheck import backend
from tritoncheck.autotune_configs import autotuners_in

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _refuse_interpreter() -> None:
    if backend.current() == "interpret":
        raise NotImplementedError(
            "fla's kernels do not run under the Triton interpreter (its autotuner needs a GPU driver; "
            "i_t.to() on a loop counter and libdevice.exp fail there): run on a GPU")


def elu_feature_map(x):
    _refuse_interpreter()
    return ELUPlusOneFunction.apply(x)


def normalise(numerator, q, k_cum, eps):
    """fla's ``StatefulNormalizeFunction.forward`` (fla/ops/linear_attn/utils.py) with scale 1
    and the contract's eps where fla adds a fixed 1e-10.

    fla computes ``denom = (q * scale * k_cum).sum(-1, keepdim=True) + 1e-10`` and
    ``o / denom`` in the input dtype, with ``k_cum`` its key cumsum in k's dtype. With scale s
    that is ``q_i S_i / (q_i . z_i + 1e-10 / s)``: the contract's formula only for
    eps = 1e-10 / s, and the contract draws eps 1e-6 and 1e-3. So the numerator comes from
    fla unnormalised (``normalize=False``, scale 1) and this step is fla's, eps replaced."""
    denom = (q * 1.0 * k_cum).sum(-1, keepdim=True) + eps
    return numerator / denom


def _linear_attention(numerator_kernel, q, k, v, causal, eps):
    if not causal:
        raise ValueError("fla's linear attention is causal only (no bidirectional form): causal must be True, "
                         f"got {causal!r}")
    _refuse_interpreter()
    numerator, _ = numerator_kernel(q, k, v, scale=1.0, normalize=False)
    k_cum = chunk_global_cumsum(k, output_dtype=k.dtype)  # as fla's normalisation calls it
    return normalise(numerator, q, k_cum, eps)


def linear_attention(q, k, v, causal=False, eps=1e-6):
    return _linear_attention(fused_chunk_linear_attn, q, k, v, causal, eps)


def chunk_linear_attention(q, k, v, causal=False, eps=1e-6):
    return _linear_attention(chunk_linear_attn, q, k, v, causal, eps)


def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_size=None):
    _refuse_interpreter()
    extra = {} if chunk_size is None else {"chunk_size": chunk_size}
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=True, cu_seqlens=cu_seqlens, **extra)


def fused_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    _refuse_interpreter()
    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                                            output_final_state=True, cu_seqlens=cu_seqlens)


# The autotuned kernels each adapter launches: --autotune-config I runs config I of each instead
# of a sweep per new size, benchmarks/autotune_sweep.py every config in turn. The chunk path
# launches several of fla's common kernels: every autotuned kernel of the imported fla modules.
elu_feature_map.dtypes = _DTYPES
elu_feature_map.supports_backward = True
elu_feature_map.autotuned = (elu_p1_fwd_kernel, elu_p1_bwd_kernel)
linear_attention.autotuned = (fused_chunk_fwd_kernel, chunk_global_cumsum_vector_kernel)
chunk_linear_attention.autotuned = autotuners_in("fla")
for _fn in (gated_delta_rule, fused_gated_delta_rule):
    _fn.dtypes = _DTYPES
    _fn.autotuned = autotuners_in("fla")
gated_delta_rule.supports_backward = True
gated_delta_rule.chunk_sizes = (16, 32, 64)  # fla's chunk_gated_delta_rule accepts these (64 by default)
# fla's own guard (fla/ops/gated_delta_rule/chunk.py): on Hopper with Triton >= 3.4.0 and < 3.7.1 its
# backward raises before computing, a known Triton miscompilation of chunk_bwd_dqkwg (fla#640): a
# declared refusal, so the gradient checks report it as such instead of failing on every input
gated_delta_rule.refuses = ((RuntimeError, r"chunk_bwd_dqkwg"),)
fused_gated_delta_rule.supports_backward = False  # FusedRecurrentFunction.backward raises NotImplementedError
for _fn in (linear_attention, chunk_linear_attention):
    _fn.dtypes = _DTYPES
    _fn.supports_backward = False  # the contract asks no gradient of linear_attention
    _fn.limits = {"values": {"causal": (True,)}}
    _fn.layout = "bnhd"  # fla's [B, T, H, D]
