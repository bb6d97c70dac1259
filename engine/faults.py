"""Fault injection for research and tests: ``--fault`` specs, parsed and validated up front.

Four kinds, each recorded as a ``fault_injected`` event when it takes effect:

- ``kill:worker:RANK@SECONDS`` / ``kill:server:RANK@SECONDS`` / ``kill:evaluator:0@SECONDS``:
  SIGKILL that role's process that many seconds after training started (the coordinator does
  it: it knows every role's pid).
- ``drop:PERCENT%``: each data-plane frame a worker sends, and each reply it receives, is lost
  with that probability; the worker's client resends unanswered requests by request id and the
  servers discard the duplicates.
- ``delay:MILLISECONDSms``: each data-plane frame a worker sends leaves that much later.

Only the processes of a run on this machine can be killed this way (the local backend).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.config import RunConfig

KILLABLE = ("worker", "server", "evaluator")
_KILL = re.compile(r"kill:(worker|server|evaluator):(\d+)@(\d+(?:\.\d+)?)s?")
_DROP = re.compile(r"drop:(\d+(?:\.\d+)?)%")
_DELAY = re.compile(r"delay:(\d+(?:\.\d+)?)ms")
MAX_DROP_PERCENT = 50.0
MAX_DELAY_MS = 10_000.0
FORMS = ("kill:worker:RANK@SECONDS, kill:server:RANK@SECONDS, kill:evaluator:0@SECONDS, "
         "drop:PERCENT% or delay:MSms")


@dataclass(frozen=True, slots=True)
class Kill:
    role: str
    rank: int
    at_s: float  # seconds after training started

    @property
    def spec(self) -> str:
        return f"kill:{self.role}:{self.rank}@{self.at_s:g}s"


@dataclass(frozen=True, slots=True)
class Drop:
    probability: float  # 0..0.5

    @property
    def spec(self) -> str:
        return f"drop:{self.probability * 100:g}%"


@dataclass(frozen=True, slots=True)
class Delay:
    seconds: float

    @property
    def spec(self) -> str:
        return f"delay:{self.seconds * 1000:g}ms"


Fault = Kill | Drop | Delay


def parse_fault(text: str) -> Fault:
    """One ``--fault`` spec, or a ConfigError naming the accepted forms."""
    spec = text.strip().lower()
    if match := _KILL.fullmatch(spec):
        return Kill(match[1], int(match[2]), float(match[3]))
    if match := _DROP.fullmatch(spec):
        percent = float(match[1])
        if not 0 < percent <= MAX_DROP_PERCENT:
            raise ConfigError(f"fault {text!r}: a drop rate must be in (0, "
                              f"{MAX_DROP_PERCENT:g}] %")
        return Drop(percent / 100)
    if match := _DELAY.fullmatch(spec):
        millis = float(match[1])
        if not 0 < millis <= MAX_DELAY_MS:
            raise ConfigError(f"fault {text!r}: a delay must be in (0, {MAX_DELAY_MS:g}] ms")
        return Delay(millis / 1000)
    raise ConfigError(f"fault {text!r} is not one of {FORMS} (e.g. kill:worker:1@20s, "
                      "drop:1%, delay:5ms)")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Every fault of a run, by kind; at most one drop rate and one delay."""

    kills: tuple[Kill, ...] = ()
    drop: float = 0.0
    delay_s: float = 0.0

    @classmethod
    def of(cls, specs: tuple[str, ...] | list[str]) -> FaultPlan:
        faults = [parse_fault(spec) for spec in specs]
        drops = [f.probability for f in faults if isinstance(f, Drop)]
        delays = [f.seconds for f in faults if isinstance(f, Delay)]
        if len(drops) > 1 or len(delays) > 1:
            raise ConfigError("give at most one drop:PERCENT% and one delay:MSms fault")
        kills = tuple(sorted((f for f in faults if isinstance(f, Kill)), key=lambda k: k.at_s))
        return cls(kills, drops[0] if drops else 0.0, delays[0] if delays else 0.0)

    @property
    def lossy(self) -> bool:
        """Do data-plane messages get lost (so that clients must resend)?"""
        return self.drop > 0


def check_kills(run: RunConfig) -> None:
    """Every injected kill names a process the run has (ValueError when one does not)."""
    counts = {"worker": run.cluster.workers, "server": run.cluster.servers}
    for kill in FaultPlan.of(run.fault.inject).kills:
        if kill.role == "evaluator" and kill.rank != 0:
            raise ValueError(f"fault {kill.spec}: a run has one evaluator, evaluator 0")
        if kill.role != "evaluator" and kill.rank >= counts[kill.role]:
            raise ValueError(f"fault {kill.spec}: there is no {kill.role} {kill.rank} "
                             f"(cluster.{kill.role}s = {counts[kill.role]}; ranks count from 0)")
