"""README's check-and-test commands are exactly the ones .ci/run runs, and mypy's config agrees."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"Checks and tests \(what `\.ci/run` runs.*?```bash\n(.*?)```", text, re.S)
    assert block, "README lost its 'Checks and tests' block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def _ci_commands() -> list[str]:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "pip install -q -e" in line) + 1
    return [line.strip() for line in lines[start:] if line.strip() and not line.startswith("#")]


def test_readme_and_ci_run_the_same_commands():
    assert _readme_commands() == _ci_commands()
    assert {"ruff check .", "ruff format --check ."} <= set(_ci_commands())


def test_ci_installs_the_dev_extra_with_the_lint_tools():
    ci = (REPO / ".ci" / "run").read_text()
    assert '-e ".[test,dev]"' in ci
    dev = re.search(r"^dev = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert dev and "ruff" in dev.group(1) and "mypy" in dev.group(1)


def test_plain_mypy_checks_untyped_defs():
    text = (REPO / "pyproject.toml").read_text()  # no tomllib: Python 3.10 is supported
    mypy_table = text.split("[tool.mypy]", 1)[1].split("\n[", 1)[0]
    assert re.search(r"^check_untyped_defs = true$", mypy_table, re.M)
