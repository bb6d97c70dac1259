"""The coordinator's verdicts on a suspected server: fence the gone, stopped and blocked, wait
for the working, never fence the last copy; beats travel over real UDP, signed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from engine.replication.detector import Detector
from engine.roles.beating import BeatSender, beat_target
from engine.roles.liveness import ServerWatch, open_receiver
from engine.roles.probe import Look, State, look
from engine.wire import beats


class _Probe:
    def __init__(self, *states: State) -> None:
        self.states = list(states)
        self.calls = 0

    def __call__(self, pid: int, cpu_before: float | None) -> Look:
        self.calls += 1
        return Look(self.states.pop(0) if len(self.states) > 1 else self.states[0],
                    float(self.calls))


def _silent(watch: ServerWatch, rank: int, seconds: float) -> None:
    """Server ``rank`` beat steadily, then said nothing for ``seconds``."""
    detector = watch.detector
    watch.watch(rank)
    now = 0.0
    detector.tick(now)
    for seq in range(1, 30):
        now += detector.interval_s
        detector.tick(now)
        detector.heard(rank, seq)
    for _ in range(round(seconds / detector.interval_s)):
        now += detector.interval_s
        detector.tick(now)


def _watch(*states: State, stall_s: float = 60.0) -> tuple[ServerWatch, _Probe]:
    probe = _Probe(*states)
    return ServerWatch(Detector(0.5, 0.1), stall_s, probe=probe), probe


def test_a_server_that_beats_is_left_alone_and_its_process_not_even_looked_at() -> None:
    watch, probe = _watch(State.STOPPED)
    _silent(watch, 0, 0.3)
    assert watch.judge(0, 42, ours=True, last_copy=False).action == "ok"
    assert probe.calls == 0


@pytest.mark.parametrize("state", [State.STOPPED, State.GONE])
def test_a_suspect_whose_process_is_stopped_or_gone_is_fenced(state: State) -> None:
    watch, _ = _watch(state)
    _silent(watch, 0, 2.0)
    verdict = watch.judge(0, 42, ours=True, last_copy=False)
    assert verdict.action == "fence" and state.value in verdict.reason


def test_a_suspect_whose_process_works_is_waited_for_and_said_slow_once() -> None:
    watch, _ = _watch(State.WORKING)
    _silent(watch, 0, 2.0)
    first = watch.judge(0, 42, ours=True, last_copy=False)
    assert first.action == "slow" and "waiting for it" in first.reason
    assert watch.judge(0, 42, ours=True, last_copy=False).action == "ok"


def test_a_working_process_silent_for_the_stall_bound_is_fenced() -> None:
    watch, _ = _watch(State.WORKING, stall_s=3.0)
    _silent(watch, 0, 3.2)
    verdict = watch.judge(0, 42, ours=True, last_copy=False)
    assert verdict.action == "fence" and "though its process works" in verdict.reason


def test_a_blocked_process_is_fenced_once_it_stays_idle_for_the_pause() -> None:
    watch, _ = _watch(State.IDLE)
    _silent(watch, 0, 2.0)
    assert watch.judge(0, 42, ours=True, last_copy=False).action == "ok"  # first seen asleep
    detector = watch.detector
    now = 100.0
    detector.tick(now)
    for _ in range(5):
        now += 0.1
        detector.tick(now)
    verdict = watch.judge(0, 42, ours=True, last_copy=False)
    assert verdict.action == "fence" and "sleeps" in verdict.reason


def test_the_last_copy_is_never_fenced_and_the_wait_is_said_once() -> None:
    watch, _ = _watch(State.STOPPED)
    _silent(watch, 0, 2.0)
    assert watch.judge(0, 42, ours=True, last_copy=True).action == "withheld"
    assert watch.judge(0, 42, ours=True, last_copy=True).action == "ok"
    assert watch.judge(0, 42, ours=True, last_copy=False).action == "fence"  # a copy came back


def test_a_remote_suspect_is_fenced_without_asking_this_machines_system() -> None:
    watch, probe = _watch(State.WORKING)
    _silent(watch, 0, 2.0)
    assert watch.judge(0, 42, ours=False, last_copy=False).action == "fence"
    assert probe.calls == 0


def test_a_beat_reporting_a_stuck_loop_is_fenced_although_the_process_beats() -> None:
    watch, _ = _watch(State.WORKING, stall_s=5.0)
    watch.watch(0)
    watch.detector.heard(0, 1, loop_lag_s=6.0)
    verdict = watch.judge(0, 42, ours=True, last_copy=False)
    assert verdict.action == "fence" and "event loop has not turned" in verdict.reason


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_operating_system_tells_stopped_working_idle_and_gone_apart() -> None:
    sleeper = _child("import time; time.sleep(60)")
    spinner = _child("import time\nend = time.time() + 60\nwhile time.time() < end: pass")
    try:
        time.sleep(0.5)
        first = look(sleeper.pid, None)
        time.sleep(0.3)
        assert look(sleeper.pid, first.cpu_s).state is State.IDLE
        assert look(spinner.pid, None).state is State.WORKING
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while look(sleeper.pid, None).state is not State.STOPPED:
            assert time.monotonic() < deadline, "SIGSTOP never showed"
            time.sleep(0.05)
    finally:
        for child in (sleeper, spinner):
            child.kill()
            child.wait(timeout=10)
    assert look(sleeper.pid, None).state is State.GONE


def test_beats_cross_real_udp_signed_and_the_loop_lag_shows_a_blocked_loop() -> None:
    async def main() -> tuple[list[beats.Beat], int]:
        got: list[beats.Beat] = []
        transport, receiver, port = await open_receiver("127.0.0.1", "tok", got.append)
        sender = BeatSender(beat_target(f"ws://127.0.0.1:{port + 0}", port), 3, "tok", 0.05,
                            asyncio.get_running_loop())
        try:
            sender.start()
            await asyncio.sleep(0.3)
            time.sleep(0.6)  # the loop is blocked: the thread beats on, and says so
            await asyncio.sleep(0.2)
            stranger = BeatSender(("127.0.0.1", port), 3, "not the token", 0.05,
                                  asyncio.get_running_loop())
            stranger.start()
            await asyncio.sleep(0.2)
            stranger.stop()
        finally:
            sender.stop()
            transport.close()
        return got, receiver.refused

    got, refused = asyncio.run(main())
    assert len(got) >= 8 and {b.rank for b in got} == {3}
    assert [b.seq for b in got] == sorted(b.seq for b in got)
    assert max(b.loop_lag_s for b in got) >= 0.3
    assert refused >= 1
