"""engine.proctime: a process's start to the hundredth of a second (psutil's is off by up to
a second, from the boot time in whole seconds)."""

from __future__ import annotations

import subprocess
import sys
import time

from engine.proctime import EXEC_REUSE_S, process_started_at


def test_this_process_started_before_now_and_a_fresh_one_just_now() -> None:
    assert process_started_at() < time.time()
    before = time.time()
    printed = subprocess.run(
        [sys.executable, "-c", "from engine.proctime import process_started_at as p; "
                               "print(p())"], capture_output=True, text=True, check=True,
        timeout=60)
    started = float(printed.stdout)
    # Its start lies between this test's clock reading and its own: to 1/100 s (a tick).
    assert before - 0.02 <= started <= time.time()


def test_a_program_exec_d_into_an_older_process_counts_from_its_first_import() -> None:
    """``(sleep 3 && exec python ...)``: the process is the subshell's, 3 s older than the
    program it runs now (as a shell runs a subshell's last command)."""
    printed = subprocess.run(
        ["bash", "-c", f"sleep {EXEC_REUSE_S + 1} && exec {sys.executable} -c 'import time; "
         "t = time.time(); from engine.proctime import program_started_at as p, "
         "process_started_at as q; print(t - q(), t - p(t))'"],
        capture_output=True, text=True, check=True, timeout=60)
    process_age, program_age = map(float, printed.stdout.split())
    assert process_age > EXEC_REUSE_S and program_age == 0.0
