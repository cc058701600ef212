"""Kernels that refuse part of the contract's domain, as real libraries' kernels do.

Each wraps a correct implementation (the project's kernel) or a planted bug (a
mutant) behind the refusal a real wrapper makes: rows longer than a block limit,
non-contiguous input, float32, head dims outside {16, 32, 64, 128}, causal=False,
cos/sin in another dtype than x, dropout. A refusal counts as one only when declared
(tritoncheck/refusals.py): the ``*_refuses`` kernels declare their messages with
``fn.refuses``, the ``*_refusal`` ones raise ``tritoncheck.Refusal``, the ``*_declared``
twins declare the limits with ``fn.limits`` (nothing refused), and the bare ones declare
nothing, so what they raise is a failure. tests/test_refusals.py runs the suite on them
with ``--impl``.
"""
import torch

from tritoncheck import Refusal
from tritoncheck.controls.elementwise import torch_rope as _torch_rope
from tritoncheck.controls.linear_attention import torch_linear_attention as _torch_linear_attention
from tritoncheck.kernels.attention import attention as _attention
from tritoncheck.kernels.elementwise import rope as _rope
from tritoncheck.kernels.linear_attention import linear_attention as _linear_attention
from tritoncheck.kernels.softmax import softmax as _softmax
from tritoncheck.mutants.softmax import padded_lanes_zero as _padded_lanes_zero

ROW_LIMIT = 64
HEAD_DIMS = (16, 32, 64, 128)


def _short_rows(fn, x, temperature):
    if x.shape[-1] > ROW_LIMIT:
        raise ValueError(f"x: rows of {x.shape[-1]} elements; this kernel takes at most {ROW_LIMIT}")
    return fn(x, temperature)


def softmax_short_rows(x, temperature=1.0):
    return _short_rows(_softmax, x, temperature)


def softmax_short_rows_refuses(x, temperature=1.0):
    return _short_rows(_softmax, x, temperature)


softmax_short_rows_refuses.refuses = r"rows of \d+ elements; this kernel takes at most"


def softmax_short_rows_declared(x, temperature=1.0):
    return _short_rows(_softmax, x, temperature)


softmax_short_rows_declared.limits = {"max_size": {"N": ROW_LIMIT}}


def softmax_contiguous_only_refusal(x, temperature=1.0):
    if not x.is_contiguous() or x.storage_offset():
        raise Refusal(f"x must be contiguous with no storage offset, got strides {x.stride()}")
    return _softmax(x, temperature)


def softmax_contiguous_only_declared(x, temperature=1.0):
    return softmax_contiguous_only_refusal(x, temperature)


softmax_contiguous_only_declared.limits = {"contiguous": True}


def softmax_no_float32_refusal(x, temperature=1.0):
    if x.dtype == torch.float32:
        raise Refusal("x: float32 is not supported (float16 and bfloat16 only)")
    return _softmax(x, temperature)


_calls = []


def softmax_first_call_only_refusal(x, temperature=1.0):
    """Accepts the first input of the process and refuses every later one: Hypothesis
    draws past 550 refusals (its own limit: 458 plus 100 per accepted example) and ends
    with one counted example, a pass on one input unless the minimum stops it."""
    if _calls:
        raise Refusal("x: this kernel has already run once")
    _calls.append(x.shape)
    return _softmax(x, temperature)


def mutant_short_rows_refuses(x, temperature=1.0):
    """A planted bug (padded lanes loaded as 0, not -inf) behind the row limit: the
    refusals must not hide it inside the accepted domain."""
    return _short_rows(_padded_lanes_zero.fn, x, temperature)


mutant_short_rows_refuses.refuses = softmax_short_rows_refuses.refuses


def mutant_short_rows_declared(x, temperature=1.0):
    return _short_rows(_padded_lanes_zero.fn, x, temperature)


mutant_short_rows_declared.limits = {"max_size": {"N": ROW_LIMIT}}


def attention_narrow_refuses(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
                             softcap=0.0):
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"q: head dim {q.shape[-1]} is not one of {HEAD_DIMS}")
    if not causal:
        raise NotImplementedError("causal=False is not implemented")
    return _attention(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)


attention_narrow_refuses.refuses = (r"head dim \d+ is not one of", r"causal=False is not implemented")


def attention_narrow_declared(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None, softcap=0.0):
    return attention_narrow_refuses(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)


attention_narrow_declared.limits = {"sizes": {"D": HEAD_DIMS}, "values": {"causal": (True,)}}


def attention_inference_declared(q, k, v, causal=False, sm_scale=None, window=(-1, -1), alibi_slopes=None,
                                  softcap=0.0, dropout_p=0.0, seed=0, return_keep=False):
    """Takes the dropout arguments but not dropout itself (an inference kernel), and says so."""
    if dropout_p != 0.0:
        raise NotImplementedError("dropout_p: only 0 (no dropout) is supported")
    out = _attention(q, k, v, causal, sm_scale, window, alibi_slopes, softcap)
    if return_keep:
        return (*out, torch.ones(q.shape[:3] + k.shape[2:3], dtype=torch.bool, device=q.device))
    return out


attention_inference_declared.limits = {"values": {"dropout_p": (0.0,)}}


def rope_same_dtype_refuses(x, cos, sin):
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise TypeError(f"cos/sin must have x's dtype {x.dtype}, got {cos.dtype} and {sin.dtype}")
    return _rope(x, cos, sin)


rope_same_dtype_refuses.refuses = r"cos/sin must have x's dtype"


def rope_same_dtype_declared(x, cos, sin):
    return rope_same_dtype_refuses(x, cos, sin)


rope_same_dtype_declared.limits = {"same_dtype": ("cos", "sin")}


def linear_attention_causal_only_declared(q, k, v, causal=False, eps=1e-6):
    """Causal only, as flash-linear-attention's kernels are."""
    if not causal:
        raise ValueError("causal: only causal=True is supported")
    return _linear_attention(q, k, v, causal=True, eps=eps)


linear_attention_causal_only_declared.limits = {"values": {"causal": (True,)}}



# --- partial-domain errors, undeclared (issue 36): each raises on part of the domain only;
# the inputs it accepts must still be judged, and the verdict must say where it raised

def rope_cos_in_x_dtype(x, cos, sin):
    """A correct plain-PyTorch rope that raises on cos/sin in another dtype than x, in the
    words of a kernel's dtype assertion (a RuntimeError, as an extension's would be)."""
    if cos.dtype != x.dtype:
        raise RuntimeError(f"cos has dtype {str(cos.dtype)[6:]} but x has dtype {str(x.dtype)[6:]}")
    return _torch_rope(x, cos, sin)


def rope_cos_in_x_dtype_wrong(x, cos, sin):
    """The same refusal in front of a planted bug on what it accepts: sin's sign flipped."""
    if cos.dtype != x.dtype:
        raise RuntimeError(f"cos has dtype {str(cos.dtype)[6:]} but x has dtype {str(x.dtype)[6:]}")
    return _torch_rope(x, cos, -sin)


def linear_attention_causal_only(q, k, v, causal=False, eps=1e-6):
    """A correct causal linear attention that raises on causal=False, undeclared."""
    if not causal:
        raise NotImplementedError("causal=False is not implemented: only causal linear attention")
    return _torch_linear_attention(q, k, v, True, eps)
