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

from tritoncheck import registry, selfcheck
from tritoncheck.strategies import Case

OPS = registry.load()


@pytest.mark.parametrize("name", sorted(OPS))
def test_signature_names_the_arguments_in_order(name):
    """The contract's signature (docs/contract.md is generated from it) and the
    arguments the suite passes are the same list."""
    op = OPS[name]
    head, _, _ = op.signature.partition(" -> ")
    assert head.startswith(f"{name}("), f"{name}: signature {op.signature!r} does not start with {name}("
    params = [p.strip().partition("=")[0] for p in re.split(r",(?![^()]*\))", head[len(name) + 1:-1])]
    assert tuple(params) == op.arguments, f"{name}: signature arguments {params} != registry {op.arguments}"
    outputs = head and op.signature.partition(" -> ")[2].strip("()").replace(" ", "").split(",")
    assert tuple(outputs) == op.outputs, f"{name}: signature outputs {outputs} != registry {op.outputs}"
    assert op.meaning, f"{name}: the registry entry has no meaning (the contract's shapes and semantics)"


def test_generated_pages_are_current():
    """docs/contract.md, docs/checks-by-op.md and the generated blocks of README.md and
    docs/declarations.md are what the records give (tritoncheck/contract.py)."""
    from tritoncheck import contract
    assert contract.stale() == [], "run `python -m tritoncheck.contract --write`"


def test_a_generated_block_replaces_only_what_its_markers_hold():
    from tritoncheck import contract
    page = "intro\n<!-- generated:x:start -->\nold\n<!-- generated:x:end -->\noutro\n"
    assert contract.with_block(page, "x", "new") == page.replace("old", "new")
    with pytest.raises(ValueError, match="generated:y:start"):
        contract.with_block(page, "y", "new")


def test_checks_by_op_names_each_check_and_its_planted_bugs():
    from tritoncheck import contract
    page = contract.checks_markdown()
    for name, op in OPS.items():
        assert f"## `{name}`" in page
        assert all(f"`{check.name}`" in page for check in op.checks), name
    padded = next(m for m in selfcheck.mutants() if m.name == "padded_lanes_zero")
    softmax_part = page.partition("## `softmax`")[2].partition("\n## ")[0]
    assert all(f"`{check}`" in softmax_part for check in padded.kills) and "`padded_lanes_zero`" in softmax_part


def test_nothing_refers_outside_the_repository():
    """The repository is self-contained: no file reads or links a sibling folder."""
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\.\./shared|shared/ops-contract|parents\[2\]")
    hits = [f"{p.relative_to(root)}:{i + 1}" for p in sorted(root.rglob("*"))
            if p.suffix in (".py", ".md", ".toml", ".sh", ".ini", ".cfg", ".yml")
            # generated and ignored folders (.venv, .mutants: copies of kernels, reports) are not the repository's
            and not set(p.relative_to(root).parts[:-1]) & {".git", ".venv", ".mutants", ".hypothesis", ".whl", "reports", "site"}
            and p.is_file() for i, line in enumerate(p.read_text(errors="replace").splitlines())
            if pattern.search(line) and p.name != "test_registry.py"]
    assert not hits, f"references outside the repository: {hits}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_check_is_killed_by_some_mutant(name):
    claimed = {c for m in selfcheck.mutants() for c in m.kills}
    unclaimed = [c.name for c in OPS[name].checks if c.name not in claimed]
    assert not unclaimed, f"{name}: no mutant claims to be killed by {unclaimed}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_record_is_complete(name):
    """What the self-test and the side checks need lives on the op's record: adding an op
    touches its family's files only, and this fails until each piece is there."""
    spec = OPS[name]
    missing = [field for field in ("controls", "baseline", "large_problem", "bad_input") if not getattr(spec, field)]
    assert not missing, f"{name}'s OpSpec (properties/) lacks {missing}"


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
    @given(case=op.cases(op.dtypes[0]))
    def agree(case: Case):
        if name == "dropout_residual_layer_norm":  # its reference exists at p = 0 only (else the mask is the kernel's)
            case = case.replace(p=0.0)
        values = case.materialise("cpu")
        expected, inputs64 = op.expected(case, values)
        args = [torch.from_numpy(inputs64[a]) if isinstance(inputs64[a], np.ndarray) else inputs64[a]
                for a in case.args]
        got = op.unpack(op.torch_reference(*args))
        for out in op.outputs:
            if not np.issubdtype(np.asarray(expected[out]).dtype, np.floating):  # a mask: exactly
                np.testing.assert_array_equal(got[out].detach().numpy(), expected[out], err_msg=f"{name}.{out}")
                continue
            # Two fp64 computations in different orders agree to fp64 roundoff times the
            # input's condition; relative to each element alone that can exceed any fixed
            # rtol where an output element cancels (an attention output of 0.012 from values
            # ~1 under scores ~1e4 differed by 1.4e-9 of itself, 1.7e-11 absolute). A
            # wrong formula is off by about the output's scale, so agreement is required to
            # 1e-9 of that scale (the old atol of 1e-12 was absolute, whatever the scale).
            finite = expected[out][np.isfinite(expected[out])]
            scale = float(np.max(np.abs(finite))) if finite.size else 0.0
            np.testing.assert_allclose(got[out].detach().numpy(), expected[out], rtol=1e-9,
                                       atol=max(1e-12, 1e-9 * scale), err_msg=f"{name}.{out}")

    agree()
