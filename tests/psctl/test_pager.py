"""``psctl compare`` on a real terminal (a pseudo-terminal): a table wider than the terminal
goes to the pager at full width; one that fits is printed in place."""

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
from tests.integration.support import query

pytestmark = pytest.mark.timeout(240)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def compare_on_a_terminal(db: Path, columns: int, pager_file: Path) -> str:
    """Run ``psctl compare --all`` with a pseudo-terminal ``columns`` wide as stdin, stdout and
    stderr, and a pager that copies what it is given into ``pager_file``; return the screen."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in {"MANPAGER", "NO_COLOR", "CI"}}
    env |= {"TERM": "xterm", "COLUMNS": str(columns), "PAGER": f"cat > '{pager_file}'"}
    process = subprocess.Popen([sys.executable, "-m", "psctl", "compare", "--all", "--db", str(db)],
                               stdin=follower, stdout=follower, stderr=follower, env=env, cwd=REPO)
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


def test_a_table_wider_than_the_terminal_is_paged_at_full_width(compare_db: Path,
                                                               tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    screen = compare_on_a_terminal(compare_db, 60, paged)
    text = ANSI.sub("", paged.read_text())
    header = next(line for line in text.splitlines() if "┃ run" in line)
    assert len(header) > 60 and "…" not in text
    for name, _ in query(compare_db, "SELECT name, id FROM runs"):
        assert name in text
    assert "┃ run" not in screen  # the table went to the pager, not onto the screen


def test_a_table_that_fits_is_printed_without_a_pager(compare_db: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    # --all lists every config key (about 60 columns): a terminal this wide holds them all.
    screen = compare_on_a_terminal(compare_db, 4000, paged)
    assert not paged.exists()
    assert "┃ run" in screen and "seed-run" in screen
