"""engine.proctime: a process's start to the hundredth of a second (psutil's is off by up to
a second, from the boot time in whole seconds)."""

from __future__ import annotations

import subprocess
import sys
import time

from engine.proctime import process_started_at


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
