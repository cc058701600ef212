"""Planted bugs in ``tritoncheck.kernels.varlen_attention``: each is the project kernel with
one source patch (``tritoncheck/mutation.py``). Blocks are 16 x 16 under the interpreter,
32 or 64 on the GPU: "a sequence longer than a block" means Nq or Nk past 16 there.
"""
from __future__ import annotations

import tritoncheck.kernels.varlen_attention as _kernel
from tritoncheck.mutation import mutant

packed_bound_for_keys = mutant(
    "varlen_attention", _kernel,
    [("        n_valid = offs_kn < n_k\n",
      "        n_valid = k0 + offs_kn < tl.load(CU_K + tl.num_programs(1))\n")],
    name="packed_bound_for_keys",
    bug="The forward masks keys against the packed total (cu_seqlens_k[-1]) instead of the "
        "sequence's own Nk: the last key block of a sequence reads the next sequence's first keys. "
        "Class: a dense kernel's bound carried into a varlen port. Trigger: a sequence whose Nk is not "
        "a multiple of the key block, followed by a sequence with keys.",
    kills=("matches_reference", "neighbours_ignored", "packed_equals_single_calls"),
)

top_left_causal = mutant(
    "varlen_attention", _kernel,
    [("    diag = n_k - n_q\n", "    diag = 0 * (n_k - n_q)\n")],
    name="top_left_causal",
    bug="Causal masks and windows align to each sequence's top left (diag = 0) instead of its bottom "
        "right (Nk - Nq): a chunk of queries against a cached prefix sees only the first keys. "
        "Class: flash-attention < 2.1's convention. Trigger: causal or a window, a sequence with Nk != Nq.",
    kills=("matches_reference", "gradients_match_reference", "bottom_right_causal_is_last_rows"),
)

keyless_rows_nan = mutant(
    "varlen_attention", _kernel,
    [("    l_i = tl.where(empty, 1.0, l_i)\n    o = acc / l_i[:, None]\n",
      "    o = acc / l_i[:, None]\n")],
    name="keyless_rows_nan",
    bug="A row that sees no key divides 0 by 0: o = NaN instead of 0 for every query of a sequence "
        "without keys (a new request whose cache is empty) and for rows a window misses. "
        "Trigger: a sequence with Nq > 0 and Nk = 0.",
    kills=("matches_reference", "zero_length_sequences"),
)

dkdv_first_group_head_only = mutant(
    "varlen_attention", _kernel,
    [("    for g in range(0, GROUP):\n", "    for g in range(0, 1):\n")],
    name="dkdv_first_group_head_only",
    bug="dk and dv of a KV head sum only the first query head of its group (GQA). Trigger: Hkv < H "
        "with a backward.",
    kills=("gradients_match_reference",),
)

queryless_keys_unwritten = mutant(
    "varlen_attention", _kernel,
    [("    dk = torch.zeros(k.shape, dtype=k.dtype, device=q.device)\n"
      "    dv = torch.zeros(v.shape, dtype=v.dtype, device=q.device)\n",
      "    dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)\n"
      "    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)\n"),
     ("    hi = tl.where(pid_n * BLOCK_N < n_k, hi, lo)\n",
      "    hi = tl.where(pid_n * BLOCK_N < n_k, hi, lo)\n    if n_q == 0:\n        return\n")],
    name="queryless_keys_unwritten",
    bug="The dk/dv program of a sequence without queries returns early, and dk, dv are allocated "
        "uninitialised: the keys no query reads get whatever memory held (NaN under the suite's "
        "poisoned allocations) instead of 0. Class: an early exit for empty work. Trigger: a sequence "
        "with Nq = 0 and Nk > 0, with a backward.",
    kills=("zero_length_sequences", "gradients_match_reference"),
)

output_written_into_q = mutant(
    "varlen_attention", _kernel,
    [("    o = torch.zeros_like(q, memory_format=torch.contiguous_format)\n",
      "    o = q.detach() if q.is_contiguous() else torch.zeros_like(q, memory_format=torch.contiguous_format)\n")],
    name="output_written_into_q",
    bug="o is written over q when q is contiguous (each program reads its query rows before it stores "
        "them, so o is right). Class: an in-place shortcut; the contract never modifies inputs. "
        "Trigger: a contiguous q.",
    kills=("inputs_unchanged",),
)

key_block_alternates = mutant(
    "varlen_attention", _kernel,
    [("    block_m, block_n, num_warps = _fwd_config(q.dtype, block_d)\n    o = ",
      "    block_m, block_n, num_warps = _fwd_config(q.dtype, block_d)\n"
      "    _forward.calls = getattr(_forward, 'calls', 0) + 1\n"
      "    block_n = block_n * (1 + _forward.calls % 2)\n    o = ")],
    name="key_block_alternates",
    bug="Every other call walks the keys in blocks twice as wide, so the online softmax's rescaling "
        "and sums round in another order. Class: a tuner or cache that picks a config per call. "
        "Trigger: a sequence with more keys than one block.",
    kills=("deterministic",),
)

dq_written_into_saved_output = mutant(
    "varlen_attention", _kernel,
    [("    dq = torch.zeros((t_q, heads, d), dtype=q.dtype, device=q.device)\n",
      "    dq = o  # the saved output's memory (o is allocated contiguous)\n")],
    name="dq_written_into_saved_output",
    bug="The backward stores dq into the forward output it saved (after reading it for delta): right "
        "once, but a second backward through the graph reads dq as o. Trigger: any backward run twice "
        "(retain_graph=True).",
    kills=("backward_repeatable",),
)

lse_buffer_shared = mutant(
    "varlen_attention", _kernel,
    [("    lse = torch.full((heads, t_q), float(\"-inf\"), dtype=torch.float32, device=q.device)\n",
      "    lse = _forward.__dict__.setdefault((heads, t_q, q.device), torch.empty((heads, t_q), dtype=torch.float32, "
      "device=q.device)).fill_(float(\"-inf\"))\n")],
    name="lse_buffer_shared",
    bug="lse is written into one buffer per shape, kept across calls (a workspace cache): every call of "
        "the same shape returns the same tensor, so a later call overwrites the lse an earlier caller "
        "holds. Trigger: two calls of one shape.",
    kills=("calls_independent",),
)
