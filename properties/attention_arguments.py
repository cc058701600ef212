"""Attention cases as calls: the contract's positional arguments and their defaults, the
scalar modifiers a case carries, and the domain of the backward's sums. Shared by the
attention family's modules (properties/attention.py, attention_dropout.py), which import
it rather than each other."""
from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import assume

from tritoncheck.oracle import to_numpy
from tritoncheck.references import attention as ref
from tritoncheck.strategies import Case

NO_WINDOW = (-1, -1)


def _fmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _resolved_scale(sm_scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)


ARGS = ("q", "k", "v", "causal", "sm_scale")


# in the contract's order, after ARGS
EXTRA_ARGS = ("window", "alibi_slopes", "softcap", "dropout_p", "seed", "return_keep")


_DEFAULTS = {"window": NO_WINDOW, "alibi_slopes": None, "softcap": 0.0, "dropout_p": 0.0, "seed": 0,
             "return_keep": False}


def case_args(params: dict, tensors=()) -> tuple[str, ...]:
    """The positional arguments of a call: the original five, then the newer ones up to the
    last that is not its default, so a kernel written before them takes the plain cases."""
    used = {"window": tuple(params.get("window", NO_WINDOW)) != NO_WINDOW, "alibi_slopes": "alibi_slopes" in tensors,
            "softcap": params.get("softcap", 0.0) != 0.0, "dropout_p": params.get("dropout_p", 0.0) != 0.0,
            "seed": params.get("seed", 0) != 0, "return_keep": bool(params.get("return_keep", False))}
    last = max((i for i, name in enumerate(EXTRA_ARGS) if used[name]), default=-1)
    return ARGS + EXTRA_ARGS[:last + 1]


def _complete(params: dict, args: tuple[str, ...], tensors) -> dict:
    """``params`` with the defaults of positional arguments that are neither set nor tensors."""
    return {**{a: _DEFAULTS[a] for a in args if a in _DEFAULTS and a not in tensors}, **params}


def window_of(case: Case) -> tuple[int, int]:
    return tuple(case.params.get("window", NO_WINDOW))


def with_params(case: Case, **params) -> Case:
    """``case`` with scalar arguments changed (and its positional arguments to match)."""
    new = {**case.params, **params}
    args = case_args(new, case.tensors)
    return dataclasses.replace(case, args=args, params=_complete(new, args, case.tensors))


def mods(case: Case, values: dict | None = None) -> dict:
    """The score modifiers of a case for the references and rules: ALiBi slopes (fp64
    NumPy, from ``values`` when given, else materialised) and softcap."""
    slopes = None
    if "alibi_slopes" in case.tensors:
        t = values["alibi_slopes"] if values is not None and "alibi_slopes" in values else \
            case.tensors["alibi_slopes"].materialise("cpu")
        slopes = to_numpy(t) if t is not None else None
    softcap = values.get("softcap", case.params.get("softcap", 0.0)) if values is not None else \
        case.params.get("softcap", 0.0)
    return {"alibi_slopes": slopes, "softcap": float(softcap)}


def _scale_of(case: Case) -> float:
    return _resolved_scale(case.params["sm_scale"], case.tensors["q"].shape[-1])


def _backward_sums_in_domain(case: Case, q, k, v, do, o) -> None:
    """Reject (``assume``) a case whose backward sums pass through magnitudes beyond
    max / 8 of the dtype (|dO| |V|^T, max(1, scale) |dS| |K|, max(1, scale) |dS|^T |Q|,
    P^T |dO|, max(1, softcap) |dS|, in fp32 or the input dtype; |dS| meaning the sizes it
    is computed from, P (|dP| + |delta|)): the gradient, or a partial sum of it, cannot
    be held. Arguments are fp64 torch tensors; ``o`` is the fp64 reference output.

    With the case's dropout_p > 0 (c = 1 / (1 - p)) the bound holds for every keep mask M,
    drawn or not: dP' = c M dP, the weights in dV are c M P and |o| <= c P |V|, each at most
    c times its dropout-free magnitude (M only zeroes terms); ``o`` is then not read."""
    scale = _scale_of(case)
    k_heads = k.shape[1]
    k, v = ref.repeat_kv(k, q.shape[1]), ref.repeat_kv(v, q.shape[1])
    s = ref._scores(q @ k.transpose(-1, -2), scale, **mods(case))
    visible = ref.visible_pairs_torch(s.shape[-2], s.shape[-1], case.params["causal"], window_of(case), q.device)
    # rows that see no key have P = 0 (the contract's o = 0), not a softmax of -inf
    pr = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)
    dropout_p = case.params.get("dropout_p", 0.0)
    c = 1.0 / (1.0 - dropout_p)
    dp = c * (do @ v.transpose(-1, -2))
    delta = (do.abs() * (c * pr @ v.abs())).sum(-1, keepdim=True) if dropout_p \
        else (do * o).sum(-1, keepdim=True).abs()
    # dS = P (dP - delta) is computed as a difference of rounded dP and delta: where they
    # cancel (a row that sees one key has dS = 0 exactly) the computed dS is a rounding
    # residue of up to u (|dP| + |delta|), not 0, and a near-max k times it overflows; the
    # domain bounds the products with P (|dP| + |delta|), which holds the residue too
    ds = pr * (dp.abs() + delta)
    big_scale = max(1.0, scale)  # the kernel multiplies by the scale after the sum

    def group_sum(t):  # dk, dv of a shared KV head sum over its group of query heads
        return t.reshape(t.shape[0], k_heads, -1, *t.shape[2:]).sum(dim=2)

    # a plain softcap backward (s_c = c tanh(s / c), as transformers writes it) holds dS c
    # before the chain rule's 1 - tanh^2 and / c bring it back
    sums = (c * (do.abs() @ v.abs().transpose(-1, -2)), max(1.0, case.params.get("softcap") or 0.0) * ds,
            big_scale * (ds @ k.abs()),
            group_sum(big_scale * (ds.transpose(-1, -2) @ q.abs())), group_sum(c * (pr.transpose(-1, -2) @ do.abs())))
    big = max(float(t.max()) for t in sums)
    assume(math.isfinite(big) and big <= _fmax(getattr(torch, case.dtype)) / 8)


def _values_for(case: Case, values: dict) -> dict:
    """``values`` for a call of ``case``: its ALiBi slopes only if it has them, and the
    defaults of positional arguments the values lack."""
    out = {n: t for n, t in values.items() if n != "alibi_slopes" or "alibi_slopes" in case.tensors}
    return {**out, **{a: case.params[a] for a in case.args if a in case.params and a not in out}}


def _without_alibi(case: Case) -> Case:
    """``case`` without its ALiBi slopes (arguments re-derived)."""
    return with_params(dataclasses.replace(case, tensors={n: t for n, t in case.tensors.items()
                                                          if n != "alibi_slopes"}))
