"""How a role process ended, as its launcher saw it, for the coordinator to read.

The coordinator only sees a role's connection close; the launcher, its parent, sees how it ended.
When a role ends in a way a restart will not mend (an exit with an error, a crash that repeated
itself), the launcher writes a note into the run's folder, and the coordinator, waiting for that
role to rejoin, ends the run with the note at once instead of waiting out its rejoin timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

EXITS_FOLDER = "exits"
_NOTE_CHARS = 2000


def signal_name(code: int) -> str:
    """SIGKILL for -9: how a process killed by a signal (a negative return code) ended."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def exit_note_path(folder: Path, role: str, rank: int) -> Path:
    return folder / EXITS_FOLDER / f"{role}-{rank}.json"


def write_exit_note(folder: Path, role: str, rank: int, why: str) -> None:
    """Say why ``role rank`` ended for good (best effort: a full disk loses only the note,
    and the coordinator's rejoin timeout still ends the run)."""
    path = exit_note_path(folder, role, rank)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        partial.write_text(json.dumps({"why": why[:_NOTE_CHARS]}))
        os.replace(partial, path)  # the reader never sees half a note


def read_exit_note(folder: Path, role: str, rank: int, since: float) -> str | None:
    """The note on ``role rank`` written at or after ``since`` (a resumed run's folder keeps
    the notes of its earlier starts), or None."""
    path = exit_note_path(folder, role, rank)
    try:
        if path.stat().st_mtime < since:
            return None
        why = json.loads(path.read_text()).get("why")
    except (OSError, ValueError, AttributeError):
        return None
    return why if isinstance(why, str) and why else None
