"""A study's load-free runs several at once (issue 41, part 5).

A run in virtual time with every cost given (``engine.backends.load_free``) measures the same
however busy the machine is, so ``psctl study`` runs up to ``--jobs`` of them at once, each in a
process of its own (spawned: no state of this one is shared, and each imports torch itself).
A real run measures the machine, so those still go one at a time, after.

Ctrl-C: every child takes the first SIGINT (the terminal's, or the one this process sends on
its own interrupt) as the run's Ctrl-C, stops its run as ``psctl launch`` does (held until the
run's wait, if it comes while the run starts), and reports; later ones are ignored, so a second
signal cannot cut a run's record short.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from psctl.study_outcomes import Outcome, Planned, Progress

if TYPE_CHECKING:
    from engine.backends import RunHandle
    from engine.launcher import LaunchResult

# How long the parent waits for a message before it looks at its children again; a child that
# died without a word (killed, out of memory) is found within this.
POLL_S = 0.5
# After Ctrl-C, how long each child may take to record its interrupted run: the simulator's
# own wind-down bound (engine.sim.launcher.STOP_WAIT_S) plus room to write and exit.
CHILD_STOP_S = 90.0


@dataclass(frozen=True)
class Report:
    """What a child sends back: its index in the planned list, the run and how it ended."""

    index: int
    run_id: str | None
    status: str
    error: str | None = None


def run_parallel(planned: list[tuple[int, Planned, dict[str, str]]], db: Path, jobs: int,
                 console: Console, progress: Progress, announce: Any) -> None:
    """Each (index, run, tags) in a child process, ``jobs`` at a time; every outcome goes into
    ``progress`` as it arrives and ``announce(index, outcome)`` prints it."""
    context = multiprocessing.get_context("spawn")
    inbox: multiprocessing.Queue[Report] = context.Queue(maxsize=max(1, len(planned)))
    waiting = list(reversed(planned))
    running: dict[int, SpawnProcess] = {}
    try:
        while waiting or running:
            while waiting and len(running) < jobs and not progress.interrupted:
                index, one, tags = waiting.pop()
                child = context.Process(target=_child, args=(
                    index, one.config.to_json_dict(), str(db), tags, inbox), daemon=True,
                    name=f"psctl-study-{index}")
                child.start()
                running[index] = child
            if progress.interrupted and not running:
                break
            _collect(inbox, running, planned, console, progress, announce)
    except KeyboardInterrupt:
        progress.interrupted = True
        _stop(running, inbox, planned, console, progress, announce)


def _collect(inbox: multiprocessing.Queue[Report], running: dict[int, SpawnProcess],
             planned: list[tuple[int, Planned, dict[str, str]]], console: Console,
             progress: Progress, announce: Any) -> None:
    """One message (or none within POLL_S); a child that ended without one is reported."""
    try:
        report = inbox.get(timeout=POLL_S)
    except queue.Empty:
        for index, child in list(running.items()):
            if not child.is_alive():
                child.join()
                del running[index]
                _lost(index, child, planned, console)
        return
    child = running.pop(report.index)
    child.join(timeout=CHILD_STOP_S)
    _accept(report, planned, console, progress, announce)


def _accept(report: Report, planned: list[tuple[int, Planned, dict[str, str]]],
            console: Console, progress: Progress, announce: Any) -> None:
    one = next(p for i, p, _ in planned if i == report.index)
    if report.run_id is None:
        console.print(f"  {one.point.label}: not run: {report.error}", highlight=False,
                      markup=False, soft_wrap=True)
        if report.status == "interrupted":
            progress.interrupted = True
        return
    outcome = Outcome(one, report.run_id, report.status)
    progress.outcomes.append(outcome)
    announce(report.index, outcome)
    if report.status == "interrupted":
        progress.interrupted = True


def _lost(index: int, child: SpawnProcess, planned: list[tuple[int, Planned, dict[str, str]]],
          console: Console) -> None:
    one = next(p for i, p, _ in planned if i == index)
    console.print(f"  {one.point.label}: its process ended without a result (exit code "
                  f"{child.exitcode}); the run, if it started, is in the database as it "
                  "stopped", highlight=False, markup=False, soft_wrap=True)


def _stop(running: dict[int, SpawnProcess], inbox: multiprocessing.Queue[Report],
          planned: list[tuple[int, Planned, dict[str, str]]], console: Console,
          progress: Progress, announce: Any) -> None:
    """Interrupt every running child once and take the reports of their interrupted runs."""
    for child in running.values():
        if child.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGINT)
    for _ in range(len(running)):
        try:
            report = inbox.get(timeout=CHILD_STOP_S)
        except (queue.Empty, KeyboardInterrupt):
            break
        running.pop(report.index).join(timeout=CHILD_STOP_S)
        _accept(report, planned, console, progress, announce)
    for index, child in running.items():
        child.join(timeout=1.0)
        _lost(index, child, planned, console)


class _Interrupt:
    """A child's Ctrl-C, delivered only where the backend stops a run cleanly: inside its
    wait. One that comes earlier (while the run is being built, started or tagged) is held and
    raised at the wait's first tick, so no run is left recorded as running by a child that
    exited mid-start (seen with two CPU hogs beside the study)."""

    def __init__(self) -> None:
        self.armed = False
        self.pending = False

    def handle(self, signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # later signals cannot cut the record short
        if self.armed:
            raise KeyboardInterrupt
        self.pending = True

    def tick(self) -> None:
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


class _Deferring:
    """A backend's run handle whose wait arms the child's interrupt."""

    def __init__(self, inner: RunHandle, interrupt: _Interrupt) -> None:
        self.inner, self.interrupt = inner, interrupt
        self.run_id, self.name, self.db = inner.run_id, inner.name, inner.db

    def start(self) -> None:
        self.inner.start()

    def wait(self, on_tick: Callable[[], None] | None = None,
             tick_s: float = 0.5) -> LaunchResult:
        self.interrupt.armed = True
        return self.inner.wait(on_tick=self.interrupt.tick, tick_s=tick_s)


def _child(index: int, values: dict[str, Any], db: str, tags: dict[str, str],
           outbox: multiprocessing.Queue[Report]) -> None:
    """One run, in a process of its own; its terminal output is dropped (the parent prints
    each run's result line from the database)."""
    interrupt = _Interrupt()
    signal.signal(signal.SIGINT, interrupt.handle)
    outbox.put(_launch(index, values, Path(db), tags, interrupt), timeout=CHILD_STOP_S)


def _launch(index: int, values: dict[str, Any], db: Path, tags: dict[str, str],
            interrupt: _Interrupt) -> Report:
    from engine.backends import BACKENDS
    from engine.config import RunConfig
    from engine.errors import PsctlError
    from psctl.launch import run_launch

    with open(os.devnull, "w") as sink:
        try:
            config = RunConfig.model_validate(values)
            handle = _Deferring(BACKENDS.get(config.cluster.backend)(config, db=db), interrupt)
            result = run_launch(config, db, Console(file=sink, width=120), live=False,
                                tags=tags, launcher=handle)
        except PsctlError as exc:
            return Report(index, None, "failed", str(exc))
    return Report(index, result.run_id, result.status.value)
