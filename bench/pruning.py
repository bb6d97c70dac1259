"""Gradient pruning on the workers (seed 002's experiments), with and without error feedback.

Each configuration trains the MNIST MLP on real server and worker processes, as ``psctl launch``
does: asp, 4 workers, 2 shard servers, batch 64, evaluation every 2 s, for a fixed time budget.
The push filters are seed 002's: none (dense, the baseline); top-k 10 %, 1 % and 0.1 % of each
layer (``--prune topk:P%``); |g| > K sigma for K = 1, 2, 3 (``--prune sigma:K``); and the dynamic
threshold (``--prune dynamic``). Each filter runs with error feedback (what a push leaves out joins
the next one; the default) and without (``--no-error-feedback``); ``none`` runs once.

Measured per run, from the database: push bytes per iteration (the mean of ``push_bytes`` over
the iterations that pushed), the push reduction against dense frames (sum of
``push_bytes_dense`` over sum of ``push_bytes``), time to the target accuracy from the run's start
(the first evaluation at or above it), best test accuracy within the budget, and iterations done.
Each evaluation is stored with the iterations finished by then, and the last pass is plotted:
``docs/pruning-accuracy-iterations.png`` (test accuracy against the workers' iterations) and
``docs/pruning-accuracy-time.png`` (against seconds since the start). Passes alternate the order
of the configurations, so a drift in the machine's load does not favour the same one.

Reproduce: ``python bench/pruning.py [--order reverse] [--append]`` (about 25 minutes a pass at
the default 90 s budget); ``--quick`` runs a tiny digits version (docs untouched); ``--redraw``
rewrites the docs section and the plots from ``bench/results/pruning.json``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

NAME = "pruning"
DOCS_TITLE = "Gradient pruning on the workers (MNIST, asynchronous; issue 15, acceptance 3)"
BASELINE = "none"
# Seed 002's push filters, in the order of the tables and plots (``--prune`` specs).
RULES = ("none", "topk:10%", "topk:1%", "topk:0.1%", "sigma:1", "sigma:2", "sigma:3", "dynamic")
# One colour per filter (black for dense, then matplotlib's tab10): error feedback on is drawn
# solid, off dashed, in the same colour.
COLOURS = {"none": "#000000", "topk:10%": "#1f77b4", "topk:1%": "#ff7f0e",
           "topk:0.1%": "#2ca02c", "sigma:1": "#d62728", "sigma:2": "#9467bd",
           "sigma:3": "#8c564b", "dynamic": "#e377c2"}
PLOTS = {"iterations": C.DOCS.parent / "pruning-accuracy-iterations.png",
         "seconds": C.DOCS.parent / "pruning-accuracy-time.png"}


def config_label(prune: str, error_feedback: bool) -> str:
    if prune == BASELINE:
        return BASELINE
    return f"{prune} {'with' if error_feedback else 'without'} EF"


CONFIGS: dict[str, dict[str, Any]] = {
    config_label(prune, ef): {"comm.prune": prune, "comm.error_feedback": ef}
    for prune in RULES for ef in ((True,) if prune == BASELINE else (True, False))
}


# -- measuring one run --------------------------------------------------------------------------


def measure(db: Path, run_id: str, target: float) -> dict[str, Any]:
    """What the table and the plots need from one run's rows in the database."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        count, pushed, push_bytes, dense_bytes, sent, received, samples = conn.execute(
            "SELECT count(*), sum(push_bytes > 0), sum(push_bytes), sum(push_bytes_dense), "
            "sum(bytes_sent), sum(bytes_received), sum(samples) FROM iterations "
            "WHERE run_id = ?", (run_id,)).fetchone()
        ended = [t for (t,) in conn.execute(
            "SELECT ended_at FROM iterations WHERE run_id = ? ORDER BY ended_at", (run_id,))]
        found = conn.execute("SELECT reason FROM runs WHERE id = ?", (run_id,)).fetchone()
        evaluations = conn.execute(
            "SELECT at, elapsed_s, accuracy FROM evaluations WHERE run_id = ? ORDER BY at, id",
            (run_id,)).fetchall()
    # (seconds since the start, iterations finished by then over all workers, test accuracy)
    curve = [[elapsed, bisect.bisect_right(ended, at), accuracy]
             for at, elapsed, accuracy in evaluations]
    reached = next((t for t, _, acc in curve if acc >= target), None)
    return {
        "reason": found[0] if found else None,
        "time_to_target_s": reached,
        "best_accuracy": max((acc for _, _, acc in curve), default=None),
        "final_accuracy": curve[-1][2] if curve else None,
        "iterations": int(count),
        "samples": int(samples or 0),
        "push_bytes_per_iteration": push_bytes / pushed if pushed else None,
        "push_reduction": dense_bytes / push_bytes if push_bytes else None,
        "push_bytes": int(push_bytes or 0),
        "push_bytes_dense": int(dense_bytes or 0),
        "bytes_sent": int(sent or 0),
        "bytes_received": int(received or 0),
        "curve": curve,
    }


def run_config(label: str, overrides: dict[str, Any], args: argparse.Namespace,
               db: Path) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    values = {
        "cluster.workers": 4, "cluster.servers": 2, "sync.model": "asp",
        "data.dataset": args.dataset, "data.data_dir": args.data_dir, "train.epochs": 100,
        "train.batch_size": 64, "eval.interval_s": 2.0, "stop.max_seconds": args.budget_s,
        "name": f"bench-prune-{label}", **overrides}
    config = build_config({}, values)
    row: dict[str, Any] = {"config": label, "prune": config.comm.prune,
                           "error_feedback": config.comm.error_feedback,
                           "loadavg_at_start": os.getloadavg()[0]}
    launcher = Launcher(config, db=db)
    row["run_id"] = launcher.run_id
    try:
        launcher.start()
        row["status"] = launcher.wait().status.value
    except Exception as exc:  # one broken configuration must not lose the whole pass
        row["status"] = f"error: {type(exc).__name__}"
        row["error"] = str(exc)
    try:
        row.update(measure(db, launcher.run_id, args.target))
    except sqlite3.Error as exc:
        row.update(measure_failed(str(exc)))
    return row


def measure_failed(reason: str) -> dict[str, Any]:
    return {"reason": None, "time_to_target_s": None, "best_accuracy": None, "final_accuracy": None,
            "iterations": 0, "samples": 0, "push_bytes_per_iteration": None,
            "push_reduction": None, "push_bytes": 0, "push_bytes_dense": 0, "bytes_sent": 0,
            "bytes_received": 0, "curve": [], "measure_error": reason}


# -- tables and the verdict ---------------------------------------------------------------------


def _ef(row: dict[str, Any]) -> str:
    if row["prune"] == BASELINE:
        return "(dense)"
    return "on" if row["error_feedback"] else "off"


def _order(row: dict[str, Any]) -> tuple[int, bool]:
    rule = RULES.index(row["prune"]) if row["prune"] in RULES else len(RULES)
    return rule, not row["error_feedback"]


def table(rows: list[dict[str, Any]], target: float, budget_s: float) -> list[str]:
    lines = [f"| push filter | error feedback | status | push KB/iteration | push reduction "
             f"vs dense | time to {target:.0%} | best accuracy in {budget_s:.0f} s | "
             "iterations | load average at its start |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in sorted(rows, key=_order):
        per_it = row["push_bytes_per_iteration"]
        reduction = row["push_reduction"]
        reached = row["time_to_target_s"]
        best = row["best_accuracy"]
        load = row.get("loadavg_at_start")
        lines.append(
            f"| {row['prune']} | {_ef(row)} | {row['status']} | "
            f"{'' if per_it is None else f'{per_it / 1e3:,.1f}'} | "
            f"{'' if reduction is None else f'{reduction:,.1f}x'} | "
            f"{'not reached' if reached is None else f'{reached:.1f} s'} | "
            f"{'' if best is None else f'{best:.2%}'} | {row['iterations']} | "
            f"{'' if load is None else f'{load:.1f}'} |")
    return lines


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def verdict(passes: list[dict[str, Any]], target: float) -> str:
    """What held across the passes, from the measured rows only."""
    labels = [c for c in CONFIGS if any(r["config"] == c for p in passes for r in p["results"])]

    def rows_of(label: str) -> list[dict[str, Any]]:
        return [r for p in passes for r in p["results"] if r["config"] == label]

    every = [c for c in labels if all(r["time_to_target_s"] is not None for r in rows_of(c))]
    never = [c for c in labels if all(r["time_to_target_s"] is None for r in rows_of(c))]
    failed = [f"{r['config']} ({r['status']}: {r.get('reason') or r.get('error') or '?'})"
              for c in labels for r in rows_of(c) if r["status"] != "finished"]
    count = f"{len(passes)} pass{'es' if len(passes) != 1 else ''}"
    parts = [f"Over {count}: reached {target:.0%} within the budget every time: "
             + grouped(every) + "; never: " + grouped(never) + "."]
    reductions = []
    for prune in RULES[1:]:
        found = [(ef, _median([r["push_reduction"] for r in rows_of(config_label(prune, ef))]))
                 for ef in (True, False)]
        shown = [f"{value:,.1f}x {'with' if ef else 'without'}" for ef, value in found
                 if value is not None]
        if len(shown) == 2 and shown[0].split()[0] == shown[1].split()[0]:
            shown = [shown[0].split()[0] + " either way"]
        if shown:
            reductions.append(f"{prune} {' / '.join(shown)}")
    if reductions:
        parts.append("Push bytes against dense frames (median over passes), with / without "
                     "error feedback: " + "; ".join(reductions) + ".")
    parts.append(_feedback_sentence(passes, target))
    if failed:
        parts.append("Runs that did not finish cleanly: " + ", ".join(failed) + ".")
    return " ".join(p for p in parts if p)


def grouped(labels: Sequence[str]) -> str:
    """Configuration labels by filter: "topk:1% (with and without EF), sigma:3 (without EF)"."""
    out = []
    for prune in RULES:
        ways = [ef for ef in (True, False) if config_label(prune, ef) in labels]
        if prune == BASELINE:
            out += [BASELINE] if ways else []
        elif ways:
            how = ("with and without" if len(ways) == 2 else "with" if ways[0] else "without")
            out.append(f"{prune} ({how} EF)")
    return ", ".join(out) or "none"


def _feedback_sentence(passes: list[dict[str, Any]], target: float) -> str:
    """Error feedback on against off, filter by filter within each pass."""
    higher = lower = pairs = 0
    only_on: dict[str, list[int]] = {}
    only_off: dict[str, list[int]] = {}
    for number, one in enumerate(passes, start=1):
        found = {(r["prune"], r["error_feedback"]): r for r in one["results"]}
        for prune in RULES[1:]:
            on, off = found.get((prune, True)), found.get((prune, False))
            if on is None or off is None:
                continue
            if on["best_accuracy"] is not None and off["best_accuracy"] is not None:
                pairs += 1
                higher += on["best_accuracy"] > off["best_accuracy"]
                lower += on["best_accuracy"] < off["best_accuracy"]
            if on["time_to_target_s"] is not None and off["time_to_target_s"] is None:
                only_on.setdefault(prune, []).append(number)
            if off["time_to_target_s"] is not None and on["time_to_target_s"] is None:
                only_off.setdefault(prune, []).append(number)
    if not pairs:
        return ""
    text = (f"Error feedback (EF) gave the higher best accuracy in {higher} of {pairs} "
            f"(filter, pass) pairs, the lower in {lower}")
    if only_on:
        text += f"; {target:.0%} was reached only with it by " + _in_passes(only_on, passes)
    if only_off:
        text += f"; {target:.0%} was reached only without it by " + _in_passes(only_off, passes)
    return text + "."


def _in_passes(found: dict[str, list[int]], passes: Sequence[Any]) -> str:
    """ "topk:1% (passes 1 and 2), sigma:3 (pass 2)"; no pass numbers for a single pass."""
    if len(passes) == 1:
        return ", ".join(sorted(found, key=RULES.index))
    named = []
    for prune, numbers in sorted(found.items(), key=lambda item: RULES.index(item[0])):
        which = " and ".join(str(n) for n in numbers)
        named.append(f"{prune} (pass{'es' if len(numbers) > 1 else ''} {which})")
    return ", ".join(named)


# -- plots --------------------------------------------------------------------------------------


def plot_series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per run with evaluations: label, colour, dash, and its x and y values."""
    series = []
    for row in sorted(rows, key=_order):
        if not row.get("curve"):
            continue
        seconds, iterations, accuracy = (list(v) for v in zip(*row["curve"], strict=True))
        series.append({
            "label": row["config"] if row["status"] == "finished"
            else f"{row['config']} ({row['status']})",
            "colour": COLOURS.get(row["prune"], "#7f7f7f"),
            "dashed": row["prune"] != BASELINE and not row["error_feedback"],
            "thick": row["prune"] == BASELINE,
            "seconds": seconds, "iterations": iterations, "accuracy": accuracy})
    return series


def write_plots(rows: list[dict[str, Any]], target: float, title: str,
                paths: dict[str, Path] | None = None) -> list[Path]:
    """The two PNGs of the last pass; none (with a message) where matplotlib is missing."""
    paths = PLOTS if paths is None else paths
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator
    except ImportError:
        print("matplotlib is not installed: the plots were not drawn", file=sys.stderr)
        return []
    series = plot_series(rows)
    if not series:
        return []
    lowest = min(min(s["accuracy"]) for s in series)
    bottom = 0.5 if lowest >= 0.5 else 0.1
    ticks = [t for t in (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99) if t >= bottom]
    axis_names = {"iterations": "iterations done (all workers together)",
                  "seconds": "seconds since the run started"}
    written = []
    for x, path in paths.items():
        fig, ax = plt.subplots(figsize=(11, 6.5))
        for s in series:
            ax.plot(s[x], s["accuracy"], color=s["colour"], linestyle="--" if s["dashed"] else "-",
                    linewidth=2.4 if s["thick"] else 1.6, label=s["label"])
        ax.axhline(target, color="#555555", linestyle=":", linewidth=1.2,
                   label=f"target {target:.0%}")
        # A logit axis spreads out the top (90 %, 97 %, 99 %) and still shows runs far below.
        ax.set_yscale("logit")
        ax.set_ylim(bottom, 0.995)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0%}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(left=0)
        ax.set_xlabel(axis_names.get(x, x))
        ax.set_ylabel("test accuracy (logit scale)")
        ax.set_title(title, fontsize=11)
        ax.grid(True, color="#dddddd", linewidth=0.8)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False,
                  title="push filter (EF: error feedback)", title_fontsize=9)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


# -- main ---------------------------------------------------------------------------------------


def _default_data_dir() -> str | None:
    """The shared MNIST files beside the checkout; else None: psctl then looks in
    $PSCTL_DATA_DIR, the user cache, then downloads (docs/datasets.md)."""
    shared = REPO.parent / "shared" / "data" / "mnist"
    if "PSCTL_DATA_DIR" not in os.environ and shared.is_dir():
        return str(shared)
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data-dir", default=_default_data_dir(),
                        help="the MNIST files (default: ../shared/data/mnist, or where "
                        "$PSCTL_DATA_DIR points when it is set)")
    parser.add_argument("--target", type=float, default=0.97)
    C.add_config_arguments(parser, NAME, budget_s=90.0,
                           redraws="the docs section and the plots")
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.target, args.budget_s, args.data_dir = 0.9, min(args.budget_s, 25.0), None
    if args.redraw:
        passes = C.earlier_passes(NAME)
        if not passes:
            raise SystemExit(f"no passes in bench/results/{NAME}.json")
        _publish(passes, args)
        return {"passes": passes}
    chosen = [c for c in CONFIGS if not args.only or c in args.only]
    if args.only and len(chosen) != len(args.only):
        raise SystemExit(f"--only takes one of: {', '.join(CONFIGS)}")
    db = args.db or Path(f"/tmp/psctl-bench-{NAME}-{int(time.time())}.db")
    labels = chosen if args.order == "forward" else list(reversed(chosen))
    info = C.machine_info()
    rows = []
    for number, label in enumerate(labels, start=1):
        rows.append(run_config(label, CONFIGS[label], args, db))
        row = rows[-1]
        print(f"[{number}/{len(labels)}] {label}: {row['status']}, "
              f"{row['time_to_target_s']} s to target, best {row['best_accuracy']}, "
              f"{row['push_bytes_per_iteration']} push B/it, reduction {row['push_reduction']}, "
              f"{row['iterations']} iterations", flush=True)
    rows.sort(key=_order)
    this_pass = {"order": args.order, "budget_s": args.budget_s, "target": args.target,
                 "machine": info, "db": str(db), "results": rows}
    print("\n".join(table(rows, args.target, args.budget_s)))
    if args.quick or args.only:
        return {"passes": [this_pass]}
    passes = [*(C.earlier_passes(NAME) if args.append else []), this_pass]
    payload = {"parameters": {k: v for k, v in vars(args).items() if k not in ("db", "redraw")},
               "passes": passes}
    C.write_result(NAME, payload)
    _publish(passes, args)
    return payload


def _publish(passes: list[dict[str, Any]], args: argparse.Namespace) -> None:
    last = passes[-1]
    title = (f"Gradient pruning, MNIST, asp, 4 workers x 2 servers, "
             f"{last.get('budget_s', args.budget_s):.0f} s a run "
             f"(pass {len(passes)}, {last['order']} order)")
    for path in write_plots(last["results"], last.get("target", args.target), title):
        print(f"wrote {path}")
    C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(_docs_body(passes, args))))


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    budget_s = passes[-1].get("budget_s", args.budget_s)
    target = passes[-1].get("target", args.target)
    body = [f"Command: `python bench/pruning.py --budget-s {budget_s:.0f} [--order reverse] "
            "[--append]`; asp, 4 workers, 2 servers, MNIST MLP, batch 64, server SGD lr 0.1 "
            f"momentum 0.9, evaluation every 2 s, {budget_s:.0f} s per configuration "
            "(`--max-seconds`, counted from the run's start, process start-up included). Push "
            "filters of seed 002 (`--prune`, docs/communication.md), each with error feedback "
            "(EF, the default) and without (`--no-error-feedback`). Push KB/iteration: mean push "
            "frame bytes of the iterations that pushed; push reduction: the same pushes as "
            "dense float32 frames over the bytes sent; time to the target from the run's start "
            "(first evaluation at or above it; the one taken as a run stops can come a moment "
            "after the budget). Each pass runs the configurations one after "
            "another; the order alternates between passes. The machine's load average when "
            "each run started is given: other jobs share its cores.", ""]
    body += C.pass_tables(passes, lambda one: table(one["results"], one.get("target", target),
                                                    one.get("budget_s", budget_s)))
    body += [verdict(passes, target), ""]
    if all(path.exists() for path in PLOTS.values()):
        body += [f"Test accuracy of pass {len(passes)} against the workers' iterations and "
                 "against time (solid: error feedback, dashed: without):", "",
                 *(f"![{alt}]({path.name})" for alt, path in zip(
                     ("accuracy against iterations", "accuracy against time"),
                     PLOTS.values(), strict=True)), ""]
    body += [C.machine_note(passes[-1]["machine"])]
    return body


if __name__ == "__main__":
    main()
