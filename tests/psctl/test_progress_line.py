"""The live view's progress line on a narrow terminal, and under a budget (issue 57, item 9):
the ETA stays on its line at 80 columns past 999 iterations, and a budget run's bar counts its
budget, its epochs without the --epochs it does not use."""

from __future__ import annotations

from rich.console import Console

from engine.budget import parse_budget
from engine.db.queries import Progress, Startup, WorkerProgress
from psctl.display import progress_view
from psctl.progress_line import Plan, progress_line

T0 = 1_700_000_000.0
PLAN = Plan(workers=2, servers=1, epochs=10)


def _progress(*, done: int, rate: float, elapsed: float, planned: int | None,
              training_at: float | None = None, epoch: int = 0,
              loss: float | None = 0.5) -> Progress:
    workers = tuple(WorkerProgress(worker=w, iteration=done // 2, epoch=epoch, staleness=0,
                                   loss=loss, ended_at=T0 + elapsed, iterations_per_s=rate / 2)
                    for w in range(2))
    return Progress(run_id="r" * 32, name="live", status="running", now=T0 + elapsed,
                    started_at=T0, ended_at=None, heartbeat_at=T0 + elapsed,
                    total_iterations=done, iterations_per_s=rate, workers=workers,
                    latest_evaluation=None, best_accuracy=None,
                    startup=Startup(4, 1, 2, planned), training_started_at=training_at)


def _lines(renderable: object, width: int) -> list[str]:
    console = Console(width=width, no_color=True, record=True)
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_at_80_columns_the_eta_stays_on_the_line_past_999_iterations() -> None:
    progress = _progress(done=1009, rate=12.0, elapsed=90, planned=9400)
    for plan in (PLAN, Plan(workers=2, servers=1, epochs=10, target_accuracy=0.97)):
        [line] = _lines(progress_line(progress, plan, 90.0), 80)
        assert line.endswith("10.7%  1,009 of 9,400 iterations  ·  ETA 0:11:39"), line
    wide = _lines(progress_line(progress, Plan(2, 1, 10, target_accuracy=0.97), 90.0), 160)
    assert wide[0].endswith("ETA 0:11:39  ·  or at 97 % test accuracy")  # room: all said


def test_narrower_still_the_count_is_written_short_and_the_eta_kept() -> None:
    progress = _progress(done=123_456, rate=12.0, elapsed=90, planned=987_654)
    [line] = _lines(progress_line(progress, PLAN, 90.0), 64)
    assert line.endswith("12.5%  123,456/987,654 it.  ·  ETA 20:00:16"), line
    assert _lines(progress_line(progress, PLAN, 90.0), 40)[0].startswith("12.5%")


def test_a_budget_in_seconds_is_the_bar_and_the_epoch_has_no_planned_count() -> None:
    plan = Plan(workers=2, servers=1, epochs=10, budget=parse_budget("60s"))
    progress = _progress(done=2080, rate=70.0, elapsed=33, planned=None, training_at=T0 + 3,
                         epoch=103)
    text = " ".join(" ".join(_lines(progress_view(progress, plan), 120)).split())
    assert "50.0% budget 0:01:00 of training (2,080 iterations) · ETA 0:00:30" in text, text
    assert " 104 " in text and "/10" not in text and "start-up" not in text


def test_a_budget_in_updates_or_samples_counts_them() -> None:
    progress = _progress(done=500, rate=50.0, elapsed=20, planned=None, training_at=T0 + 2)
    updates = Plan(workers=2, servers=1, epochs=10, budget=parse_budget("2000updates"))
    assert _lines(progress_line(progress, updates, 20.0), 120)[0].endswith(
        "25.0%  500 of 2,000 updates (budget)  ·  ETA 0:00:30")
    samples = Plan(workers=2, servers=1, epochs=10, budget=parse_budget("64000samples"),
                   batch_size=64)
    assert _lines(progress_line(progress, samples, 20.0), 120)[0].endswith(
        "50.0%  about 32,000 of 64,000 samples (budget)  ·  ETA 0:00:10")


def test_a_diverging_loss_is_written_in_four_significant_digits() -> None:
    progress = _progress(done=10, rate=1.0, elapsed=5, planned=100, loss=4.5678e17)
    text = " ".join(_lines(progress_view(progress, PLAN), 120))
    assert "4.568e+17" in text and "456780000000000000" not in text


def test_the_head_breaks_between_its_pieces_where_a_line_would_be_cropped() -> None:
    """Off a terminal (a pipe, a file with COLUMNS set) psctl's console does not wrap, and the
    live view crops each line at the width: the head is laid out in lines that fit."""
    import io

    from rich.live import Live

    from psctl.cliutil import Screen

    progress = _progress(done=1009, rate=12.0, elapsed=90, planned=9400)
    progress = Progress(**{**progress.__dict__, "name": "bsp-w2s1-digits-20261207-203958",
                           "startup_s": 4.0})
    sink = io.StringIO()
    with Live(console=Screen(file=sink, width=80)) as live:
        live.update(progress_view(progress, PLAN))
    lines = sink.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].rstrip().endswith("elapsed 0:01:30 (start-up 4.0 s)")
    assert lines[1].startswith("12.0 it/s   test accuracy - (best -)")
    assert lines[2].endswith("ETA 0:11:39")
