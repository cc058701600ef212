"""Planted bugs in kernels.py: each a one-snippet source patch (tritoncheck.mutation.mutant),
with the real bug it models and the checks that must catch it."""
import tritoncheck.mutation as mutation
from bias_gelu import (
    kernels,
    ops,  # noqa: F401 - registers the op the mutants belong to
)

tanh_where_erf = mutation.mutant(
    "bias_gelu", kernels,
    [("TANH=approximate == \"tanh\"", "TANH=True")],
    name="tanh_where_erf", attr="bias_gelu",
    bug="The tanh approximation whatever approximate says (a kernel written for GPT-2's gelu_new reused "
        "where the model wants the exact erf GELU): at most 4.7e-4 off (|z| = 2.7), but 10 % off at z = -3 "
        "and 45 % at z = -4, in the negative tail where the erf GELU is z Phi(z).",
    kills=("matches_reference",),
)

erf_where_tanh = mutation.mutant(
    "bias_gelu", kernels,
    [("TANH=approximate == \"tanh\"", "TANH=False")],
    name="erf_where_tanh", attr="bias_gelu",
    bug="The other way round: the exact erf GELU where approximate='tanh' asks for the approximation (a "
        "model trained with gelu_tanh served by an erf kernel): the same differences, the other sign.",
    kills=("matches_reference",),
)

bias_wrong_axis = mutation.mutant(
    "bias_gelu", kernels,
    [("z = x + bias[None, :]", "z = x + bias[:, None]")],
    name="bias_wrong_axis", attr="bias_gelu",
    bug="The bias is broadcast along the tile's columns instead of its rows (bias[:, None]): element (m, n) "
        "gets the bias of column n0 + (m mod BLOCK). The tile is square, so the shapes agree and it "
        "compiles; right only when the bias is constant or the tile holds one row and one column.",
    kills=("matches_reference",),
)

last_row_block_unwritten = mutation.mutant(
    "bias_gelu", kernels,
    [("grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))", "grid = (M // BLOCK, triton.cdiv(N, BLOCK))")],
    name="last_row_block_unwritten", attr="bias_gelu",
    bug="The grid has M // BLOCK row blocks instead of cdiv(M, BLOCK): the last M % BLOCK rows are never "
        "written and keep whatever the allocation held (NaN under the suite's poisoned allocations). Right "
        "whenever M is a multiple of 32.",
    kills=("matches_reference",),
)

bias_flag_dropped = mutation.mutant(
    "bias_gelu", kernels,
    [("HAS_BIAS=has_bias,", "HAS_BIAS=False,")],
    name="bias_flag_dropped", attr="bias_gelu",
    bug="The kernel's HAS_BIAS flag is never set (a wrapper that grew an optional bias and forgot to pass the "
        "flag): gelu(x) whatever bias is given. Right whenever the bias is None or zero.",
    kills=("matches_reference",),
)
