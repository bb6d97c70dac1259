"""``psctl compare`` on a real terminal (a pseudo-terminal): no pager unless asked for (issue
42); a table wider than the terminal shows the columns that fit and names the others; with
``--pager`` or ``PSCTL_PAGER=1`` the whole table goes to the pager at full width."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.psctl.recorded import T0, recorded_run

pytestmark = pytest.mark.timeout(120)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NAMES = ("bsp-run", "asp-run")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pager") / "experiments.db"
    recorded_run(path, "a" * 32, NAMES[0], sync={"model": "bsp"})
    recorded_run(path, "b" * 32, NAMES[1], sync={"model": "asp"}, started_at=T0 + 100)
    return path


def compare_on_a_terminal(db: Path, columns: int, pager_file: Path, *args: str,
                          env: dict[str, str] | None = None) -> str:
    """Run ``psctl compare --all`` with a pseudo-terminal ``columns`` wide as stdin, stdout and
    stderr, and a pager that copies what it is given into ``pager_file``; return the screen."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    clean = {k: v for k, v in os.environ.items()
             if k not in {"MANPAGER", "NO_COLOR", "CI", "PSCTL_PAGER", "COLUMNS"}}
    clean |= {"TERM": "xterm", "PAGER": f"cat > '{pager_file}'", **(env or {})}
    process = subprocess.Popen([sys.executable, "-m", "psctl", "compare", "--all", "--db",
                                str(db), *args], stdin=follower, stdout=follower,
                               stderr=follower, env=clean, cwd=REPO)
    os.close(follower)
    screen = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0, screen.decode(errors="replace")
    return ANSI.sub("", screen.decode(errors="replace"))


def test_a_wide_table_fits_the_terminal_without_a_pager(db: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    screen = compare_on_a_terminal(db, 100, paged)
    assert not paged.exists()
    lines = screen.splitlines()
    assert max(len(line) for line in lines) <= 100, screen
    assert "…" not in screen and all(name in screen for name in NAMES)
    assert "not shown at this width:" in " ".join(screen.split())


@pytest.mark.parametrize(("args", "env"), [(("--pager",), {}), ((), {"PSCTL_PAGER": "1"})])
def test_asked_for_the_pager_gets_every_column(db: Path, tmp_path: Path, args: tuple[str, ...],
                                               env: dict[str, str]) -> None:
    paged = tmp_path / "paged.txt"
    screen = compare_on_a_terminal(db, 100, paged, *args, env=env)
    text = ANSI.sub("", paged.read_text())
    header = next(line for line in text.splitlines() if "┃ run" in line)
    assert len(header) > 100 and "…" not in text and "not shown" not in text
    assert "optimizer.lr" in header and all(name in text for name in NAMES)
    assert "┃ run" not in screen  # the table went to the pager, not onto the screen
