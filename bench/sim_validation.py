"""Simulator validation: the simulated idle fraction and iterations per worker against a real run
with the same compute and network characteristics (issue 16, acceptance 5).

For each consistency model, one REAL run (``psctl launch``, local backend: 4 workers, 2 shard
servers, MNIST MLP 784-512-512-512-10, batch 64, worker 0 made 3x slower with ``--straggler 0:3x``,
stopped by ``--max-seconds``), then one SIMULATED run (``--backend sim``) given the real run's
characteristics, measured from its own iterations table:

* **time**: the real time limit counts from the launch, process start-up and data loading
  included; the simulation starts training at virtual time 0. The simulation's ``--max-seconds``
  is therefore the real run's *training window*: from its ``training_started`` event to its
  ``stop`` event.
* **compute** (``--compute-ms``): the median ``compute_s`` of the real run's non-straggler
  workers. It is measured under the run's own CPU contention (7 busy processes on this machine's
  2 cores), which is what the simulation must reproduce; the straggler factor is applied on top
  by both backends (the real one sleeps, the simulated one multiplies).
* **server update** (``--server-ms``): a dense SGD update of the whole model timed alone in this
  process (as the simulator calibrates it), times the contention factor of the compute (real
  compute per batch over the same batch timed alone): the run's CPU slows every role alike.
* **network** (``--network BANDWIDTH:LATENCY``, the workers' links): the latency is assumed,
  not fitted (``LATENCY_S`` below; loopback's per-message latency is well under the phases'
  milliseconds, so the fit is insensitive to it). The bandwidth is fitted so that an uncontended
  transfer of the model's dense frames through one worker's link takes what the real run's
  communication took. Under the simulator's transfer rules (``engine.sim.network``: a message
  holds the sender's out side for bytes / its bandwidth and the receiver's in side for bytes /
  its bandwidth, and arrives when the slower is done plus the larger latency), with ``T = dense
  push bytes / the workers' bandwidth`` and the servers' links too fast to matter:

  - a push's frames, one per shard, leave together and all arrive after ``T`` (the whole
    request through the worker's out side) plus a latency; each server applies its shard's
    half, in parallel (``update/servers``); the ACKs are a few bytes: ``T + update/servers +
    2 latency``;
  - a pull's requests are headers (one latency); each server replies with its shard's part
    through its own out side (free) into the worker's in side, which takes the replies one
    after the other, ``T/servers`` each: ``T + 2 latency``.

  ``T`` is solved from the median ``push_s`` and the median ``pull_s`` of all workers
  (``wait_s``, the servers' holding back, is part of neither) and the two solutions averaged.
* **servers' network** (``--server-network``, ``SERVER_BANDWIDTH`` at the same latency): on
  loopback a shard server has no link of its own. Its sends to different workers are copies
  into each receiving socket, proceeding together, and the real pull takes what one worker's
  copy takes whether or not the other workers pull at that moment; what a transfer costs is
  the worker's side, which the fitted bandwidth already holds. So the servers' links are made
  fast enough never to queue (1000 gbit/s: a whole model's frames in about 30 us, against
  transfers of about 10 ms), with the workers' latency so that the latency a message pays
  (the larger of the two) is the assumed one. Left at ``--network``'s default (a server's link
  as slow as a worker's), the replies a barrier releases to all four workers queue on each
  server's link one after another, which loopback does not do (the previous model's error,
  recorded in the docs section).

Compared: idle fraction = sum(wait_s) / sum(ended_at - started_at) over all workers' iterations
(and per worker), and iterations per worker; relative error = |sim - real| / real. Where both
idle fractions are under ``IDLE_FLOOR`` (ASP: no model ever holds a pull back) the relative error
is meaningless and the absolute difference is judged instead. The acceptance is every relative
error within 15 %; the per-phase medians (compute, push, pull, wait) of the straggler and the
other workers are recorded to show where a mismatch comes from.

Each pass runs real then sim per model; ``--order reverse`` reverses the models (alternate it
between passes). Reproduce: ``python bench/sim_validation.py`` (about 5 minutes per pass; add
``--order reverse --append`` for a second pass). ``--quick`` runs a short digits version (docs
and results untouched unless ``--out`` is given). ``--db FOLDER`` keeps the runs' databases there
(default: a new temporary folder, recorded in the results); ``--rewrite-docs`` rewrites the docs
section from the recorded results.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

NAME = "sim_validation"
WORKERS, SERVERS = 4, 2
STRAGGLER, FACTOR = 0, 3.0
MODELS: dict[str, list[str]] = {"bsp": [], "asp": [], "ssp": ["--staleness", "3"]}
QUICK_MODELS = ("bsp",)
LATENCY_S = 100e-6  # assumed one-way latency of a loopback message
SERVER_BANDWIDTH = "1000gbit"  # a loopback server has no link of its own: never the bottleneck
TOLERANCE = 0.15
IDLE_FLOOR = 0.02  # below this in both runs, the idle fraction is judged by its difference
PHASES = ("compute_s", "push_s", "pull_s", "wait_s")
LAUNCH_TIMEOUT_S = 900


# -- running ------------------------------------------------------------------------------------


def launch(extra: list[str], db: Path, args: argparse.Namespace, name: str,
           model: str) -> dict[str, Any]:
    """One ``psctl launch`` in a subprocess, into its own database; what it recorded."""
    data = (["--dataset", "digits"] if args.quick
            else ["--dataset", "mnist", "--data-dir", str(args.data_dir)])
    command = [sys.executable, "-m", "psctl", "launch", "--no-config", "--no-live",
               "--workers", str(WORKERS), "--servers", str(SERVERS), "--sync", model,
               *MODELS[model], "--straggler", f"{STRAGGLER}:{FACTOR:g}x", *data,
               "--epochs", str(args.epochs), "--eval-interval", str(args.eval_interval),
               "--name", name, "--db", str(db), *extra]
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)  # a reused --db folder: this run alone in its database
    env = C.child_env()
    # One OpenMP thread in every process, as in the passes recorded before: the simulator now
    # sets torch's threads to train.torch_threads (1) itself, and the real workers always did.
    env["OMP_NUM_THREADS"] = "1"
    began = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return {**measure(db), "wall_s": wall, "command": " ".join(command[1:])}


def measure(db: Path) -> dict[str, Any]:
    """The one run in ``db``: its training window, per-worker iterations, idle fractions and
    phase medians, and the dense push bytes of an iteration."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        run_id, status, reason = conn.execute("SELECT id, status, reason FROM runs ORDER BY "
                                              "started_at DESC LIMIT 1").fetchone()
        events = dict(conn.execute("SELECT kind, min(at) FROM events WHERE run_id = ? AND kind "
                                   "IN ('training_started', 'stop') GROUP BY kind", (run_id,)))
        rows = conn.execute("SELECT worker, ended_at - started_at, compute_s, push_s, pull_s, "
                            "wait_s, push_bytes_dense FROM iterations WHERE run_id = ?",
                            (run_id,)).fetchall()
        simulated = conn.execute("SELECT detail FROM events WHERE run_id = ? AND kind = "
                                 "'simulated'", (run_id,)).fetchone()
    conn.close()
    per: dict[int, list[tuple[Any, ...]]] = {}
    for row in rows:
        per.setdefault(int(row[0]), []).append(row)
    workers = {}
    for worker, mine in sorted(per.items()):
        wall = sum(r[1] for r in mine)
        workers[str(worker)] = {
            "iterations": len(mine), "idle_fraction": sum(r[5] for r in mine) / wall,
            **{f"{phase}_ms": 1e3 * statistics.median(r[2 + i] for r in mine)
               for i, phase in enumerate(PHASES)}}
    wall = sum(r[1] for r in rows)
    window = (events["stop"] - events["training_started"]
              if {"stop", "training_started"} <= events.keys() else None)
    dense = [r[6] for r in rows if r[6]]
    return {
        "run_id": run_id, "status": status, "reason": reason, "db": str(db),
        "training_window_s": window,
        "idle_fraction": sum(r[5] for r in rows) / wall if wall else None,
        "workers": workers,
        "groups": {group: _group_medians(rows, keep)
                   for group, keep in (("straggler", lambda w: w == STRAGGLER),
                                       ("others", lambda w: w != STRAGGLER))},
        "push_bytes_dense": statistics.median(dense) if dense else None,
        "simulated": json.loads(simulated[0]) if simulated else None,
    }


def _group_medians(rows: list[tuple[Any, ...]], keep: Any) -> dict[str, float | None]:
    mine = [r for r in rows if keep(int(r[0]))]
    return {f"{phase}_ms": 1e3 * statistics.median(r[2 + i] for r in mine) if mine else None
            for i, phase in enumerate(PHASES)}


# -- the fit ------------------------------------------------------------------------------------


def alone_costs(args: argparse.Namespace) -> dict[str, float]:
    """A batch's gradient and a dense server update of the model, each timed alone in this
    process with one torch thread (the simulator's own calibration, ``engine.sim.compute``)."""
    import torch
    from engine.sim.compute import _time_compute, _time_update

    from engine.datasets import load_dataset
    from engine.models.flat import FlatModel
    from engine.models.spec import MLPSpec
    from engine.plan import build_config

    torch.set_num_threads(1)
    dataset = "digits" if args.quick else "mnist"
    config = build_config({}, {"data.dataset": dataset})
    data = load_dataset(dataset, None if args.quick else Path(args.data_dir))
    spec = MLPSpec(data.spec.input_dim, config.model.hidden, data.spec.num_classes)
    model = FlatModel(spec, seed=0)
    compute = _time_compute(model, data.train_x, data.train_y, config.train.batch_size)
    update = _time_update(config, spec.num_keys) * spec.num_keys
    return {"compute_ms": 1e3 * compute, "server_update_ms": 1e3 * update}


def fit(real: dict[str, Any], alone: dict[str, float]) -> dict[str, Any]:
    """The simulation's characteristics from the real run (see the module's docstring)."""
    others = real["groups"]["others"]
    compute_ms = others["compute_s_ms"]
    contention = compute_ms / alone["compute_ms"]
    server_ms = alone["server_update_ms"] * contention
    medians = real["all_phases"]
    latency_ms = LATENCY_S * 1e3
    from_push = medians["push_s_ms"] - server_ms / SERVERS - 2 * latency_ms
    from_pull = medians["pull_s_ms"] - 2 * latency_ms
    transfer_ms = max((from_push + from_pull) / 2, 1e-3)
    bytes_per_s = real["push_bytes_dense"] / (transfer_ms / 1e3)
    network = f"{bytes_per_s / 1e6:.6g}mbyte:{LATENCY_S * 1e6:g}us"
    return {"compute_ms": compute_ms, "contention": contention, "server_ms": server_ms,
            "transfer_ms_from_push": from_push, "transfer_ms_from_pull": from_pull,
            "transfer_ms": transfer_ms, "bandwidth_gbit": bytes_per_s * 8 / 1e9,
            "latency_us": LATENCY_S * 1e6, "network": network,
            "server_network": f"{SERVER_BANDWIDTH}:{LATENCY_S * 1e6:g}us",
            "max_seconds": real["training_window_s"]}


def all_phases(db: Path) -> dict[str, float]:
    """Median push_s and pull_s over every worker's iterations (the network fit's input)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT push_s, pull_s FROM iterations").fetchall()
    conn.close()
    return {"push_s_ms": 1e3 * statistics.median(r[0] for r in rows),
            "pull_s_ms": 1e3 * statistics.median(r[1] for r in rows)}


# -- comparing ----------------------------------------------------------------------------------


def relative(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return abs(sim - real) / abs(real)


def compare(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Relative errors of the idle fraction (overall and per worker) and of every worker's
    iterations, and whether each is within the tolerance."""
    idle_real, idle_sim = real["idle_fraction"], sim["idle_fraction"]
    both_low = max(idle_real or 0.0, idle_sim or 0.0) < IDLE_FLOOR
    idle_error = relative(idle_sim, idle_real)
    idle_ok = both_low or (idle_error is not None and idle_error <= TOLERANCE)
    workers = {}
    for worker in sorted(real["workers"].keys() | sim["workers"].keys(), key=int):
        mine_real = real["workers"].get(worker, {"iterations": 0, "idle_fraction": None})
        mine_sim = sim["workers"].get(worker, {"iterations": 0, "idle_fraction": None})
        workers[worker] = {
            "iterations_real": mine_real["iterations"], "iterations_sim": mine_sim["iterations"],
            "iterations_error": relative(mine_sim["iterations"], mine_real["iterations"]),
            "idle_real": mine_real["idle_fraction"], "idle_sim": mine_sim["idle_fraction"],
            "idle_error": relative(mine_sim["idle_fraction"], mine_real["idle_fraction"])}
    iterations_errors = [w["iterations_error"] for w in workers.values()]
    iterations_ok = all(e is not None and e <= TOLERANCE for e in iterations_errors)
    return {"idle_real": idle_real, "idle_sim": idle_sim, "idle_error": idle_error,
            "idle_both_below_floor": both_low, "idle_ok": idle_ok,
            "iterations_error_max": max((e for e in iterations_errors if e is not None),
                                        default=None),
            "iterations_ok": iterations_ok, "workers": workers,
            "within_tolerance": idle_ok and iterations_ok}


def run_model(model: str, args: argparse.Namespace, alone: dict[str, float],
              folder: Path) -> dict[str, Any]:
    real_db = folder / f"{model}-real.db"
    real = launch(["--max-seconds", f"{args.seconds:g}"], real_db, args, f"simval-{model}-real",
                  model)
    real["all_phases"] = all_phases(real_db)
    if real["status"] != "finished" or real["training_window_s"] is None:
        return {"model": model, "real": real, "fit": None, "sim": None, "comparison": None}
    fitted = fit(real, alone)
    sim = launch(["--backend", "sim", "--max-seconds", f"{fitted['max_seconds']:.3f}",
                  "--compute-ms", f"{fitted['compute_ms']:.4f}", "--server-ms",
                  f"{fitted['server_ms']:.4f}", "--network", fitted["network"],
                  "--server-network", fitted["server_network"]],
                 folder / f"{model}-sim.db", args, f"simval-{model}-sim", model)
    return {"model": model, "real": real, "fit": fitted, "sim": sim,
            "comparison": compare(real, sim)}


# -- reporting ----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | idle fraction real | sim | error | iterations per worker real (worker "
             "0 = straggler) | sim | worst error | within 15 % |",
             "|---|---:|---:|---:|---|---|---:|---|"]
    for row in rows:
        cmp = row["comparison"]
        if cmp is None:
            lines.append(f"| {row['model']} | real run {row['real']['status']} |  |  |  |  |  "
                         "| no |")
            continue
        workers = cmp["workers"]
        real_its = ", ".join(str(w["iterations_real"]) for w in workers.values())
        sim_its = ", ".join(str(w["iterations_sim"]) for w in workers.values())
        error = ("both < 2 %" if cmp["idle_both_below_floor"] else _pct(cmp["idle_error"]))
        lines.append(f"| {row['model']} | {_pct(cmp['idle_real'])} | {_pct(cmp['idle_sim'])} | "
                     f"{error} | {real_its} | {sim_its} | {_pct(cmp['iterations_error_max'])} | "
                     f"{'yes' if cmp['within_tolerance'] else 'no'} |")
    return lines


def phase_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | workers | compute ms real / sim | push ms real / sim | pull ms real / sim "
             "| wait ms real / sim | idle fraction real / sim |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if row["sim"] is None:
            continue
        for group in ("straggler", "others"):
            real, sim = row["real"]["groups"][group], row["sim"]["groups"][group]
            ranks = [w for w in row["comparison"]["workers"]
                     if (int(w) == STRAGGLER) == (group == "straggler")]
            idle = [(row["comparison"]["workers"][w]["idle_real"],
                     row["comparison"]["workers"][w]["idle_sim"]) for w in ranks]
            idle_text = ", ".join(f"{_pct(a)} / {_pct(b)}" for a, b in idle)
            cells = " | ".join(f"{_ms(real[f'{p}_ms'])} / {_ms(sim[f'{p}_ms'])}" for p in PHASES)
            lines.append(f"| {row['model']} | {group} ({', '.join(ranks)}) | {cells} | "
                         f"{idle_text} |")
    return lines


def fit_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | training window s | compute ms | contention | server ms | push ms "
             "(median) | pull ms (median) | T from push / pull ms | bandwidth | latency |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for row in rows:
        fitted = row["fit"]
        if fitted is None:
            continue
        phases = row["real"]["all_phases"]
        lines.append(
            f"| {row['model']} | {fitted['max_seconds']:.2f} | {fitted['compute_ms']:.2f} | "
            f"{fitted['contention']:.1f}x | {fitted['server_ms']:.2f} | "
            f"{phases['push_s_ms']:.2f} | {phases['pull_s_ms']:.2f} | "
            f"{fitted['transfer_ms_from_push']:.2f} / {fitted['transfer_ms_from_pull']:.2f} | "
            f"{fitted['bandwidth_gbit']:.2f} gbit/s | {fitted['latency_us']:g} us |")
    return lines


def verdict(passes: list[dict[str, Any]]) -> str:
    results = [(number, row) for number, one in enumerate(passes, start=1)
               for row in one["results"]]
    failed = [f"{row['model']} in pass {number}" for number, row in results
              if row["comparison"] is None or not row["comparison"]["within_tolerance"]]
    if not results:
        return "Nothing was measured."
    if not failed:
        return (f"Acceptance (idle fraction and iterations per worker within 15 %): holds for "
                f"every model in every pass ({len(results)} comparisons).")
    return (f"Acceptance (idle fraction and iterations per worker within 15 %): does not hold "
            f"for {', '.join(failed)}; holds for {len(results) - len(failed)} of "
            f"{len(results)} comparisons.")


def _docs_body(passes: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    body = [f"Command: `python bench/sim_validation.py [--order reverse --append]`; per model a "
            f"real run (`psctl launch`: {WORKERS} workers, {SERVERS} servers, MNIST MLP, batch "
            f"64, `--straggler {STRAGGLER}:{FACTOR:g}x`, `--max-seconds {args.seconds:g}`, "
            f"`--eval-interval {args.eval_interval:g}`), then a simulated one (`--backend sim`) "
            "with `--compute-ms`, `--server-ms`, `--network` fitted from the real run's own "
            "iterations, `--server-network "
            f"{SERVER_BANDWIDTH}:{LATENCY_S * 1e6:g}us` and `--max-seconds` set to its training "
            "window (the real limit counts from the launch, start-up included). How each "
            "characteristic is derived is in the script's docstring: compute = median compute of "
            "the non-straggler workers (CPU contention included); server update = a whole push "
            "through a shard of the model timed alone x the compute's contention factor; latency "
            f"assumed {LATENCY_S * 1e6:g} us; workers' bandwidth such that the dense frames of "
            "one iteration take T through a worker's link, T solved from the median push (T + "
            "update/servers + 2 latency: the push's frames leave together and arrive after T) "
            "and the median pull (T + 2 latency: the servers' replies enter the worker's link one "
            "after the other, T/servers each) and averaged. The servers' links are fast (a "
            f"{SERVER_BANDWIDTH}/s link passes a model in about 30 us) because a loopback server "
            "has no link of its own: its replies to different workers are copies into each "
            "worker's socket, made together, and a transfer's cost is on the worker's side, "
            "which the fitted bandwidth holds. Idle fraction = sum(wait_s) / sum(iteration wall) "
            "over all workers; error = |sim - real| / real; an idle fraction under 2 % in both "
            "runs is not judged by its relative error.",
            ""]
    for number, one in enumerate(passes, start=1):
        load = one["machine"]["loadavg_at_start"][0]
        body += [f"Pass {number} ({one['order']} order, load average {load:.2f} at its start"
                 f"{'; ' + one['note'] if one.get('note') else ''}):", "",
                 *table(one["results"]), "", "Per phase (medians):", "",
                 *phase_table(one["results"]), "", "The fit:", "", *fit_table(one["results"]),
                 ""]
    body += [verdict(passes), ""]
    if FINDINGS:
        body += [C.paragraph(FINDINGS), ""]
    body += [C.paragraph(PREVIOUS), "", C.machine_note(passes[-1]["machine"])]
    return body


# What the per-phase tables of the passes above show; the numbers are in the tables.
FINDINGS = """What is still off (the medians above; means from the runs' databases). (1) ASP:
the simulated fast workers complete 7.9-9.0 % more iterations (a mean iteration of 34.7-37.8 ms
against 37.2-39.9 ms real). A real asynchronous push takes 15-16 ms (median) against a pull of
8-9 ms, while in BSP and SSP push and pull are within 2 ms of each other; the model's push
exceeds its pull only by update/servers (about 1.2 ms), so the fit's two solutions for T
disagree (13.4-14.0 ms from the push, 8.1-8.8 ms from the pull) and their average makes the
simulated push about 3 ms too short and the pull 2-3 ms too long; the real phases' tails (mean
push 16-17 ms against a median of 15-16 ms; the deterministic simulation has none) add the rest.
What makes a real asynchronous push slower is not measured here (pushes arriving unsynchronized
and queueing on a real server whose whole handling of a push, under this CPU load, costs more
than the fitted update is the likely candidate). (2) The straggler: the simulated one computes
3x the others' median compute; the real one sleeps to 3x its own batch, which in BSP ran faster
than the others' (the real straggler's compute is 2.6-2.7x the others' in BSP, 2.9-3.3x in SSP
and ASP), so in BSP the simulated straggler computes 4-5 ms longer per iteration (median; 3-5 ms
in the mean). In passes 1 and 2 that costs little, a shorter simulated pull taking back about 1
ms (a mean iteration 0.9-1.5 % longer, iterations within 1.1 %); in pass 3's BSP, run under more
load (compute 16.9 ms against 12-13 ms elsewhere), the simulated iteration takes 79.6 ms against
75.2 ms (mean): 5.4 % fewer iterations and an idle fraction 10.6 % high (28.8 % against 26.0 %),
the largest errors of the nine comparisons apart from ASP's iterations. (3) The simulated BSP
fast workers' push is 2.0-2.4 ms longer than the real one (SSP: 0.1-0.8 ms): the three identical
workers leave a barrier in lockstep in the deterministic simulation and their pushes queue
behind each other's updates on each server (about 1.3 ms each), where the real ones are spread
out."""

# The previous model's validation (before the change to engine/sim this bench argued for).
PREVIOUS = """Before: the first run of this validation (same fit, same load, three
passes), against the previous network model, matched 4 of 9 comparisons within 15 %: the simulated
workers completed 10-17 % fewer iterations than the real ones (worst error per comparison
10.1-17.4 %) and the idle fraction of BSP and SSP was up to 17.9 % off, because the simulated pulls
took up to twice the real ones (the straggler's 20-22 ms against 11-13 ms). Two causes: (1) a shard
server's link was as slow as a worker's and carried its replies one after another, so the pulls a
barrier released to four workers at once queued behind each other, which loopback does not do; (2)
a push's frames, one per shard, left one after the other. The simulator now gives every link its
own bandwidth (--server-network for the servers'), holds each side of a message for its bytes over
that side's bandwidth, and sends the frames of one request together; the passes above use it."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or NAME).splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get(
        "PSCTL_DATA_DIR", REPO.parent / "shared" / "data")) / "mnist")
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="the real runs' --max-seconds (from the launch)")
    parser.add_argument("--eval-interval", type=float, default=30.0)
    parser.add_argument("--epochs", type=int, default=100,
                        help="more than the time limit allows: the limit ends every run")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--note", default="", help="a remark on the pass, shown in the docs")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"write the results here (default bench/results/{NAME}.json; "
                        "--quick writes only where given)")
    C.add_pass_arguments(parser, NAME)
    parser.add_argument("--rewrite-docs", action="store_true",
                        help=f"rewrite the docs section from bench/results/{NAME}.json (runs "
                        "nothing)")
    args = parser.parse_args(argv)
    if args.rewrite_docs:
        recorded = json.loads((C.RESULTS / f"{NAME}.json").read_text())
        _update_docs(recorded["passes"], argparse.Namespace(**recorded["parameters"]))
        return dict(recorded)
    if args.quick:
        # --max-seconds counts from the launch: a busy 2-core machine took over 14 s to start
        # the 7 processes as fresh Pythons once (a CI run failed with no iteration done);
        # forked from the warm template they start within a few seconds, so 15 leaves margin.
        args.seconds, args.epochs, args.eval_interval = min(args.seconds, 15.0), 1000, 30.0
        if args.models == ",".join(MODELS):
            args.models = ",".join(QUICK_MODELS)
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - MODELS.keys()
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    if args.order == "reverse":
        models.reverse()
    folder = args.db or Path(tempfile.mkdtemp(prefix="psctl-bench-simval-"))
    folder.mkdir(parents=True, exist_ok=True)
    info = C.machine_info()
    alone = alone_costs(args)
    rows = []
    for model in models:
        rows.append(run_model(model, args, alone, folder))
        cmp = rows[-1]["comparison"]
        print(f"{model}: " + ("real run failed" if cmp is None else
                              f"idle {_pct(cmp['idle_real'])} real, {_pct(cmp['idle_sim'])} sim; "
                              f"iterations error up to {_pct(cmp['iterations_error_max'])}"),
              flush=True)
    rows.sort(key=lambda r: list(MODELS).index(r["model"]))
    this_pass = {"order": args.order, "note": args.note, "machine": info, "folder": str(folder),
                 "alone": alone, "results": rows}
    print("\n".join([*table(rows), "", *phase_table(rows), "", *fit_table(rows)]))
    earlier = C.earlier_passes(NAME) if args.append and not args.quick else []
    passes = [*earlier, this_pass]
    parameters = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                  if k not in ("db", "append", "out", "rewrite_docs")}
    payload = {"parameters": parameters, "tolerance": TOLERANCE, "passes": passes,
               "verdict": verdict(passes)}
    print(payload["verdict"])
    if args.out is not None:  # elsewhere: the recorded results and the docs stay as they are
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    elif not args.quick:
        C.write_result(NAME, payload)
        _update_docs(passes, args)
    return payload


def _update_docs(passes: list[dict[str, Any]], args: argparse.Namespace) -> None:
    C.update_docs_section("Simulator validation: sim against real, one 3x straggler (issue 16, "
                          "acceptance 5)", "\n".join(C.wrap_lines(_docs_body(passes, args))))


if __name__ == "__main__":
    main()
