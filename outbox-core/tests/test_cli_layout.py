"""The `outbox` command's layout (issue 33): each command lives in a module of
``outbox_core.cli.commands``, and a new command is a new module there, with no other file
changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import outbox_core
from outbox_core.cli import main


def test_every_command_lives_in_a_module_of_cli_commands() -> None:
    homes = {name: getattr(each.callback, "__module__", "") for name, each in main.commands.items()}
    assert all(home.startswith("outbox_core.cli.commands.") for home in homes.values()), homes


def test_a_new_module_in_cli_commands_is_a_new_command_with_no_other_file_changed(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "outbox_core"
    shutil.copytree(
        Path(outbox_core.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    (copy / "cli" / "commands" / "greet.py").write_text(
        '"""`outbox greet`."""\n\n'
        "import click\n\n"
        "from ..group import State, command\n\n\n"
        "@command()\n"
        "def greet(state: State) -> None:\n"
        '    """Say hello."""\n'
        '    click.echo("hello from a new module")\n',
        "utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-c", "from outbox_core.cli import main; main()", "greet"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from a new module\n"
    assert "greet" not in main.commands  # the installed package is untouched
