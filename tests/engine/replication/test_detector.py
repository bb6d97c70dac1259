"""The accrual failure detector: silence counted in the observer's awake time, suspicion from
the observed gaps (φ), a pause allowed on top, and a ceiling."""

from __future__ import annotations

import math

from engine.replication.detector import CEILING_PAUSES, Detector


def _beating(detector: Detector, rank: int, gaps: list[float], start: float = 0.0) -> float:
    """Ticks every interval and beats at the given gaps; returns the time of the last beat."""
    now = start
    detector.tick(now)
    for seq, gap in enumerate(gaps, start=1):
        steps = round(gap / detector.interval_s)
        for _ in range(steps):
            now += detector.interval_s
            detector.tick(now)
        detector.heard(rank, seq)
    return now


def test_silence_grows_with_the_observers_ticks_and_a_beat_resets_it() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    detector.tick(10.0)
    detector.tick(10.1)
    detector.tick(10.2)
    assert math.isclose(detector.silent_s(0), 0.2)
    assert detector.heard(0, 1)
    assert detector.silent_s(0) == 0.0


def test_the_observers_own_stall_counts_for_nobody() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    detector.tick(0.0)
    detector.tick(3.0)  # the coordinator did not run for 3 s: at most two intervals count
    assert math.isclose(detector.silent_s(0), 0.2)
    assert math.isclose(detector.stalled_s, 2.8)
    assert not detector.suspected(0)


def test_old_and_replayed_beats_and_unwatched_ranks_are_ignored() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    assert detector.heard(0, 5)
    assert not detector.heard(0, 5) and not detector.heard(0, 4)
    assert not detector.heard(7, 1)


def test_no_suspicion_within_the_pause_and_suspicion_past_it_on_a_steady_history() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    now = _beating(detector, 0, [0.1] * 50)
    while detector.silent_s(0) <= 0.5:
        assert not detector.suspected(0)
        now += 0.1
        detector.tick(now)
    # steady 0.1 s gaps: suspected soon after the pause (mean + pause + a few min_std)
    for _ in range(20):
        if detector.suspected(0):
            break
        now += 0.1
        detector.tick(now)
    assert detector.suspected(0)
    assert detector.silent_s(0) < 1.5
    assert detector.phi(0) > detector.threshold


def test_irregular_late_beats_raise_the_silence_it_takes_to_suspect() -> None:
    steady, jittery = Detector(0.5, 0.1), Detector(0.5, 0.1)
    for detector, gaps in ((steady, [0.1] * 60), (jittery, [0.1, 0.1, 0.9] * 20)):
        detector.watch(0)
        now = _beating(detector, 0, gaps)
        detector.tick(now)
        silence = 0.0
        while not detector.suspected(0):
            now += 0.1
            detector.tick(now)
            silence = detector.silent_s(0)
        detector.last = silence  # type: ignore[attr-defined]
    assert jittery.last > steady.last + 0.5  # type: ignore[attr-defined]


def test_a_silence_of_the_ceiling_is_suspected_whatever_the_history() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    now = _beating(detector, 0, [0.1, 4.0] * 30)  # so irregular that φ stays low for long
    assert detector.ceiling_s == CEILING_PAUSES * 0.5
    while detector.silent_s(0) < detector.ceiling_s:
        now += 0.1
        detector.tick(now)
    assert detector.suspected(0)


def test_watching_again_starts_a_fresh_history() -> None:
    detector = Detector(0.5, 0.1)
    detector.watch(0)
    _beating(detector, 0, [0.3] * 10)
    detector.watch(0)  # a server started again: its beats count from 1 again
    assert detector.heard(0, 1)
    assert list(detector.arrivals[0].gaps) == []
