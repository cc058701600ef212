"""Every check of every op, for every implementation under test and dtype.

The test module the plugin runs (``tritoncheck`` runs this file; the checkout's
``tests/test_checks.py`` imports it). Parametrised from the registry
(``tritoncheck/registry.py``): a new op or check needs no edit here. Test ids read
``op-impl-dtype-check``.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tritoncheck import harness
from tritoncheck.config import CONFIG

if not CONFIG.configured:
    raise pytest.UsageError("tritoncheck.suite needs tritoncheck's pytest plugin active: run the `tritoncheck` "
                            "command, or pytest with --impl OP=module:function, -p tritoncheck.plugin or the ini "
                            "option tritoncheck = true")

TARGETS = harness.targets()


@pytest.mark.tritoncheck_check
@pytest.mark.parametrize("target", harness.params(TARGETS))
@given(data=st.data())
def test_check(target, data):
    target.run(target.draw(data))
