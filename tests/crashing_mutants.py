"""Planted "bugs" that only break the kernel, for tests/test_selfcheck.py: a mutant
counts as killed only by the failing assertion of the check it names, so these must
survive every check however soon they crash (tritoncheck/selfcheck.py)."""
from tritoncheck.kernels import softmax as kernel
from tritoncheck.mutation import mutant

_CALL = "return _Softmax.apply(x, float(temperature))"

wrapper_index_error = mutant(
    "softmax", kernel,
    [(_CALL, "return [_Softmax.apply(x, float(temperature))][1]")],
    name="wrapper_index_error",
    bug="The wrapper indexes past its one-element list: an IndexError on every call, the output never "
        "reaches a check.",
    kills=("rows_sum_to_one",),
)

wrapper_assert = mutant(
    "softmax", kernel,
    [(_CALL, "assert x.shape[-1] < 0, 'planted'\n    " + _CALL)],
    name="wrapper_assert",
    bug="An assert in the wrapper that never holds: an AssertionError, but the implementation's own, "
        "raised before any check compared anything.",
    kills=("rows_sum_to_one",),
)
