"""What a study plans and what came of it: shared by the serial and the parallel runner."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import RunConfig
from psctl.study import Point


@dataclass(frozen=True)
class Planned:
    point: Point
    config: RunConfig
    seed: int | None  # set when the study repeats each point over several seeds
    tune: int | None = None  # a tuning run: the index of the setting it tries (study_tune)


@dataclass(frozen=True)
class Outcome:
    planned: Planned
    run_id: str
    status: str  # the run's status as the backend reported it at the end


@dataclass
class Progress:
    """What ran so far; filled in as runs end, so that an interrupted study still reports."""

    total: int
    outcomes: list[Outcome]
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return (not self.interrupted and len(self.outcomes) == self.total
                and all(o.status == "finished" for o in self.outcomes))
