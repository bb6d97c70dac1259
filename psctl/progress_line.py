"""The live view's progress line: a bar with what ends the run (its epochs, its budget or its
time limit), how far it has come and an ETA; laid out for the width it is printed at, so that
on an 80-column terminal the ETA is never wrapped away from its line."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from engine.analysis.cells import fmt_seconds
from engine.budget import Budget
from engine.db.queries import Progress
from psctl.detail_tables import fmt_target

BAR_WIDTH = 30
MIN_BAR_WIDTH = 10
SEPARATOR = "  ·  "


@dataclass(frozen=True)
class Plan:
    """What ends the run, from its config: the progress bar's total and its ETA. Under a
    ``budget`` the workers run as many epochs as it takes (``epochs`` is not used)."""

    workers: int
    servers: int
    epochs: int
    max_seconds: float | None = None
    target_accuracy: float | None = None
    budget: Budget | None = None
    batch_size: int = 0  # samples an iteration of a worker takes: a budget in samples


@dataclass(frozen=True)
class Reach:
    """How far a run has come towards what ends it."""

    fraction: float
    limit: str  # what ends it, and the count so far
    eta_s: float | None  # None without a rate yet: no guess


def progress_line(progress: Progress, plan: Plan, elapsed: float) -> ProgressLine | Text:
    """A bar with the run's total and an ETA once training runs; before, what start-up is
    waiting for."""
    start = progress.startup
    planned = start.planned_iterations if start else None
    if plan.budget is not None and progress.training_started_at is not None:
        reach = _budget_reach(progress, plan.budget, plan.batch_size)
    elif planned is not None:
        reach = _epochs_reach(progress, planned)
    elif progress.status != "running" or start is None:
        return Text("")
    else:
        return Text(f"start-up: {start.servers_listening} of {plan.servers} servers listening, "
                    f"{start.workers_ready} of {plan.workers} workers loaded their data "
                    f"({start.processes_joined} of {plan.workers + plan.servers + 1} processes "
                    "joined)", style="cyan")
    if plan.max_seconds is not None:
        left = max(plan.max_seconds - elapsed, 0.0)
        if reach.eta_s is None or left < reach.eta_s:
            reach = Reach(elapsed / plan.max_seconds, f"time limit {fmt_seconds(plan.max_seconds)}"
                          f" ({reach.limit})", left)
    eta = (f"ETA {fmt_seconds(reach.eta_s)}"
           if progress.status == "running" and reach.eta_s is not None else None)
    target = (f"or at {fmt_target(plan.target_accuracy)} test accuracy"
              if plan.target_accuracy is not None else None)
    return ProgressLine(min(max(reach.fraction, 0.0), 1.0), reach.limit, eta, target)


def _epochs_reach(progress: Progress, planned: int) -> Reach:
    done = progress.total_iterations
    eta = (max(planned - done, 0) / progress.iterations_per_s
           if progress.iterations_per_s > 0 else None)
    return Reach(done / planned, f"{done:,} of {planned:,} iterations", eta)


def _budget_reach(progress: Progress, budget: Budget, batch_size: int) -> Reach:
    """Seconds count from the workers' start, as the coordinator spends them; samples are
    each iteration's batch (a pass's last batch may be smaller: "about")."""
    done, rate = progress.total_iterations, progress.iterations_per_s
    if budget.unit == "s":
        assert progress.training_started_at is not None
        spent = (progress.ended_at or progress.now) - progress.training_started_at
        return Reach(spent / budget.amount, f"budget {fmt_seconds(budget.amount)} of training "
                     f"({done:,} iterations)", max(budget.amount - spent, 0.0))
    per = batch_size if budget.unit == "samples" else 1
    spent = done * per
    eta = max(budget.amount - spent, 0.0) / (rate * per) if rate > 0 and per > 0 else None
    about = "about " if budget.unit == "samples" else ""
    return Reach(spent / budget.amount,
                 f"{about}{spent:,} of {int(budget.amount):,} {budget.unit} (budget)", eta)


class ProgressLine:
    """The bar and its words on one line: on a narrow screen the bar gets shorter, then the
    target goes, then the count is written short; the ETA is the last to be wrapped."""

    def __init__(self, fraction: float, limit: str, eta: str | None,
                 target: str | None) -> None:
        self.fraction, self.limit, self.eta, self.target = fraction, limit, eta, target

    def _words(self, *, target: bool, short: bool) -> str:
        limit = self.limit
        if short:  # "1,009 of 9,400 iterations" -> "1,009/9,400 it."
            limit = limit.replace(" of ", "/").replace(" iterations", " it.")
        parts = [f" {100 * self.fraction:5.1f}%  {limit}", self.eta,
                 self.target if target else None]
        return SEPARATOR.join(p for p in parts if p)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        choices = [self._words(target=True, short=False), self._words(target=False, short=False),
                   self._words(target=False, short=True)]
        words = next((w for w in choices if cell_len(w) + 1 + MIN_BAR_WIDTH <= width),
                     choices[-1])
        bar = min(BAR_WIDTH, width - cell_len(words) - 1)
        if bar < MIN_BAR_WIDTH:  # narrower than any bar: the words alone
            yield Text(words.lstrip())
            return
        line = Table.grid(padding=(0, 1))
        line.add_row(ProgressBar(total=1.0, completed=self.fraction, width=bar), Text(words))
        yield line


class Words:
    """Pieces of text on as few lines as the width allows, a line broken only between
    pieces: a live view is cropped at the screen's edge where it is not a terminal (a pipe, a
    file with COLUMNS set), where rich would neither wrap a line nor show its end."""

    def __init__(self, *pieces: Text) -> None:
        self.pieces = pieces

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text()
        for piece in self.pieces:
            if line.plain and cell_len(line.plain + piece.plain) > options.max_width:
                yield line
                line = Text()
                piece = Text(piece.plain.lstrip(), style=piece.style, spans=piece.spans)
            line.append_text(piece)
        yield line
