"""One invocation of ``psctl study``: its tuning rounds (``[tune]``), then its main runs, then
the report. ``--resume`` keeps the runs of the invocation that finished (found by name among
those tagged with its study id); ``--report`` runs nothing and finds them all."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from psctl.cliutil import err
from psctl.study import Point, Study
from psctl.study_outcomes import Outcome, Planned, Progress
from psctl.study_rows import Row
from psctl.study_variant import Variant

if TYPE_CHECKING:
    from psctl.study_report import Wall
    from psctl.study_tune import Tuned


@dataclass
class Tally:
    ran: int = 0
    kept: int = 0


class Invocation:
    def __init__(self, study: Study, file: Path, db: Path, study_id: str, *, smoke: bool,
                 data_dir: Path | None, jobs: int, resume: bool,
                 run_nothing: bool = False, how: Variant | None = None) -> None:
        self.study, self.file, self.db, self.study_id = study, file, db, study_id
        self.how = how or Variant()
        self.smoke, self.data_dir, self.jobs = smoke, data_dir, jobs
        self.resume, self.run_nothing = resume, run_nothing
        self.tally = Tally()
        self._started = time.monotonic()

    def run(self, points: list[Point], out: Path | None) -> Progress:
        """Tune (when the study has [tune]), run the main runs, write the report."""
        from psctl.study_run import plan
        from psctl.study_tune import tune, tuned_points

        tunings: list[Tuned] | None = None
        if self.study.spec.tune is not None:
            tunings, stopped = tune(self.study, points, self.runs, smoke=self.smoke,
                                    jobs=self.jobs)
            if stopped:
                progress = Progress(total=len(plan(self.study, points)), outcomes=[],
                                    interrupted=True)
                self._report(out, progress, [], tunings)
                return progress
            points = tuned_points(tunings)
        progress, rows = self.runs(plan(self.study, points, self.data_dir))
        self._report(out, progress, rows, tunings)
        return progress

    def runs(self, planned: list[Planned]) -> tuple[Progress, list[Row]]:
        """``planned``'s outcomes in their order (each run, or the invocation's finished one
        when resuming) and their report rows."""
        from psctl.study_report import collect
        from psctl.study_run import pinned, run_grid

        planned = pinned(planned, self.data_dir)
        if self.run_nothing:
            found = _recorded(self.db, self.study_id, planned)
            progress = Progress(total=len(planned), outcomes=found,
                                interrupted=len(found) < len(planned))
            return progress, collect(self.db, progress, self.study.spec.study.target)
        kept = ([o for o in _recorded(self.db, self.study_id, planned) if o.status == "finished"]
                if self.resume else [])
        if kept:
            err.print(f"study {self.study.name}: {len(kept)} finished before, kept (of "
                      f"{len(planned)} runs)", highlight=False, markup=False)
        done = {id(o.planned) for o in kept}
        ran = run_grid(self.study, [p for p in planned if id(p) not in done], self.db, err,
                       study_id=self.study_id, smoke=self.smoke, jobs=self.jobs)
        self.tally.ran += len(ran.outcomes)
        self.tally.kept += len(kept)
        order = {id(p): i for i, p in enumerate(planned)}
        outcomes = sorted([*kept, *ran.outcomes], key=lambda o: order[id(o.planned)])
        progress = Progress(total=len(planned), outcomes=outcomes, interrupted=ran.interrupted)
        return progress, collect(self.db, progress, self.study.spec.study.target)

    def _report(self, out: Path | None, progress: Progress, rows: list[Row],
                tunings: list[Tuned] | None) -> None:
        from psctl.study_report import Header, Wall, write_report

        folder = out or self.file.parent / "results" / (
            self.how.folder(self.study.name) + ("-smoke" if self.smoke else ""))
        command = " ".join(["psctl", "study", shlex.quote(str(self.file)),
                            *(["--smoke"] if self.smoke else []),
                            *(shlex.quote(word) for word in self.how.options())])
        wall = _earlier_wall(folder, self.study_id) if self.run_nothing else Wall(
            seconds=time.monotonic() - self._started, jobs=self.jobs, ran=self.tally.ran,
            kept=self.tally.kept)
        path = write_report(folder, self.study, progress, rows,
                            Header(command=command, study_id=self.study_id, smoke=self.smoke,
                                   wall=wall), tunings=tunings)
        err.print(f"report: {path} ({len(progress.outcomes)} of {progress.total} runs)",
                  highlight=False, markup=False)


def _earlier_wall(folder: Path, study_id: str) -> Wall | None:
    """The wall time the report being rewritten gave for the same invocation, if any: a report
    written again (--report) runs nothing, so it cannot measure one."""
    from psctl.study_report import Wall

    try:
        earlier = json.loads((folder / "summary.json").read_text())
        found = earlier["wall"] if earlier.get("study_id") == study_id else None
        return None if found is None else Wall(**found)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _recorded(db: Path, study_id: str, planned: list[Planned]) -> list[Outcome]:
    """The planned runs recorded in invocation ``study_id`` (found by their names), in the
    order given; a UsageError if it recorded none."""
    from engine.analysis.selection import UsageError
    from engine.db import open_engine
    from engine.db.queries import tagged_runs

    engine = open_engine(db, readonly=True)
    try:
        recorded = tagged_runs(engine, "study_id", study_id)
    finally:
        engine.dispose()
    if not recorded:
        raise UsageError(f"no run in {db} is tagged study_id={study_id}; the id is printed "
                         "when a study starts and is in its report")
    found = [(one, recorded.get(one.config.name or "")) for one in planned]
    return [Outcome(one, *hit) for one, hit in found if hit is not None]

