"""An implementation is checked as it is (issue 25): what its signature cannot take is never
drawn and the checks that need it are not applicable, with the reason; an autograd
Function's ``apply`` binds as its ``forward``; declared ``returns``, ``layout`` and
``argument_names`` replace adapters; a correct attention gets no false alarm from the
key-split merge. The implementations are in tests/applicability_impls.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from hypothesis.errors import UnsatisfiedAssumption

from tests import applicability_impls as impls
from tritoncheck import registry
from tritoncheck.calling import Calling, NotTaken, signature_of
from tritoncheck.registry import OPS, Implementation
from tritoncheck.strategies import Case, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
WHERE = "tests.applicability_impls"


@pytest.fixture(scope="module", autouse=True)
def _ops():
    registry.load()


def _calling(fn) -> Calling:
    return Implementation.of("attention", fn).calling


# ------------------------------------------------------------------ how a call is built

def test_optional_arguments_go_by_keyword_and_never_past_what_the_function_takes():
    calling = _calling(impls.attention)
    assert calling.modes == {"q": "positional", "k": "positional", "v": "positional", "causal": "keyword",
                             "sm_scale": "keyword"}
    values = {"q": 1, "k": 2, "v": 3, "causal": True, "sm_scale": 0.5, "window": (-1, -1), "softcap": 0.0}
    args, kwargs = calling.call_arguments(values, ("q", "k", "v", "causal", "sm_scale", "window", "softcap"))
    assert args == [1, 2, 3] and kwargs == {"causal": True, "sm_scale": 0.5}
    with pytest.raises(NotTaken, match="window"):  # a non-default value it cannot take: the suite's bug
        calling.call_arguments({**values, "window": (4, 0)}, ("q", "k", "v", "causal", "sm_scale", "window"))


def test_keyword_only_var_keyword_and_positional_names_bind_as_python_binds_them():
    def keyword_only(q, k, v, *, causal=False, sm_scale=None):
        pass

    def var_keyword(q, k, v, **options):
        pass

    def own_names(query, key, value, is_causal=False, scale=None):
        pass

    assert _calling(keyword_only).modes["sm_scale"] == "keyword"
    assert not _calling(keyword_only).takes("window")
    assert all(_calling(var_keyword).modes[a] == "keyword" for a in ("causal", "window", "return_keep"))
    # names unknown to the contract at the contract's places: positionally, as before
    own = _calling(own_names)
    assert own.modes["causal"] == own.modes["sm_scale"] == "positional" and not own.takes("window")
    args, kwargs = own.call_arguments({"q": 1, "k": 2, "v": 3, "causal": True}, ("q", "k", "v", "causal"))
    assert args == [1, 2, 3, True] and kwargs == {}


@pytest.mark.parametrize("fn, binding", [
    (lambda q, k, v, causal=False, sm_scale=None, *, mask: q, "missing a required argument: 'mask'"),
    (lambda q, k: q, "too many positional arguments"),
    (lambda q, k, v, causal=False, sm_scale=None, extra=None, *more: q, None),  # binds: loaded
    (lambda q, k, v, causal, sm_scale, *, positions: q, "missing a required argument: 'positions'"),
])
def test_a_signature_that_cannot_bind_the_contracts_call_is_refused_when_loaded(fn, binding):
    """No input can fix it: a TypeError when the implementation is loaded (a usage error
    under pytest and the command), with Python's binding message, the function's
    parameters and the op's contract, never a failure (or a refusal) in every test."""
    if binding is None:
        assert Implementation.of("attention", fn, name="fine").calling.takes("causal")
        return
    with pytest.raises(TypeError) as found:
        Implementation.of("attention", fn, name="wrong")
    text = str(found.value)
    assert binding in text and "cannot be called as the suite calls attention" in text, text
    assert f"Its parameters: {signature_of(fn)}" in text and OPS["attention"].signature in text, text


def test_an_autograd_function_apply_binds_as_its_forward_less_ctx_positionally():
    # positionally only: Function.apply takes no keyword arguments in torch 2.11 (the GPU
    # machine's), so an apply called with causal=... failed every check there
    assert str(signature_of(impls.attention_apply)) == "(q, k, v, causal=False, sm_scale=None, /)"
    values = {"q": "q", "k": "k", "v": "v", "causal": True, "sm_scale": 0.5}
    applied = Implementation.of("attention", impls.attention_apply, name="attention_apply")
    assert applied.calling.call_arguments(values, ("q", "k", "v", "sm_scale")) == (["q", "k", "v", False, 0.5], {})

    class KeywordOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, *, causal=False):
            return q

    assert str(signature_of(KeywordOnly.apply)) == "(q, k, v, /)"  # apply cannot pass causal=

    class WithSetupContext(torch.autograd.Function):
        @staticmethod
        def forward(q, k, v, causal=False):
            return q

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

    assert str(signature_of(WithSetupContext.apply)) == "(q, k, v, causal=False, /)"
    impl = Implementation.of("attention", impls.attention_apply, name="attention_apply")
    assert not impl.calling.takes("window") and impl.limits.fixed["window"] == (-1, -1)
    check = next(c for c in OPS["attention"].checks if c.name == "window_equivalences")
    assert "takes no window" in impl.not_applicable(check)


def test_declared_layout_names_and_returns_call_the_function_directly():
    impl = Implementation.of("attention", impls.flash_attn_func)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))  # the contract's [B, H, N, D]
    outs = impl.outputs(impl.call({"q": q, "k": k, "v": v, "causal": True, "sm_scale": 0.5},
                                  ("q", "k", "v", "causal", "sm_scale")))
    assert set(outs) == {"o"} and outs["o"].shape == (1, 2, 5, 4)
    want, _ = impls.attention(q, k, v, True, 0.5)
    torch.testing.assert_close(outs["o"], want)
    assert impl.limits.orders["q"] == (0, 2, 1, 3)  # contiguous where the function sees [B, N, H, D]
    by_name = {c.name: c for c in OPS["attention"].checks}
    assert "returns o only" in impl.not_applicable(by_name["split_kv_merge"])
    assert impl.not_applicable(by_name["causal_mask_respected"]) is None


def test_a_contiguous_limit_means_contiguous_in_the_declared_layout():
    def flash(q, k, v, *, softmax_scale=None, is_causal=False):
        pass

    flash.layout, flash.limits = "bnhd", {"contiguous": True}
    flash.argument_names = {"sm_scale": "softmax_scale", "causal": "is_causal"}
    impl = Implementation.of("attention", flash)
    spec = TensorSpec(shape=(2, 3, 5, 4), dtype="float32", family="normal", scale=1.0, seed=0,
                      layout=None, injections=(), max_magnitude=None)
    case = Case("attention", "float32", ("q", "k", "v"), {"q": spec, "k": spec, "v": spec}, {})
    fitted = impl.limits.fit(case)
    args, _ = impl.calling.call_arguments(fitted.materialise("cpu"), case.args)
    assert all(t.is_contiguous() and t.shape == (2, 5, 3, 4) for t in args)


@pytest.mark.parametrize("attribute, value, message", [
    ("returns", ("lse",) * 2, "in attention's order"),
    ("returns", ("o", "keep"), "not outputs of attention"),
    ("layout", "nhd", "must be one of 'bhnd', 'bnhd'"),
    ("argument_names", {"scale": "softmax_scale"}, "no argument 'scale'; did you mean 'sm_scale'"),
    ("argument_names", {"sm_scale": "softmax_scal"}, "no parameter 'softmax_scal'"),
    ("argument_names", {"sm_scale": "is_causal", "causal": "is_causal"}, "more than one argument"),
])
def test_calling_declarations_are_validated(attribute, value, message):
    def flash(q, k, v, *, softmax_scale=None, is_causal=False):
        pass

    setattr(flash, attribute, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        Implementation.of("attention", flash)


# ------------------------------------------------------------- split_kv_merge (ask 5)

def _spec(family: str, seed: int, shape=(1, 1, 65, 16), cap: float = 1.6e18) -> TensorSpec:
    return TensorSpec(shape=shape, dtype="float32", family=family, scale=1.0, seed=seed, layout=None,
                      injections=(), max_magnitude=cap)


def _key_split_case(q: TensorSpec, k: TensorSpec) -> Case:
    from tritoncheck.properties.attention import qk_cap
    q, k = (TensorSpec(**{**t.__dict__, "max_magnitude": qk_cap(torch.float32, 16, 0.25)}) for t in (q, k))
    params = {"causal": True, "sm_scale": None, "window": (-1, -1), "softcap": 0.0, "dropout_p": 0.0, "seed": 0,
              "key_cuts": (1,)}
    return Case("attention", "float32", ("q", "k", "v", "causal", "sm_scale"),
                {"q": q, "k": k, "v": _spec("normal", 1, cap=1e3)}, params)


def test_split_kv_merge_reports_a_case_lse_rounding_leaves_unknown_not_applicable():
    """The issue's replay: q near_max [1, 1, 65, 16], k constant, causal, keys cut at [1]:
    lse = s + log n rounds to s near 1e18. The correct SDPA attention failed by 3.3e5 x."""
    from tritoncheck.properties.attention import split_kv_merge
    case = _key_split_case(_spec("near_max", 0), _spec("constant", 0))
    with pytest.raises(UnsatisfiedAssumption, match="not applicable: in 64 of the 65 rows"):
        split_kv_merge(case, Implementation.of("attention", impls.sdpa_attention))


def test_split_kv_merge_passes_sdpa_and_fails_a_wrong_lse_on_ordinary_scores():
    from tritoncheck.properties.attention import split_kv_merge
    case = _key_split_case(_spec("normal", 0), _spec("normal", 2))
    split_kv_merge(case, Implementation.of("attention", impls.sdpa_attention))
    with pytest.raises(AssertionError, match="merge of key blocks"):
        split_kv_merge(case, Implementation.of("attention", impls.sdpa_attention_unscaled_lse))


# ------------------------------------------------------------------ the suite on them

def _suite(tmp_path: Path, *names: str, select: str | None = None) -> tuple[dict[str, str], dict]:
    """The attention checks in float32 on CPU on ``names``: outcomes by test id ('passed',
    'failed', 'skipped: <reason>') and the report."""
    xml = tmp_path / "attention.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_checks.py", "-q", "-p", "no:randomly", "-p", "no:xdist",
           "--dtype", "float32", "--max-examples", "5", "--report-dir", str(tmp_path / "reports"), f"--junitxml={xml}",
           "--hypothesis-seed", "0"]  # the quick profile of an --impl run draws afresh: CI must be reproducible
    cmd += [f"--impl=attention={WHERE}:{name}" for name in names] + (["-k", select] if select else [])
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert xml.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = case.get("name").partition("[")[2].rstrip("]")
        skipped = case.find("skipped")
        outcomes[test_id] = ("failed" if case.find("failure") is not None or case.find("error") is not None else
                             f"skipped: {skipped.get('message')}" if skipped is not None else "passed")
    return outcomes, json.loads((tmp_path / "reports" / "report.json").read_text())


# slow: every attention check of three implementations under the interpreter, about 60 CPU-seconds;
# on every commit test_a_buggy_variant_of_each_still_fails calls the same three conventions (plain,
# autograd Function's apply, declared names, layout and returns) through the suite
@pytest.mark.slow
def test_plain_apply_and_declared_attentions_pass_with_the_variant_checks_not_applicable(tmp_path):
    names = ("attention", "attention_apply", "flash_attn_func")
    outcomes, report = _suite(tmp_path, *names)
    assert not [t for t, o in outcomes.items() if o == "failed"]
    for name in names:
        mine = {t.split("-")[-1]: o for t, o in outcomes.items() if t.startswith(f"attention-{name}-")}
        assert sum(o == "passed" for o in mine.values()) >= 10, (name, mine)
        assert "takes no window" in mine["window_equivalences"] and "takes no alibi_slopes" in mine[
            "alibi_zero_slopes_plain"] and "takes no dropout_p, seed" in mine["dropout_keep_iid"], mine
        assert all(o.startswith("skipped: not applicable") for c, o in mine.items() if o.startswith("skipped")), mine
    declared = {t.split("-")[-1]: o for t, o in outcomes.items() if t.startswith("attention-flash_attn_func-")}
    for check in ("split_kv_merge", "online_lse_matches_full"):
        assert f"returns o only (declared returns), no lse ({check} needs it)" in declared[check]
    for check in ("matches_reference", "causal_mask_respected", "gradients_match_reference",
                  "bottom_right_causal_is_last_rows"):
        assert declared[check] == "passed", (check, declared[check])
    reasons = {s["test"].partition("[")[2].rstrip("]"): s["reason"] for s in report["skipped"]}
    assert "takes no window" in reasons["attention-attention-float32-window_equivalences"]


def test_a_buggy_variant_of_each_still_fails(tmp_path):
    names = ("attention_wide_causal", "attention_apply_wide_causal", "flash_attn_func_top_left")
    outcomes, _ = _suite(tmp_path, *names, select="matches_reference")
    for name in names:
        assert outcomes[f"attention-{name}-float32-matches_reference"] == "failed", outcomes


# ------------------------------------------------------------------ declared values bind the checks' own calls

def test_a_call_outside_the_declared_values_is_outside_the_limits_wherever_it_comes_from():
    from tritoncheck.limits import OutsideLimits
    impl = Implementation.of("attention", impls.sdpa_without_softcap)
    q = torch.randn(1, 2, 5, 4)
    values = {"q": q, "k": q, "v": q, "causal": False, "sm_scale": None, "softcap": 512.0}
    passed = ("q", "k", "v", "causal", "sm_scale", "window", "alibi_slopes", "softcap")
    with pytest.raises(OutsideLimits, match=r"softcap=512.0, outside its declared limits \(softcap in \[0.0\]\)"):
        impl.call(values, passed)
    impl.outputs(impl.call({**values, "softcap": 0.0}, passed))  # inside: called


@pytest.mark.parametrize("fn, check, named", [
    (impls.sdpa_without_softcap, "softcap_large_cap_plain", "softcap="),
    (impls.sdpa_without_window, "window_equivalences", "window=("),
])
def test_a_check_that_passes_its_own_values_is_bound_by_the_declared_domain_or_not_applicable(fn, check, named):
    """softcap_large_cap_plain calls softcap 512 and window_equivalences a window of Nk keys
    whatever the case: against a kernel that declares softcap in (0.0,) or no window they are
    not applicable (skipped with the reason), never a call the kernel said it does not take
    (which raised NotImplementedError before: a failure)."""
    from tritoncheck import harness, unrunnable
    unrunnable.reset()
    op = OPS["attention"]
    target = harness.Target(op, Implementation.of("attention", fn), torch.float32,
                            next(c for c in op.checks if c.name == check))
    with pytest.raises(pytest.skip.Exception) as skipped:
        harness._first_draw(target, target.run)
    assert str(skipped.value).startswith("not applicable: this check calls the implementation with ") \
        and named in str(skipped.value), str(skipped.value)
