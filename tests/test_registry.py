"""Meta-tests: the registry covers the contract, and the suite can tell right from wrong.

In the spirit of array-api-tests' meta-tests: every contract op is registered with
its references and checks; every check is claimed by at least one planted bug (a
check no mutant can fail is not known to be able to fail); every op has a control.
"""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from properties import registry, selfcheck
from properties.strategies import Case

CONTRACT = Path(__file__).resolve().parents[2] / "shared" / "ops-contract.md"
OPS = registry.load()


def contract_ops() -> set[str]:
    if not CONTRACT.exists():
        pytest.skip(f"{CONTRACT} not found (run from a checkout with shared/ beside it)")
    return set(re.findall(r"^\| `([a-z_]+)` \| `", CONTRACT.read_text(), flags=re.M))


def test_every_contract_op_is_registered():
    missing = contract_ops() - set(OPS)
    assert not missing, f"ops in shared/ops-contract.md with no registry entry: {sorted(missing)}"


def test_signatures_match_the_contract():
    text = CONTRACT.read_text() if CONTRACT.exists() else ""
    for name, op in OPS.items():
        assert f"`{op.signature}`" in text, f"{name}: signature {op.signature!r} is not the contract's"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_check_is_killed_by_some_mutant(name):
    claimed = {c for m in selfcheck.mutants() for c in m.kills}
    unclaimed = [c.name for c in OPS[name].checks if c.name not in claimed]
    assert not unclaimed, f"{name}: no mutant claims to be killed by {unclaimed}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_a_control(name):
    assert selfcheck.CONTROLS.get(name), f"{name} has no control implementation in properties/selfcheck.py"


def test_mutant_kill_claims_name_real_checks():
    for m in selfcheck.mutants():
        names = {c.name for c in OPS[m.op].checks}
        assert set(m.kills) <= names, f"mutant {m.op}.{m.name} claims unknown checks {set(m.kills) - names}"


@pytest.mark.parametrize("name", [n for n in sorted(OPS) if OPS[n].torch_reference is not None])
def test_numpy_and_torch_references_agree(name):
    """The two fp64 references cross-check each other on drawn cases."""
    from hypothesis import given, settings
    op = OPS[name]

    @settings(max_examples=10, deadline=None, derandomize=True, database=None)
    @given(case=op.cases(torch.float32))
    def agree(case: Case):
        values = case.materialise("cpu")
        expected, inputs64 = op.expected(case, values)
        args = [torch.from_numpy(inputs64[a]) if isinstance(inputs64[a], np.ndarray) else inputs64[a]
                for a in case.args]
        got = op.unpack(op.torch_reference(*args))
        for out in op.outputs:
            np.testing.assert_allclose(got[out].detach().numpy(), expected[out], rtol=1e-9, atol=1e-12,
                                       err_msg=f"{name}.{out}")

    agree()


def test_readme_contract_table_is_generated_from_the_registry():
    from properties import contract
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert contract.readme_with_table(readme) == readme, (
        "README.md's contract table is stale: run `python -m properties.contract --write-readme`")
