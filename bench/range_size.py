"""Range size (seed 000: "what range size is the best?"): a sweep of ``--range-size`` on MNIST.

Each configuration trains the MNIST MLP on real server and worker processes, as ``psctl launch``
does: BSP, 4 workers, 2 shard servers, batch 64, for a fixed time budget (``stop.max_seconds``).
The baseline is ``--range-size`` off (one frame per shard for every push and pull), run in the
same pass; the others split every push and pull into pipelined frames of at most 200,000,
50,000, 10,000, 2,000 and 500 keys (the model has 932,362 keys, 466,181 per shard).

Measured per run, from the database's ``iterations`` rows: samples per second (the samples of
every worker over the wall time from the first iteration's start to the last one's end) and
the mean push + pull time per iteration (the time the loop was blocked pushing and pulling).
Each is divided by the baseline's in the same pass. Passes alternate the order of the
configurations (``--order reverse``), so a drift in the machine's load does not favour the same
one; the verdict compares the best size's gain with how far the same configuration's ratio moved
between passes.

Reproduce: ``python bench/range_size.py [--order reverse] [--append]`` (about 6 minutes a pass
at the default 40 s budget); ``--quick`` runs a tiny digits version (docs untouched);
``--redraw`` rewrites the docs section from ``bench/results/range_size.json``.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

NAME = "range_size"
DOCS_TITLE = "Range size: a sweep of --range-size (MNIST, BSP; issue 15, acceptance 4)"
BASELINE = "off"
SIZES: dict[str, int | None] = {
    BASELINE: None, "200000": 200_000, "50000": 50_000, "10000": 10_000, "2000": 2_000,
    "500": 500}


# -- measuring one run --------------------------------------------------------------------------


def measure(db: Path, run_id: str) -> dict[str, Any]:
    """Throughput and blocked push/pull time of one run, from its iteration rows."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        count, samples, first, last, push_s, pull_s, wait_s, compute_s, sent, received = (
            conn.execute(
                "SELECT count(*), sum(samples), min(started_at), max(ended_at), avg(push_s), "
                "avg(pull_s), avg(wait_s), avg(compute_s), sum(bytes_sent), "
                "sum(bytes_received) FROM iterations WHERE run_id = ?", (run_id,)).fetchone())
        found = conn.execute("SELECT reason FROM runs WHERE id = ?", (run_id,)).fetchone()
        evaluations = conn.execute(
            "SELECT accuracy FROM evaluations WHERE run_id = ? ORDER BY at, id",
            (run_id,)).fetchall()
    wall = (last - first) if count else None
    return {
        "reason": found[0] if found else None,
        "iterations": int(count),
        "samples": int(samples or 0),
        "wall_s": wall,
        "samples_per_s": samples / wall if wall else None,
        "push_s": push_s, "pull_s": pull_s, "wait_s": wait_s, "compute_s": compute_s,
        "push_pull_s": push_s + pull_s if count else None,
        "bytes_per_iteration": (sent + received) / count if count else None,
        "final_accuracy": evaluations[-1][0] if evaluations else None,
    }


def measure_failed(reason: str) -> dict[str, Any]:
    return {"reason": None, "iterations": 0, "samples": 0, "wall_s": None,
            "samples_per_s": None, "push_s": None, "pull_s": None, "wait_s": None,
            "compute_s": None, "push_pull_s": None, "bytes_per_iteration": None,
            "final_accuracy": None, "measure_error": reason}


def run_config(label: str, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    from engine.launcher import Launcher
    from engine.plan import build_config

    values = {
        "cluster.workers": 4, "cluster.servers": 2, "sync.model": "bsp",
        "data.dataset": args.dataset, "data.data_dir": args.data_dir, "train.epochs": 100,
        "train.batch_size": 64, "stop.max_seconds": args.budget_s,
        "comm.range_size": SIZES[label], "name": f"bench-range-{label}"}
    config = build_config({}, values)
    row: dict[str, Any] = {"config": label, "range_size": config.comm.range_size}
    launcher = Launcher(config, db=db)
    row["run_id"] = launcher.run_id
    try:
        launcher.start()
        row["status"] = launcher.wait().status.value
    except Exception as exc:  # one broken configuration must not lose the whole pass
        row["status"] = f"error: {type(exc).__name__}"
        row["error"] = str(exc)
    try:
        row.update(measure(db, launcher.run_id))
    except sqlite3.Error as exc:
        row.update(measure_failed(str(exc)))
    return row


# -- analysis (pure; tests/bench/test_range_size_bench.py) ---------------------------------------


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in SIZES order, each with its samples/s and push + pull time divided by the
    baseline's in the same pass (None where either is missing)."""
    base = next((r for r in rows if r["config"] == BASELINE), None)
    out = []
    for row in sorted(rows, key=lambda r: list(SIZES).index(r["config"])):
        speed, blocked = row.get("samples_per_s"), row.get("push_pull_s")
        base_speed = base.get("samples_per_s") if base else None
        base_blocked = base.get("push_pull_s") if base else None
        out.append({**row,
                    "speed_ratio": speed / base_speed if speed and base_speed else None,
                    "push_pull_ratio": (blocked / base_blocked
                                        if blocked and base_blocked else None)})
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| range size (keys) | status | samples/s | vs off | push + pull ms/iteration | "
             "vs off | push ms | pull ms | wait ms | compute ms | iterations |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ms(value: float | None) -> str:
        return "" if value is None else f"{1e3 * value:.1f}"

    for row in with_ratios(rows):
        speed, speed_ratio = row["samples_per_s"], row["speed_ratio"]
        blocked_ratio = row["push_pull_ratio"]
        lines.append(
            f"| {row['config']} | {row['status']} | "
            f"{'' if speed is None else f'{speed:,.0f}'} | "
            f"{'' if speed_ratio is None else C.fmt_ratio(speed_ratio)} | "
            f"{ms(row['push_pull_s'])} | "
            f"{'' if blocked_ratio is None else C.fmt_ratio(blocked_ratio)} | "
            f"{ms(row['push_s'])} | {ms(row['pull_s'])} | {ms(row['wait_s'])} | "
            f"{ms(row['compute_s'])} | {row['iterations']} |")
    return lines


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration, its samples/s ratios over the passes; the best size (highest median
    ratio, the baseline included), and the noise: the largest difference between two passes'
    ratios of the same configuration."""
    ratios: dict[str, list[float]] = {label: [] for label in SIZES}
    blocked: dict[str, list[float]] = {label: [] for label in SIZES}
    for one in passes:
        for row in with_ratios(one["results"]):
            if row["speed_ratio"] is not None:
                ratios[row["config"]].append(row["speed_ratio"])
            if row["push_pull_ratio"] is not None:
                blocked[row["config"]].append(row["push_pull_ratio"])
    medians = {label: C.median(values) for label, values in ratios.items() if values}
    best = max(medians, key=lambda label: medians[label]) if medians else None
    noise = max((max(v) - min(v) for v in ratios.values() if len(v) > 1), default=None)
    return {"speed_ratios": ratios, "push_pull_ratios": blocked, "medians": medians,
            "best": best, "noise": noise}


def verdict(passes: list[dict[str, Any]]) -> str:
    """Which size was best and whether its gain over the baseline is beyond the pass-to-pass
    noise (measured, not asserted)."""
    found = summary(passes)
    best, noise = found["best"], found["noise"]
    if best is None:
        return "No configuration recorded a throughput."
    count = f"{len(passes)} pass{'es' if len(passes) != 1 else ''}"
    spread = ("" if noise is None else
              f"; the same configuration's ratio moved by up to {noise:.2f} between passes")
    listed = ", ".join(f"{label} {C.fmt_ratio(value)}"
                       for label, value in found["medians"].items())
    text = f"Samples/s against range size off, median over {count}: {listed}{spread}. "
    if best == BASELINE:
        text += ("Best here: range size off (one frame per shard); no size was faster than "
                 "the baseline")
        others = {k: v for k, v in found["medians"].items() if k != BASELINE}
        if not others or noise is None:
            return text + "."
        runner = max(others, key=lambda label: others[label])
        closest = max(found["speed_ratios"][runner])
        margin = "beyond" if closest < 1.0 and 1.0 - closest > noise else "not beyond"
        return text + (f". The closest, {runner} keys, was {C.fmt_ratio(closest)} at best, "
                       f"{margin} the noise.")
    worst = min(found["speed_ratios"][best])
    gain = worst - 1.0
    if noise is None:
        beyond = "only one pass, so the noise is not known"
    elif worst > 1.0 and gain > noise:
        beyond = (f"beyond the noise: its worst pass was {C.fmt_ratio(worst)}, a gain larger "
                  f"than the {noise:.2f} passes disagree by")
    else:
        beyond = (f"not beyond the noise: its worst pass was {C.fmt_ratio(worst)}, within the "
                  f"{noise:.2f} passes disagree by")
    return text + f"Best here: {best} keys per frame, {beyond}."


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    C.add_config_arguments(parser, NAME, budget_s=40.0)
    args = parser.parse_args(argv)
    args.dataset = "digits" if args.quick else "mnist"
    if args.quick:
        args.budget_s, args.data_dir = 15.0, None
    if args.redraw:
        passes = C.earlier_passes(NAME)
        C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(docs_body(passes, args))))
        return {"passes": passes}
    chosen = [c for c in SIZES if not args.only or c in args.only]
    if args.only and len(chosen) != len(args.only):
        raise SystemExit(f"--only takes one of: {', '.join(SIZES)}")
    db = args.db or Path(f"/tmp/psctl-bench-range-size-{int(time.time())}.db")
    labels = chosen if args.order == "forward" else list(reversed(chosen))
    info = C.machine_info()
    rows = []
    for label in labels:
        rows.append(run_config(label, args, db))
        print(f"range size {label}: {rows[-1]['status']}, {rows[-1]['samples_per_s']} "
              f"samples/s, push+pull {rows[-1]['push_pull_s']} s/iteration", flush=True)
    this_pass = {"order": args.order, "machine": info, "db": str(db), "results": rows}
    print("\n".join(table(rows)))
    if args.quick or args.only:
        return {"passes": [this_pass]}
    passes = [*(C.earlier_passes(NAME) if args.append else []), this_pass]
    payload = {"parameters": {k: v for k, v in vars(args).items() if k not in ("db", "redraw")},
               "passes": passes, "summary": summary(passes)}
    C.write_result(NAME, payload)
    C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(docs_body(passes, args))))
    print(verdict(passes))
    return payload


def docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = ["Command: `python bench/range_size.py [--order reverse] [--append]`; BSP, 4 "
            "workers, 2 shard servers, MNIST MLP (932,362 keys, 466,181 per shard), batch 64, "
            f"{args.budget_s:.0f} s per configuration (`stop.max_seconds`), `--range-size` "
            "off (the baseline: one frame per shard) and 200,000, 50,000, 10,000, 2,000 and "
            "500 keys per frame. *samples/s*: every worker's samples over the wall time from "
            "the first iteration's start to the last one's end (the iterations table); *push + "
            "pull*: the mean time an iteration was blocked pushing and pulling; *vs off*: "
            "divided by the baseline's in the same pass. Each pass runs the sizes one after "
            "another; the order alternates between passes.", ""]
    body += C.pass_tables(passes, lambda one: table(one["results"]))
    body += [verdict(passes), "", C.machine_note(passes[-1]["machine"])]
    return body


if __name__ == "__main__":
    main()
