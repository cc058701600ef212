"""The suite's checks (``tritoncheck/suite.py``) on the project's kernels, or on ``--impl``."""
from tritoncheck.suite import test_check  # noqa: F401 - collected here
