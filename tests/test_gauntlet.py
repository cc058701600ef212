"""The gauntlet (mutants/cheats.py): every trick dies, by the check it names, on the CPU.

tests/test_selfcheck.py hunts the cheats like every mutant (HUNT_EXAMPLES, every dtype,
in a child process); here each dies within a few float32 examples in this process, and
what the failing check says is asserted: a cheat must be caught for what it is.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritoncheck import autotune_configs, backend, generic, registry, selfcheck
from tritoncheck.mutants import cheats
from tritoncheck.poisoning import poisoned_allocations
from tritoncheck.strategies import Case, TensorSpec

OPS = registry.load()
CHEATS = [m for m in selfcheck.mutants() if m.module == cheats.__name__]
EXAMPLES = 5
# the first words of the failure each (cheat, check) must give: caught for what it is
SAYS = {
    ("shape_keyed_cache", "calls_independent"): "a second call on other values",
    ("pointer_keyed_cache", "calls_independent"): "a second call on other values",
    ("output_buffer_reused", "calls_independent"): "a later call of output_buffer_reused changed the output",
    ("stale_memory", "deterministic"): "stale_memory is not deterministic",
    ("stale_memory", "calls_independent"): "does not match the fp64 reference",
    ("zeros_below_tolerance", "matches_reference"): "does not match the fp64 reference",
    ("input_copied", "matches_reference"): "does not match the fp64 reference",
    ("precision_lowered", "matches_reference"): "does not match the fp64 reference",
    ("input_mutated", "matches_reference"): "does not match the fp64 reference",
    ("input_mutated", "inputs_unchanged"): "input_mutated wrote into its input 'up'",
    ("autotune_config_skips_writes", "matches_reference"): "does not match the fp64 reference",
    ("kv_state_reused", "calls_independent"): "a second call on other values",
    ("dropout_cached_by_seed", "calls_independent"): "a second call on other values",
    ("input_mutated_under_dropout", "dropout_matches_reference"):
        "does not match the fp64 reference given the returned keep mask",
}


def test_the_gauntlet_is_discovered_by_the_self_test():
    assert sorted(m.name for m in CHEATS) == sorted({name for name, _ in SAYS})
    assert sorted((m.name, c) for m in CHEATS for c in m.kills) == sorted(SAYS)
    assert all(m.bug.startswith("Trick") for m in CHEATS)


@pytest.mark.parametrize("name,check", sorted(SAYS), ids=[f"{n}-{c}" for n, c in sorted(SAYS)])
def test_each_cheat_dies_by_its_check(name, check):
    m = getattr(cheats, name)
    op = OPS[m.op]
    found = {c.name: c for c in op.checks}[check]
    verdict = selfcheck.hunt(op, selfcheck.as_implementation(m), found, torch.float32, EXAMPLES)
    assert verdict.killed, f"{name} survived {check} in {EXAMPLES} float32 examples: {verdict.describe()} {verdict.text}"
    assert verdict.text.startswith(SAYS[name, check]) or SAYS[name, check] in verdict.text.split("\n")[0], \
        verdict.text


def _swiglu_case():
    tensors = {name: TensorSpec((4, 8), "float32", seed=seed) for name, seed in (("gate", 1), ("up", 2))}
    return OPS["swiglu"], Case("swiglu", "float32", ("gate", "up"), tensors)


def test_the_reference_is_computed_from_the_inputs_as_they_were_before_the_call():
    """The weakness input_mutated exploits: computed from the tensors after the call, the
    fp64 reference agrees with its zeros; from the snapshot it does not."""
    op, case = _swiglu_case()
    values = case.materialise(backend.device())
    before = generic.snapshot(values)
    out = cheats.input_mutated(values["gate"], values["up"])
    after_call, _ = op.expected(case, values)
    from_snapshot, _ = op.expected(case, before)
    got = out.double().cpu().numpy()
    assert (after_call["y"] == got).all()  # a reference read after the call is fooled
    assert not (from_snapshot["y"] == got).all()
    assert before["up"].data_ptr() != values["up"].data_ptr()  # the snapshot is a copy, not a view


def test_a_snapshot_keeps_strides_offsets_and_the_bytes_between():
    base = torch.arange(24, dtype=torch.float32)
    view = base[3:].as_strided((3, 4), (1, 5), 3)
    snap = generic.snapshot({"x": view, "p": 0.5})
    base.zero_()
    assert snap["p"] == 0.5 and snap["x"].stride() == (1, 5) and snap["x"].storage_offset() == 3
    assert torch.equal(snap["x"], torch.arange(24, dtype=torch.float32).as_strided((3, 4), (1, 5), 3))


def test_autotune_configs_run_in_turn_each_on_fresh_poisoned_outputs():
    """Under the interpreter an unpinned autotuner cannot time its configs at all; on a GPU
    it times them on one shared buffer (triton#9230). In turn, config 1 runs alone on a
    fresh NaN output, and its missing store shows."""
    fn = cheats.autotune_config_skips_writes
    gate, up = torch.randn(300, device=backend.device()), torch.randn(300, device=backend.device())
    want = torch.nn.functional.silu(gate.double()) * up.double()
    outs = []
    for _ in range(2):
        with poisoned_allocations(), autotune_configs.pinned_all(fn, autotune_configs.each_in_turn(fn, None)):
            outs.append(fn(gate, up))
    configs = {outs[0].isnan().any().item(), outs[1].isnan().any().item()}
    assert configs == {True, False}  # one config wrote, the other left the poison
    written = outs[0] if not outs[0].isnan().any() else outs[1]
    assert torch.allclose(written.double(), want, rtol=1e-5, atol=1e-6)
    assert autotune_configs.each_in_turn(fn, 3) == 3  # --autotune-config I pins I
    assert autotune_configs.each_in_turn(OPS["swiglu"].reference, None) is None  # nothing declared


def test_a_replay_script_loads_its_inputs_as_data_only(tmp_path, monkeypatch):
    """A failing case travels (CI artefacts, bug reports): the generated script must not
    unpickle code. A .pt swapped for a pickle that runs a command is refused."""
    from tritoncheck import harness
    from tritoncheck.config import CONFIG
    monkeypatch.setattr(CONFIG, "report_dir", tmp_path)
    op, case = _swiglu_case()
    impl = registry.Implementation.of("swiglu", registry.resolve("tritoncheck.controls.elementwise:torch_swiglu"),
                                      kind="control", target="tritoncheck.controls.elementwise:torch_swiglu")
    target = harness.Target(op, impl, torch.float32, op.checks[0])
    path = harness.save_failure(target, case)
    script, data = path.with_suffix(".py"), path.with_suffix(".pt")
    assert 'weights_only=True' in script.read_text()
    assert set(torch.load(data, weights_only=True)) >= {"gate", "up"}  # the inputs load as data

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"gate": Payload()}, data)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode != 0 and not marker.exists(), done.stdout + done.stderr
    assert "Weights only load failed" in done.stderr or "UnpicklingError" in done.stderr, done.stderr
