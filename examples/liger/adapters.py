"""Liger-Kernel's Triton kernels behind the tritoncheck contract (docs/third-party/liger.md).

    PYTHONPATH=examples/liger python -m pytest tests/test_checks.py --impl softmax=adapters:softmax ...

Each adapter calls Liger's autograd Function the way a model does and changes nothing
numerical: what PyTorch adds is layout (rope's interleaved pairs <-> Liger's halves,
exact copies) and the contract's float32 loss (a cast of Liger's loss, which Liger returns
in the logits' dtype). Liger's softmax takes no temperature, and neither does the adapter:
the suite holds it at 1 and reports ``temperature_equivalent`` not applicable (it reads
the signature). What Liger does not accept is refused up front with a
``ValueError`` naming the argument, never papered over: Liger's own refusal there is a
``RuntimeError`` from ``calculate_settings`` (rows past 65536 elements), which the suite
must not mistake for a crash.

Liger-Kernel 0.8.5 (``pip install --no-deps liger-kernel==0.8.5``; it needs torch and
triton, which the suite has). Its kernels also run under the Triton interpreter
(``TRITON_INTERPRET=1``, what the suite's conftest sets on a machine without a GPU).
"""
from __future__ import annotations

import torch
from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
from liger_kernel.ops.layer_norm import LigerLayerNormFunction
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
from liger_kernel.ops.rope import LigerRopeFunction
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from liger_kernel.ops.swiglu import LigerSiLUMulFunction

from tritoncheck.declarations import ExpectedFailure

MAX_FUSED_SIZE = 65536  # liger_kernel.ops.utils.calculate_settings: one block per row, at most this long
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _refuse_long_rows(op: str, argument: str, n: int) -> None:
    if n > MAX_FUSED_SIZE:
        raise ValueError(f"Liger's {op} keeps a whole row in one block: the last dim of {argument!r} must be at most "
                         f"{MAX_FUSED_SIZE}, got {n}")


def softmax(x):
    _refuse_long_rows("softmax", "x", x.shape[-1])
    return LigerSoftmaxFunction.apply(x)


def cross_entropy(logits, target, ignore_index=-100):
    loss = LigerCrossEntropyFunction.apply(logits, target, None, ignore_index, 0.0, 0.0, "none", None,
                                           False, False, False)[0]
    return loss.float()  # the contract's float32 loss; Liger's is in the logits' dtype


def rope(x, cos, sin):
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be [B, H, S, D] with D even, got shape {tuple(x.shape)}")
    b, h, s, d = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (s, d // 2):
            raise ValueError(f"{name} must have shape ({s}, {d // 2}), got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            # Liger's kernel casts x to the tables' dtype (q.to(sin_row.dtype)): float32 x with
            # float16 tables is rotated in float16 (docs/third-party/liger.md, finding 4)
            raise TypeError(f"Liger's rope computes in the dtype of {name}: {name} must have x's dtype {x.dtype}, "
                            f"got {t.dtype}")
    # Liger rotates the halves (x[:D/2], x[D/2:]) (HF Llama); the contract rotates the pairs (x_2i, x_2i+1).
    halves = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    unused_k = torch.zeros((b, 1, s, d), dtype=x.dtype, device=x.device)
    # rotary_dim = D with tables of width D / 2: Liger's form for tables that are not duplicated
    y, _ = LigerRopeFunction.apply(halves, unused_k, cos, sin, None, 1, d)
    return torch.stack((y[..., : d // 2], y[..., d // 2:]), dim=-1).flatten(-2)


def swiglu(gate, up):
    _refuse_long_rows("swiglu", "gate", gate.shape[-1])
    return LigerSiLUMulFunction.apply(gate, up)


def layer_norm(x, weight, bias, eps=1e-5):
    _refuse_long_rows("layer_norm", "x", x.shape[-1])
    return LigerLayerNormFunction.apply(x, weight, bias, eps)


def rms_norm(x, weight, eps=1e-6):
    """Liger's Llama casting mode (its default): x * rstd in float32, rounded to x's dtype,
    then times the weight in that dtype. in_place=False: Liger's default writes dx into the
    upstream gradient's memory, which the contract does not allow."""
    _refuse_long_rows("rms_norm", "x", x.shape[-1])
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)


def rms_norm_gemma(x, weight, eps=1e-6):
    """Liger's Gemma casting mode with offset 0: everything in float32, one rounding at the end."""
    _refuse_long_rows("rms_norm", "x", x.shape[-1])
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", False)


def add_rms_norm(x, residual, weight, eps=1e-6):
    """Liger's fused residual add + RMSNorm (Llama casting): (y, x + residual)."""
    _refuse_long_rows("add_rms_norm", "x", x.shape[-1])
    return LigerFusedAddRMSNormFunction.apply(x, residual, weight, eps, 0.0, "llama", False)


def linear_cross_entropy(x, weight, target, ignore_index=-100, softcap=0.0, reduction="mean"):
    """Liger's fused linear cross-entropy as a model calls it (no bias, class weights, z-loss
    or label smoothing; accum_dtype left at Liger's default, the input dtype). Its loss comes
    back in float32 for float32 inputs and in the input dtype otherwise: cast to the
    contract's float32 (one rounding of the loss, as for cross_entropy above)."""
    loss = LigerFusedLinearCrossEntropyFunction.apply(x, weight, target, None, None, ignore_index, 0.0, 0.0,
                                                      reduction, softcap if softcap else None)[0]
    return loss.float()


rms_norm.rms_norm_cast = add_rms_norm.rms_norm_cast = "before_weight"
rms_norm_gemma.rms_norm_cast = "after_weight"

for _fn in (softmax, cross_entropy, rope, swiglu, layer_norm, rms_norm, rms_norm_gemma, add_rms_norm,
            linear_cross_entropy):
    _fn.dtypes = _DTYPES
    _fn.supports_backward = True
# What the adapters refuse, declared, so the suite draws inside it (tritoncheck/limits.py):
# every example then counts instead of being refused and redrawn.
for _fn in (softmax, swiglu, layer_norm, rms_norm, rms_norm_gemma, add_rms_norm):
    _fn.limits = {"max_size": {"N": MAX_FUSED_SIZE}}
rope.limits = {"same_dtype": ("cos", "sin")}
# A stated contract difference, not a bug (docs/third-party/liger.md, finding 3): the loss comes
# back in the logits' dtype, so loss(logits + c) and loss(logits) differ by its rounding.
# matches_reference is judged with --tolerance parity instead (examples/liger/run.sh).
cross_entropy.expected_failures = (ExpectedFailure(
    "shift_invariant", "Liger returns the loss in the logits' dtype: one float16/bfloat16 rounding of the loss "
    "(5.7e-5 at a loss of 0.483 in float16 on an H100), which the contract's float32 loss does not have",
    dtypes=("float16", "bfloat16"), strict=False),)
