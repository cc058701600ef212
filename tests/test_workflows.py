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
    for env in re.findall(r"tox -e (\w+)", text):
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
    suites = [env for env in re.findall(r"tox -e (\w+)", text)
              if "pytest" in tox.get(f"testenv:{env}", "commands", fallback=tox.get("testenv", "commands"))]
    assert suites, f"{workflow.name} runs no pytest through tox"
    for env in suites:
        commands = tox.get(f"testenv:{env}", "commands", fallback="")
        assert "--junitxml=reports/" in commands, f"tox env {env} writes no JUnit XML"
        assert f".tox/{env}/bin/python -m tritoncheck report summary reports/" in text \
            and '>> "$GITHUB_STEP_SUMMARY"' in text, f"{workflow.name} does not write {env}'s summary"
