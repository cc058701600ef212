"""Every check of every op, for every implementation under test and dtype.

Parametrised from the registry (properties/registry.py): a new op or check needs
no edit here. Test ids read ``op-impl-dtype-check``.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from properties import harness

TARGETS = harness.targets()


@pytest.mark.parametrize("target", harness.params(TARGETS))
@given(data=st.data())
def test_check(target, data):
    target.run(target.draw(data))
