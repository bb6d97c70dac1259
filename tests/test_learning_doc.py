"""docs/learning.md's example of a schedule by epoch runs as written, and the database shows
what the document says: the largest applied scale halves from one epoch to the next."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_the_schedule_by_epoch_example(tmp_path: Path) -> None:
    doc = (REPO / "docs" / "learning.md").read_text()
    (line,) = [block.strip() for block in re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
               if "--lr-unit epochs" in block]
    words = shlex.split(line)
    assert words[:2] == ["psctl", "launch"]
    db = tmp_path / "experiments.db"
    done = subprocess.run([sys.executable, "-m", "psctl", *words[1:], "--no-live", "--db",
                           str(db)], capture_output=True, text=True, timeout=200, check=False,
                          cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT epoch, max(lr_scale), min(lr_scale), count(lr_scale), "
                            "count(*) FROM iterations GROUP BY epoch ORDER BY epoch").fetchall()
    assert [row[0] for row in rows] == [0, 1, 2]
    assert [row[1] for row in rows] == pytest.approx([0.5, 0.25, 0.125])
    assert all(count == total for *_, count, total in rows)  # every iteration pushed
    assert all(low > 0 for _, _, low, _, _ in rows)
