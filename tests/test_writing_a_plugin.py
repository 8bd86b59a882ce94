"""docs/writing-a-plugin.md is true: its example plugin, built from the page's own code blocks
into a distribution and installed into a fresh virtual environment beside outbox-core, is
listed, runs one action against a real receiver and passes the adapter conformance suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_core.testing.conformance import checks

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "writing-a-plugin.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
PATH_COMMENT = re.compile(r"^(?:#|--) ((?:src|tests)/\S+)$")


def files_from_page() -> dict[str, str]:
    """{relative path: text} for every block that names its file, plus pyproject.toml."""
    files: dict[str, str] = {}
    for language, body in BLOCK.findall(PAGE.read_text("utf-8")):
        first = body.splitlines()[0] if body else ""
        named = PATH_COMMENT.match(first)
        if named:
            files[named.group(1)] = body
        elif language == "toml" and "[project]" in body:
            files["pyproject.toml"] = body
    return files


def test_the_page_names_every_file_of_the_example() -> None:
    assert set(files_from_page()) == {
        "pyproject.toml",
        "src/outbox_webhook/adapter.py",
        "src/outbox_webhook/enqueue.py",
        "src/outbox_webhook/plugin.py",
        "src/outbox_webhook/migrations/0001_webhook_kind.sql",
        "tests/conftest.py",
        "tests/test_webhook.py",
    }


@pytest.mark.slow
def test_the_example_plugin_builds_installs_runs_one_action_and_conforms(tmp_path: Path) -> None:
    dist = tmp_path / "outbox-webhook"
    for relative, text in files_from_page().items():
        target = dist / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (dist / "src" / "outbox_webhook" / "__init__.py").write_text('"""The example plugin."""\n')
    (dist / "README.md").write_text("# outbox-webhook\n")
    venv = tmp_path / "venv"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            *uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            f"{REPO / 'outbox-core'}[test]",
            f"{dist}[test]",
        ],
        check=True,
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    completed = subprocess.run(
        [str(python), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
        cwd=dist,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # The four tests of the page and every test of the conformance suite, none failed or
    # skipped.
    assert f"{4 + len(checks.CHECKS)} passed" in completed.stdout, completed.stdout
