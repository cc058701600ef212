"""Planted bugs in fused linear cross-entropy (patches of ``kernels/linear_cross_entropy.py``).

Each mutant is one exact source patch of the project kernel; see ``tritoncheck/mutation.py``.
Triggers are for the kernel's blocks under the interpreter: rows in blocks of 16, the
vocabulary in chunks of 32 (``chunk_size`` 16 to 128), the hidden dim in slices of 32.
The 32-bit offset overflow is in ``mutants/offsets.py`` (the large-index check kills it).
"""
from __future__ import annotations

from tritoncheck.kernels import linear_cross_entropy as _k
from tritoncheck.mutation import mutant

dweight_last_row_block_only = mutant(
    "linear_cross_entropy", _k,
    [('        acc += tl.dot(tl.trans(g), x, input_precision="ieee")',
      '        acc = tl.dot(tl.trans(g), x, input_precision="ieee")')],
    name="dweight_last_row_block_only",
    bug=(
        "dweight is assigned, not accumulated, across the row blocks: it holds the last block's "
        "g^T x only (the dW-across-chunks bug of fused linear cross-entropy). Trigger: N past one "
        "row block, N > 16 under the interpreter, N > 64 on a GPU."
    ),
    kills=("gradients_match_reference",),
)

chunk_boundary_overlap = mutant(
    "linear_cross_entropy", _k,
    [("    for start in range(0, V, BLOCK_V):\n        cols = (start + offs_v).to(tl.int64)\n"
      "        col_ok = cols < V\n        z = _raw_logits(",
      "    for start in range(0, V, BLOCK_V - 1):\n        cols = (start + offs_v).to(tl.int64)\n"
      "        col_ok = cols < V\n        z = _raw_logits(")],
    name="chunk_boundary_overlap",
    bug=(
        "The forward's vocabulary chunks step by BLOCK_V - 1 (an off-by-one chunk boundary): "
        "the last column of each chunk is the first of the next, counted twice in the logsumexp "
        "(and a target there twice). Trigger: V past one chunk (V > 32 by default), which chunk "
        "sizes move."
    ),
    kills=("matches_reference", "chunk_size_invariant", "agrees_with_cross_entropy"),
)

ignored_rows_in_mean = mutant(
    "linear_cross_entropy", _k,
    [('        return total if reduction == "sum" else total / count',
      '        return total if reduction == "sum" else total / n')],
    name="ignored_rows_in_mean",
    bug=(
        "reduction='mean' divides by all N rows instead of the rows not ignored (the ignored "
        "rows' zero losses counted in the mean). Trigger: 'mean' with an ignored row."
    ),
    kills=("matches_reference",),
)

softcap_missing_in_backward = mutant(
    "linear_cross_entropy", _k,
    [("        g = g * (1.0 - t * t)\n", "        g = g\n")],
    name="softcap_missing_in_backward",
    bug=(
        "The backward drops the softcap's derivative 1 - tanh^2(a / c): the forward is capped, "
        "the gradients are those of the uncapped softmax at the capped probabilities. Trigger: "
        "softcap > 0 with logits not small against it (softcap 1)."
    ),
    kills=("gradients_match_reference",),
)

softcap_missing_in_forward = mutant(
    "linear_cross_entropy", _k,
    [("        if HAS_SOFTCAP:\n            z = softcap * _tanh(z / softcap)\n", "")],
    name="softcap_missing_in_forward",
    bug=(
        "The forward's logsumexp and target logit skip the softcap (the backward keeps it): the "
        "loss is the uncapped one. Trigger: softcap > 0 with logits comparable to it."
    ),
    kills=("matches_reference", "agrees_with_cross_entropy"),
)

ignored_rows_in_backward = mutant(
    "linear_cross_entropy", _k,
    [("    live = row_ok[:, None] & col_ok[None, :] & (tgt != ignore_index)[:, None]",
      "    live = row_ok[:, None] & col_ok[None, :]")],
    name="ignored_rows_in_backward",
    bug=(
        "The backward does not mask ignored rows: their g = dl softmax (the one-hot never "
        "matches ignore_index) reaches dx and dweight, though their loss is 0. Trigger: any "
        "ignored row."
    ),
    kills=("gradients_match_reference", "ignored_rows_zero"),
)

target_logit_modulo_chunk = mutant(
    "linear_cross_entropy", _k,
    [("        z_t += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)",
      "        z_t += tl.sum(tl.where((cols % BLOCK_V)[None, :] == (tgt % BLOCK_V)[:, None], z, 0.0), axis=1)")],
    name="target_logit_modulo_chunk",
    bug=(
        "The target's logit is matched by its position inside a chunk (a chunk-local index "
        "compared with a global one's remainder): every chunk contributes a logit. Which classes "
        "share a chunk position changes when the vocabulary is permuted. Trigger: V past one chunk."
    ),
    kills=("matches_reference", "vocabulary_permutation", "agrees_with_cross_entropy"),
)

lse_into_input = mutant(
    "linear_cross_entropy", _k,
    [("    tl.store(LSE + rows, lse, mask=row_ok)\n",
      "    tl.store(LSE + rows, lse, mask=row_ok)\n"
      "    tl.store(X + rows * stride_xn, lse.to(X.dtype.element_ty), mask=row_ok)\n")],
    name="lse_into_input",
    bug=(
        "The forward keeps each row's lse in the first element of its row of x (a scratch "
        "buffer saved by reusing the input): the loss is right, x is not what the caller passed. "
        "Trigger: any call."
    ),
    kills=("inputs_unchanged",),
)

chunk_flips_per_call = mutant(
    "linear_cross_entropy", _k,
    [("        block_v = default_v if chunk_size is None else int(chunk_size)",
      "        _CALLS.append(1)\n"
      "        block_v = (default_v if len(_CALLS) % 2 else 16) if chunk_size is None else int(chunk_size)"),
     ("DTYPES = (torch.float32", "_CALLS = []\nDTYPES = (torch.float32")],
    name="chunk_flips_per_call",
    bug=(
        "Every other call picks the smallest vocabulary chunk (a tuner or cache that chooses "
        "per call): the logsumexp merges the chunks in another grouping and the rounding changes "
        "between calls. Trigger: V past 16."
    ),
    kills=("deterministic",),
)

dx_over_saved_x = mutant(
    "linear_cross_entropy", _k,
    [("        dx = torch.empty((n, h), dtype=x.dtype, device=x.device)",
      "        dx = x if x.is_contiguous() else torch.empty((n, h), dtype=x.dtype, device=x.device)")],
    name="dx_over_saved_x",
    bug=(
        "The backward writes dx over the x it saved in forward (an in-place backward that saves "
        "memory): later tiles and the dweight kernel read gradients where they expect x, and a "
        "second backward through the graph reads them everywhere. Trigger: contiguous x, any "
        "second backward."
    ),
    kills=("backward_repeatable",),
)
