"""Standalone probes of fla-core's gated delta rule (torch, triton and fla-core only; no tritoncheck).

    python examples/fla/repro_gated_delta_rule.py [--large]

Each probe runs ``chunk_gated_delta_rule`` (and ``fused_recurrent_gated_delta_rule`` where it
applies) on one input and compares it with an fp64 recurrence written here (the contract's,
``docs/contract.md``: h'_t = exp(g_t) h_{t-1}, u_t = beta_t (v_t - h'_t^T k_t), h_t = h'_t +
k_t u_t^T, o_t = scale h_t^T q_t), printing the relative error of o and of the final state
against a bound that the suite's derived rule never comes near on these inputs (1e-2 of the
output's scale in bfloat16, 1e-3 in float32 with fla's tf32 dots). Exit 1 if any probe is off:

1. packed sequences with a zero-length one (cu_seqlens int64 and int32): its final state must
   be its initial state, the others' outputs their own;
2. head dims that are not powers of two (K = 40, V = 24);
3. one sequence past 2**17 tokens (state-spaces/mamba#1015 saw SSD go wrong past ~61K);
4. ``--large``: B x T x H x K past 2**31 elements (fla#1080), the last batch row compared.
"""
from __future__ import annotations

import sys

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

DEVICE = "cuda"
BAD = []


def inputs(B, T, H, K, V, dtype=torch.bfloat16, seed=0, decay=0.05):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, T, H, K, device=DEVICE, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=DEVICE, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device=DEVICE, generator=gen)
    g = -decay * torch.rand(B, T, H, device=DEVICE, generator=gen)
    beta = torch.rand(B, T, H, device=DEVICE, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype)


def reference(q, k, v, g, beta, h0, chunk=64):
    """fp64, one sequence [T, H, *]: the chunked WY form of the recurrence (fp64 exact to 1e-13
    against the token loop; a chunk loop, so 2**17 tokens take seconds)."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    h = h0.double().clone()
    outs = []
    for s in range(0, q.shape[0], chunk):
        qc, kc, vc = (t[s:s + chunk].transpose(0, 1) for t in (q, k, v))
        G = torch.cumsum(g[s:s + chunk], 0).transpose(0, 1)
        n = G.shape[1]
        low = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        R = torch.where(low, torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~low, 0)), 0.0)
        bc = beta[s:s + chunk].transpose(0, 1)
        A = (bc[:, :, None] * (kc @ kc.transpose(1, 2)) * R).tril(-1)
        eye = torch.eye(n, dtype=A.dtype, device=q.device).expand_as(A)
        T = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
        gam = torch.exp(G)
        U = T @ (bc[:, :, None] * (vc - gam[:, :, None] * (kc @ h)))
        outs.append((gam[:, :, None] * (qc @ h) + ((qc @ kc.transpose(1, 2)) * R) @ U).transpose(0, 1))
        h = gam[:, -1, None, None] * h + (kc * R[:, -1, :, None]).transpose(1, 2) @ U
    return torch.cat(outs) * q.shape[-1] ** -0.5, h


def judge(name, got_o, want_o, got_h, want_h, bound):
    eo = ((got_o.double() - want_o).abs().max() / want_o.abs().max().clamp(min=1e-30)).item()
    eh = ((got_h.double() - want_h).abs().max() / want_h.abs().max().clamp(min=1e-30)).item()
    bad = not (eo <= bound and eh <= bound)  # NaN fails
    print(f"{'BUG' if bad else 'ok '} {name}: o off by {eo:.2e}, final state by {eh:.2e} of scale (bound {bound:g})")
    if bad:
        BAD.append(name)


def packed(cu_dtype):
    q, k, v, g, beta = inputs(1, 200, 2, 64, 64)
    cu = torch.tensor([0, 70, 70, 200], device=DEVICE, dtype=cu_dtype)
    h0 = torch.randn(3, 2, 64, 64, device=DEVICE)
    for name, fn in (("chunk", chunk_gated_delta_rule), ("fused_recurrent", fused_recurrent_gated_delta_rule)):
        try:
            o, ht = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        except Exception as exc:  # noqa: BLE001 - a refusal is a finding too
            print(f"BUG {name} packed, cu_seqlens {cu_dtype}: raised {type(exc).__name__}: {exc}")
            BAD.append(f"{name} packed {cu_dtype}")
            continue
        for n, (a, b) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
            if a == b:
                same = torch.equal(ht[n], h0[n])
                print(f"{'ok ' if same else 'BUG'} {name} packed, cu_seqlens {cu_dtype}: zero-length sequence {n} "
                      f"keeps its initial state bit for bit: {same} (max change {(ht[n] - h0[n]).abs().max().item():.3g})")
                if not same:
                    BAD.append(f"{name} zero-length {cu_dtype}")
                continue
            ro, rh = reference(q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b], beta[0, a:b], h0[n])
            judge(f"{name} packed, cu_seqlens {cu_dtype}, sequence {n}", o[0, a:b], ro, ht[n], rh, 1e-2)


def odd_head_dims():
    q, k, v, g, beta = inputs(2, 100, 2, 40, 24)
    h0 = torch.randn(2, 2, 40, 24, device=DEVICE)
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    for b in range(2):
        ro, rh = reference(q[b], k[b], v[b], g[b], beta[b], h0[b])
        judge(f"chunk K = 40, V = 24, batch {b}", o[b], ro, ht[b], rh, 1e-2)


def long_sequence():
    T = 2**17 + 5
    q, k, v, g, beta = inputs(1, T, 2, 64, 64, decay=0.01)
    h0 = torch.randn(1, 2, 64, 64, device=DEVICE)
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ro, rh = reference(q[0], k[0], v[0], g[0], beta[0], h0[0])
    judge(f"chunk one sequence of {T} tokens (last 256 tokens and the final state)", o[0, -256:], ro[-256:],
          ht[0], rh, 1e-2)


def past_int32():
    T, H, K = 4096, 16, 128
    B = 2**31 // (T * H * K) + 1
    q, k, v, g, beta = inputs(B, T, H, K, K)
    print(f"q {tuple(q.shape)}: {q.numel()} elements (2**31 = {2**31})")
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    zero = torch.zeros(H, K, K, device=DEVICE)
    for b in (0, B - 1):
        ro, rh = reference(q[b], k[b], v[b], g[b], beta[b], zero)
        judge(f"chunk past 2**31 elements, batch row {b}", o[b], ro, ht[b], rh, 1e-2)


if __name__ == "__main__":
    import fla
    print("fla-core", getattr(fla, "__version__", "?"), "torch", torch.__version__, torch.cuda.get_device_name())
    packed(torch.int64)
    packed(torch.int32)
    odd_head_dims()
    long_sequence()
    if "--large" in sys.argv:
        past_int32()
    print(f"{len(BAD)} probe(s) off: {BAD}" if BAD else "every probe within its bound")
    sys.exit(1 if BAD else 0)
