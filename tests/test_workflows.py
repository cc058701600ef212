"""The CI workflow files: valid GitHub Actions workflows (checked against the workflow
JSON schema that check-jsonschema ships, offline), and every tox environment, script
and Hypothesis profile they name exists."""
import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_there_are_cpu_gpu_and_nightly_workflows():
    assert {p.stem for p in WORKFLOWS} >= {"cpu", "gpu", "nightly"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid_against_the_github_workflow_schema(workflow):
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(workflow)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_what_a_workflow_runs_exists(workflow):
    text = workflow.read_text()
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    for env in re.findall(r"tox -e ([\w-]+)", text):
        assert tox.has_section(f"testenv:{env}"), f"{workflow.name} runs tox -e {env}, which tox.ini lacks"
        body = tox.get(f"testenv:{env}", "commands", fallback="")
        for script in re.findall(r"(scripts/\S+)", body):
            assert (ROOT / script).exists(), f"tox env {env} runs {script}, which does not exist"
        for profile in re.findall(r"--hypothesis-profile (\w+)", body):
            settings.get_profile(profile)  # raises for a profile conftest.py does not register


def test_the_schema_check_can_fail(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOWS[0].read_text().replace("runs-on:", "runs-onn:"))
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "runs-on" in done.stdout + done.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_a_workflow_that_runs_the_suite_keeps_junit_and_writes_the_summary_page(workflow):
    text = workflow.read_text()
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    suites = [env for env in re.findall(r"tox -e ([\w-]+)", text)
              if "pytest" in tox.get(f"testenv:{env}", "commands", fallback=tox.get("testenv", "commands"))]
    assert suites, f"{workflow.name} runs no pytest through tox"
    for env in suites:
        commands = tox.get(f"testenv:{env}", "commands", fallback="")
        assert "--junitxml=reports/" in commands, f"tox env {env} writes no JUnit XML"
        assert f".tox/{env}/bin/python -m tritoncheck report summary reports/" in text \
            and '>> "$GITHUB_STEP_SUMMARY"' in text, f"{workflow.name} does not write {env}'s summary"


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


def _pytest_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "python -m pytest" in line and not line.lstrip().startswith("#")]


def test_the_commit_tier_and_the_nightly_tier_together_run_every_test():
    """.ci/run runs every test not marked slow, the nightly workflow every test marked slow,
    both over the whole of testpaths (no file named): together, every test on the CPU."""
    ci = _pytest_lines((ROOT / ".ci" / "run").read_text())
    assert ci == ['python -m pytest -m "not slow" -n 2'], ci  # the README's command 2, as it is written there
    tox = _tox()
    nightly = (ROOT / ".github" / "workflows" / "nightly.yml").read_text()
    slow = [line for env in re.findall(r"tox -e ([\w-]+)", nightly)
            for line in _pytest_lines(tox.get(f"testenv:{env}", "commands", fallback=""))
            if re.search(r"-m slow\b", line)]
    assert len(slow) == 1 and "tests/" not in slow[0], f"nightly.yml runs no -m slow over every test: {slow}"
    cpu = (ROOT / ".github" / "workflows" / "cpu.yml").read_text()
    per_commit = [line for env in re.findall(r"tox -e ([\w-]+)", cpu)
                  for line in _pytest_lines(tox.get(f"testenv:{env}", "commands", fallback=""))]
    assert per_commit and all('-m "not slow"' in line and "tests/" not in line for line in per_commit), per_commit


def test_the_gpu_runs_keep_both_tiers():
    """The GPU job and script run whole files without a tier filter, and the script's
    slow part runs the slow tests of the files its other parts leave out."""
    gpu = _tox().get("testenv:gpu", "commands")
    assert "not slow" not in gpu and "-m slow" not in gpu
    script = (ROOT / "scripts" / "gpu_run.sh").read_text()
    assert "not slow" not in script and re.search(r"pytest tests -m slow", script)


def test_ci_builds_the_docs_site_strictly_with_the_docs_extra():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'pip install .*-e "\.\[test,docs\]"', ci) and "mkdocs build --strict" in ci
    import tomllib
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    tox = _tox()
    assert tox.get("testenv:docs", "deps").split() == extra, "tox's docs env installs pyproject.toml's docs extra"
    assert "mkdocs build --strict" in tox.get("testenv:docs", "commands")
    assert "tox -e docs" in (ROOT / ".github" / "workflows" / "cpu.yml").read_text()
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^strict: true$", config, re.M) and re.search(r"name: material", config)


def test_every_docs_page_is_in_the_nav_or_named_as_left_out():
    """mkdocs --strict fails on a page left out of the nav too; this says which page without
    building the site."""
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", config, re.M))
    left_out = config.partition("not_in_nav: |")[2].partition("\nvalidation:")[0].split()
    docs = ROOT / "docs"
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md")}
    unlisted = {p for p in pages - listed if not any(Path(p).match(pattern) for pattern in left_out)}
    assert not unlisted, f"docs pages in neither the nav nor not_in_nav of mkdocs.yml: {sorted(unlisted)}"
    assert listed <= pages, f"the nav names pages that do not exist: {sorted(listed - pages)}"


def test_the_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 100, "the README fits on two screens: move the details into docs/"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links and all((ROOT / link).exists() for link in links if "://" not in link), links
    for command in ('python -m pytest -m smoke -n 2', 'python -m pytest -m "not slow" -n 2'):
        assert command in text, f"the README's commands: {command}"
