"""Sparse key ranges at scale (issue 44): memory per stored key and pull/push keys per second of a
sparse shard against a dense one, and whole runs over 10^9 and 2^40 hashed features.

Part 1, in one process (no sockets: the store's own cost). A shard of Adagrad over a key range
is pushed ``--batches`` batches of ``--batch`` distinct keys drawn from a Zipf law (exponent 1.1)
and hashed into the range, then read back by the same keys; passes alternate which shard goes
first. The sparse shard's range is 2^40 keys; the dense one's 10^7 (a dense 2^40 would need 8 TiB):
keys per second of each, their ratio, and the resident memory the sparse shard added per key it
stores (its value, Adagrad's sum, the key map).

Part 2, whole runs (``--runs``; real processes over loopback): the issue's two commands,
``psctl launch --model logreg --dataset sparse-synthetic:features=1000000000,nnz=50 --workers 4
--servers 4 --sync bounded-delay --max-seconds 60`` and the same over 2^40 features with a Zipf
exponent of 1.1 and Adagrad. From the run's database: the servers' summed resident memory at its
peak (``process_samples``), the keys they store at the end (``server_stats``), memory per stored
key above the same servers' memory in a run over 10^6 features, and the objective's first and
last values.

Part 2 also runs acceptance 3: the embedding model (``--model embedding``) over 2^30 hashed
features on a click data set, with one backup per key range (``--replicas 1``) and server 1
killed at 30 s: its status, the test set's log loss and AUC, the failovers. ``--ray HOST:PORT``
runs the baseline and the 10^9 run on a Ray cluster too (``python -m engine.hosts.ray_local``).

Run: ``python bench/sparse_scale.py`` (part 1, about a minute), ``--runs`` for part 2 as well
(about 6 minutes), ``--skip-part1`` to keep part 1's last results. Writes
``bench/results/sparse_scale.json`` and its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import psutil

from bench import _common as C
from engine.config import RunConfig
from engine.hashing import mix64
from engine.keys import KeyLayout, KeyRange, Segment
from engine.roles.copies import build_shard
from engine.server.shard import ShardState

SPARSE_KEYS, DENSE_KEYS = 1 << 40, 10_000_000
TITLE = "Sparse key ranges (issue 44)"
LOGREG = ["--model", "logreg", "--sync", "bounded-delay", "--max-seconds", "60"]
RUNS = {
    "1e6 features (baseline)": ["--dataset", "sparse-synthetic:features=1000000,nnz=50",
                                *LOGREG],
    "1e9 features": ["--dataset", "sparse-synthetic:features=1000000000,nnz=50", *LOGREG],
    "2^40 features, Zipf 1.1, Adagrad": [
        "--dataset", "sparse-synthetic:features=2^40,nnz=50,alpha=1.1", *LOGREG,
        "--optimizer", "adagrad"],
    # Acceptance 3: the embedding model, one backup per key range, server 1 killed at 30 s.
    "embedding, 2^30 features, replicas 1, server 1 killed at 30 s": [
        "--dataset", "sparse-synthetic:features=2^30,nnz=26,ctr=0.2,samples=300000",
        "--model", "embedding", "--optimizer", "adagrad", "--lr", "0.005", "--epochs", "1",
        "--replicas", "1", "--fault", "kill:server:1@30s"],
}
BASELINE = "1e6 features (baseline)"


def zipf_keys(rng: np.random.Generator, count: int, space: int) -> np.ndarray:
    """``count`` distinct keys of ``space``: Zipf(1.1) ranks hashed into it."""
    ranks = rng.zipf(1.1, size=count * 3)
    keys = np.unique((mix64(ranks, 7) % np.uint64(space)).astype(np.int64))
    return keys[rng.permutation(len(keys))[:count]] if len(keys) > count else keys


def shard(space: int, sparse: bool) -> ShardState:
    config = RunConfig.model_validate({"cluster": {"workers": 1, "servers": 1},
                                       "sync": {"model": "asp"},
                                       "optimizer": {"name": "adagrad", "lr": 0.1}})
    keys = KeyRange(0, space)
    state = build_shard(config, keys, KeyLayout((Segment("w", (space,), keys, sparse),)))
    if not sparse:
        state.init(keys, np.zeros(space, dtype=np.float32))
    return state


def one_shard(space: int, sparse: bool, batches: int, batch: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    plan = [np.sort(zipf_keys(rng, batch, space)) for _ in range(batches)]
    grads = [np.ones(len(keys), dtype=np.float32) for keys in plan]
    rss = psutil.Process().memory_info().rss
    state = shard(space, sparse)
    whole = KeyRange(0, space)
    started = time.perf_counter()
    for clock, (keys, grad) in enumerate(zip(plan, grads, strict=True)):
        state.push(0, clock, whole, grad, index=keys)
    pushed_s = time.perf_counter() - started
    started = time.perf_counter()
    for keys in plan:
        state.read(whole, keys)
    read_s = time.perf_counter() - started
    keys_moved = sum(len(k) for k in plan)
    grown = psutil.Process().memory_info().rss - rss
    out = {"space": space, "sparse": sparse, "keys_moved": keys_moved, "stored": state.stored,
           "push_keys_per_s": keys_moved / pushed_s, "pull_keys_per_s": keys_moved / read_s,
           "rss_added_bytes": grown, "bytes_per_stored_key": grown / max(state.stored, 1)}
    del state
    return out


def part1(passes: int, batches: int, batch: int) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for number in range(passes):
        order = [True, False] if number % 2 == 0 else [False, True]
        row: dict[str, Any] = {"pass": number, "order": ["sparse" if s else "dense" for s in order]}
        for sparse in order:
            row["sparse" if sparse else "dense"] = _in_child(
                SPARSE_KEYS if sparse else DENSE_KEYS, sparse, batches, batch)
        print(json.dumps(row), flush=True)
        results.append(row)
    summary = {name: C.median([r["sparse"][name] / r["dense"][name] for r in results])
               for name in ("push_keys_per_s", "pull_keys_per_s")}
    return {"passes": results, "ratio_sparse_to_dense": summary,
            "bytes_per_stored_key": C.median([r["sparse"]["bytes_per_stored_key"]
                                              for r in results])}


def _in_child(space: int, sparse: bool, batches: int, batch: int) -> dict[str, Any]:
    """One shard measured in a fresh process, so that one's memory is not the other's."""
    code = (f"import json, sys; sys.path.insert(0, {str(C.REPO)!r}); "
            "from bench.sparse_scale import one_shard; "
            f"print(json.dumps(one_shard({space}, {sparse!r}, {batches}, {batch})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=600, env=C.child_env())
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def launch(args: list[str], folder: Path, ray: str | None) -> dict[str, Any]:
    command = ["psctl", "launch", *args, "--workers", "4", "--servers", "4", "--no-live",
               *(["--backend", "ray", "--ray-address", ray] if ray else [])]
    started = time.time()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PSCTL_DB": str(folder / "experiments.db")})
    db = folder / "experiments.db"
    run_id = C.query_db(db, "SELECT id FROM runs ORDER BY started_at DESC LIMIT 1")[0][0]
    return {"command": " ".join(command), "rc": done.returncode, "wall_s": time.time() - started,
            "tail": done.stdout[-600:] + done.stderr[-600:], **_outcome(db, run_id)}


def _outcome(db: Path, run_id: str) -> dict[str, Any]:
    peak = C.query_db(db, "SELECT max(total) FROM (SELECT at, sum(rss_bytes) AS total FROM "
                          "process_samples WHERE run_id = ? AND role = 'server' GROUP BY at)",
                      run_id)[0][0]
    stats = C.run_events(db, run_id, "server_stats")
    losses = [row[0] for row in C.query_db(db, "SELECT loss FROM evaluations WHERE run_id = ? "
                                               "ORDER BY at", run_id)]
    aucs = [row[0] for row in C.query_db(db, "SELECT value FROM user_metrics WHERE run_id = ? "
                                             "AND name = 'auc' ORDER BY at", run_id)]
    failovers = len(C.run_events(db, run_id, "failover_complete"))
    status = C.query_db(db, "SELECT status FROM runs WHERE id = ?", run_id)[0][0]
    return {"run_id": run_id, "status": status, "servers_peak_rss_bytes": peak,
            "stored_keys": sum(int(d.get("stored_keys", 0)) for _, d in stats),
            "stored_bytes": sum(int(d.get("stored_bytes", 0)) for _, d in stats),
            "objective_first": losses[0] if losses else None,
            "objective_last": losses[-1] if losses else None, "evaluations": len(losses),
            "auc_last": aucs[-1] if aucs else None, "failovers": failovers}


def part2(ray: str | None) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, args in RUNS.items():
        if ray and name not in (BASELINE, "1e9 features"):
            continue  # on Ray: the baseline and the billion keys
        with tempfile.TemporaryDirectory(prefix="sparse-scale-") as folder:
            runs[name] = launch(args, Path(folder), ray)
        print(json.dumps({name: runs[name]}), flush=True)
    base = runs[BASELINE]
    for result in runs.values():
        added = (result["servers_peak_rss_bytes"] or 0) - (base["servers_peak_rss_bytes"] or 0)
        extra_keys = result["stored_keys"] - base["stored_keys"]
        result["bytes_per_added_stored_key"] = added / extra_keys if extra_keys > 0 else None
    return runs


def docs(result: dict[str, Any]) -> str:
    p1 = result["part1"]
    rows = ["| pass | shard | keys stored | push keys/s | pull keys/s | bytes per stored key |",
            "|---|---|---|---|---|---|"]
    for row in p1["passes"]:
        for name in ("sparse", "dense"):
            r = row[name]
            rows.append(f"| {row['pass']} | {name} ({r['space']:,} keys) | {r['stored']:,} | "
                        f"{r['push_keys_per_s']:,.0f} | {r['pull_keys_per_s']:,.0f} | "
                        + (f"{r['bytes_per_stored_key']:.1f} |" if name == "sparse" else "- |"))
    ratio = p1["ratio_sparse_to_dense"]
    text = [C.paragraph(
        "`python bench/sparse_scale.py`: one Adagrad shard in one process, pushed batches of "
        "distinct Zipf(1.1) keys hashed into its range, then read back by the same keys; the "
        f"sparse shard over 2^40 keys, the dense one over 10^7; passes alternate. Sparse / dense "
        f"(median): pushes {C.fmt_ratio(ratio['push_keys_per_s'])}, pulls "
        f"{C.fmt_ratio(ratio['pull_keys_per_s'])}; resident memory per stored key of the sparse "
        f"shard: {p1['bytes_per_stored_key']:.1f} bytes (value, Adagrad's sum, key map)."),
        "", *rows]
    for part, where in (("part2", "on this machine's processes"),
                        ("ray", "on the Ray backend (a 3-node loopback cluster, "
                                "engine.hosts.ray_local)")):
        if part in result:
            text += _runs_table(result[part], where)
    text += ["", C.machine_note(result["machine"])]
    return "\n".join(text)


def _runs_table(runs: dict[str, Any], where: str) -> list[str]:
    text = ["", C.paragraph(
            f"Whole runs {where}: the issue's commands (4 workers, 4 servers; logistic regression "
            "under bounded delay for 60 s at most; the embedding model for one epoch, the test "
            "set's log loss and AUC). Servers' peak RSS: their resident memory summed at the "
            "sample it peaked (process_samples); bytes per added key: that peak above the "
            "10^6-feature run's, over the keys stored above its; accounted: the servers' own "
            "count of the rows and key map the stored keys take (server_stats.stored_bytes), "
            "per key."), "",
            "| run | status | wall s | servers' peak RSS | keys stored | bytes per added key "
            "| accounted bytes per key | objective first -> last | AUC | failovers |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        per = r.get("bytes_per_added_stored_key")
        auc = r.get("auc_last")
        text.append(f"| {name} | {r['status']} | {r['wall_s']:.0f} | "
                    f"{(r['servers_peak_rss_bytes'] or 0) / 2**30:.2f} GiB | "
                    f"{r['stored_keys']:,} | {'-' if per is None else f'{per:.0f}'} | "
                    f"{r['stored_bytes'] / max(r['stored_keys'], 1):.0f} | "
                    f"{r['objective_first']:.4f} -> {r['objective_last']:.4f} | "
                    f"{'-' if auc is None else f'{auc:.3f}'} | {r.get('failovers', 0)} |")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=5000)
    parser.add_argument("--runs", action="store_true", help="also part 2: whole runs")
    parser.add_argument("--ray", metavar="HOST:PORT",
                        help="also the baseline and 10^9 runs on this Ray cluster")
    parser.add_argument("--skip-part1", action="store_true",
                        help="keep part 1 from the last results file")
    args = parser.parse_args()
    earlier = json.loads((C.RESULTS / "sparse_scale.json").read_text()) if args.skip_part1 else {}
    result: dict[str, Any] = {"machine": C.machine_info(), "part1": earlier.get("part1") or
                              part1(args.passes, args.batches, args.batch)}
    if args.runs:
        result["part2"] = part2(None)
    elif "part2" in earlier:
        result["part2"] = earlier["part2"]
    if args.ray:
        result["ray"] = part2(args.ray)
    elif "ray" in earlier:
        result["ray"] = earlier["ray"]
    C.write_result("sparse_scale", result)
    C.update_docs_section(TITLE, docs(result))
    print(docs(result))


if __name__ == "__main__":
    main()
