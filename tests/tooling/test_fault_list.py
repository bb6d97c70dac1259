"""The deliberate faults of tests/tooling/faults.toml still apply to the current tree, so the
list cannot rot silently when the code it patches moves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.tooling.fault_list import REPO, Fault, FaultError, apply_fault, load_faults, patched_text

FAULTS = load_faults()
AREAS = {"consistency", "server", "worker", "wire", "recorder", "cli", "dashboard-api"}


def test_the_list_has_ten_faults_across_every_area() -> None:
    assert len(FAULTS) >= 10
    assert {f.area for f in FAULTS} >= AREAS


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_each_fault_applies_once_and_changes_the_code(fault: Fault) -> None:
    patched = patched_text(REPO, fault)
    original = (REPO / fault.file).read_text(encoding="utf-8")
    assert patched != original
    assert patched.count(fault.replacement) == original.count(fault.replacement) + 1
    # Product code only, not the tests that should catch it; the run-first files exist.
    assert not fault.file.startswith("tests/")
    assert all((REPO / path).is_file() for path in fault.first), fault.first
    if not (REPO / ".git").exists():  # a copy without git (fault_list.py's own scratch copy)
        return
    # The scratch copy holds tracked files only: an untracked first file would be skipped.
    tracked = subprocess.run(["git", "ls-files", "--", *fault.first], cwd=REPO, text=True,
                             capture_output=True, check=True, timeout=60).stdout.split()
    assert sorted(tracked) == sorted(fault.first)


def test_a_moved_original_is_refused_loudly(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\nx = 1\n", encoding="utf-8")
    twice = Fault("twice", "server", "d", "m.py", "x = 1", "x = 2")
    with pytest.raises(FaultError, match="occurs 2 times"):
        apply_fault(tmp_path, twice)
    gone = Fault("gone", "server", "d", "m.py", "y = 1", "y = 2")
    with pytest.raises(FaultError, match="occurs 0 times"):
        apply_fault(tmp_path, gone)
    assert (tmp_path / "m.py").read_text(encoding="utf-8") == "x = 1\nx = 1\n"


def test_a_fault_is_applied_to_the_copy_given(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1\nb = 2\n", encoding="utf-8")
    apply_fault(tmp_path, Fault("f", "server", "d", "m.py", "b = 2", "b = 3"))
    assert (tmp_path / "m.py").read_text(encoding="utf-8") == "a = 1\nb = 3\n"
