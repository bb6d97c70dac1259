"""Every command's ``--help`` prints each option's and argument's description word for word:
no markup swallows "[default]" or "[cluster]" (issue 13, defect 6)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from psctl.cli import app


# Typer builds on its own copy of click, so groups are told apart by their subcommands.
def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*path, name))
        if hasattr(command, "commands"):
            found.extend(_commands(command, (*path, name)))
    return found


ROOT = typer.main.get_command(app)
COMMANDS = _commands(ROOT)


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _command(path: tuple[str, ...]) -> Any:
    command = ROOT
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_shows_every_description_word_for_word(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200,
                                env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    shown = _words(result.output)
    command = _command(path)
    described = [p for p in command.params if getattr(p, "help", None)]
    for param in described:
        assert _words(param.help) in shown, (param.name, param.help)
    if command.help and not hasattr(command, "commands"):
        assert _words(command.help.split("\f")[0]) in shown


def test_launch_help_keeps_bracketed_words() -> None:
    # The defect as reported: "TOML file with , , , ... sections".
    shown = _words(CliRunner().invoke(app, ["launch", "--help"], terminal_width=200).output)
    assert "TOML file with [cluster], [sync], [train], ... sections" in shown
    assert "RANK:FACTOR[@ONSET]" in shown
    assert len(COMMANDS) >= 10


# What --help must not load: the processes' code (each registry names its implementations
# "module:attribute" and imports them on first use) and torch. bench/startup.py times it.
HEAVY = ("engine.worker", "engine.server", "engine.roles", "torch", "numpy", "sqlalchemy")


@pytest.mark.parametrize("argv", [["--help"], ["launch", "--help"], ["compare", "--help"]])
def test_help_loads_no_worker_server_role_or_torch_module(argv: list[str]) -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom psctl.cli import main\n"
            f"sys.argv = ['psctl', *{argv!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(*sorted(sys.modules), sep='\\n', file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    assert "Usage: psctl" in done.stdout
    loaded = done.stderr.split()
    assert "psctl.cli" in loaded and "engine.config" in loaded  # the list is the real one
    assert [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)] == []


def _completions(words: str) -> list[str]:
    """What bash completes for the command line ``words`` (its last word being typed)."""
    done = CliRunner().invoke(app, [], prog_name="psctl", env={
        "_PSCTL_COMPLETE": "complete_bash", "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1)})
    assert done.exit_code == 0, done.output
    return done.output.split()


def test_choice_options_of_the_reading_commands_complete_their_values() -> None:
    from engine.consistency.timings import PREDICTORS
    from engine.db.queries import STATUSES
    from psctl.export import FORMATS

    assert _completions("psctl export x --format ") == list(FORMATS)
    assert _completions("psctl zipline replay x --predictor ") == list(PREDICTORS)
    assert _completions("psctl runs ls --status ") == list(STATUSES)
    assert _completions("psctl runs ls --status c") == [s for s in STATUSES if s[0] == "c"]
