"""How long one push of new keys holds a sparse shard's loop in its key -> row map (issue 57).

A sparse shard stores keys as they first arrive (``engine.keyrows.KeyRows``). The bench adds
batches of ``--batch`` new random 40-bit keys (a frame's most, MAX_LIST_KEYS = 16,384, by default)
the way a shard server's push does (``find``, then ``add`` of the keys not stored) until the map
holds ``--keys`` keys, and reports per size (by powers of two) the slowest call and the median,
with the pairs the call copied or searched for the map's merges and the number of sorted runs.
Before issue 57 the map merged its two runs in one call: 1.5 s at 16.8 million keys.

Run: ``python bench/keyrows.py`` (about 40 s) or ``--quick`` (2 million keys, docs untouched).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench import _common as C
from engine.keyrows import KeyRows
from engine.wire.protocol import MAX_LIST_KEYS

TITLE = "Sparse shard key map: the longest push (bench/keyrows.py)"


def measure(total: int, batch: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = KeyRows(1 << 40)
    buckets: dict[int, list[tuple[float, int, int]]] = {}
    while rows.used < total:
        keys = np.unique(rng.integers(0, 1 << 40, size=batch))
        started = time.perf_counter()
        found = rows.find(keys)
        rows.add(keys[found < 0])
        took = time.perf_counter() - started
        size = 1 << (rows.used.bit_length() - 1)
        buckets.setdefault(size, []).append((took, rows.last_work, rows.runs))
    return [{"keys_from": size, "pushes": len(calls),
             "slowest_ms": max(t for t, _, _ in calls) * 1e3,
             "median_ms": statistics.median(t for t, _, _ in calls) * 1e3,
             "most_merge_pairs": max(w for _, w, _ in calls),
             "most_runs": max(r for _, _, r in calls)}
            for size, calls in sorted(buckets.items()) if size >= 1 << 20]


def docs(result: dict[str, Any]) -> str:
    intro = C.paragraph(f"""
        One push of {result['batch']:,} new keys (a key-list frame's most) into a sparse
        shard's key -> row map, as a shard server does it (find, then add the keys not stored),
        until the map holds {result['keys']:,} keys; per size, the slowest and the median call,
        the most pairs one call copied or searched for the map's merges, and the most sorted
        runs a lookup searched. The map merges its runs a slice at a time, each push doing a
        share of the pending merges in proportion to the keys it adds (engine/keyrows.py), so
        the slowest push grows with the number of runs (a binary search each), not with the
        keys stored. Before this change one merge copied the whole map in one call: 0.78 s at
        8.4 million keys and 1.5 s at 16.8 million on this machine.
        """)
    lines = ["| keys stored | pushes | slowest (ms) | median (ms) | most merge pairs a push | "
             "most runs |", "|---|---|---|---|---|---|"]
    lines += [f"| {row['keys_from'] / 1e6:.1f} M+ | {row['pushes']} | {row['slowest_ms']:.0f} | "
              f"{row['median_ms']:.0f} | {row['most_merge_pairs']:,} | {row['most_runs']} |"
              for row in result["sizes"]]
    reproduce = C.paragraph("""
        Reproduce: `python bench/keyrows.py` (about 40 s; `--quick` for a smoke test). Raw
        numbers: `bench/results/keyrows.json`.
        """)
    return "\n".join([intro, "", *lines, "", reproduce, "", C.machine_note(result["machine"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=20_000_000)
    parser.add_argument("--batch", type=int, default=MAX_LIST_KEYS)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    keys = 2_000_000 if args.quick else args.keys
    result = {"keys": keys, "batch": args.batch, "machine": C.machine_info(),
              "sizes": measure(keys, args.batch)}
    for row in result["sizes"]:
        print(row)
    if not args.quick:
        C.write_result("keyrows", result)
        C.update_docs_section(TITLE, docs(result))


if __name__ == "__main__":
    main()
