"""The analysis of bench/wire_codecs.py on hand-built samples: bytes and time against none, the
median of per-round time ratios, and a verdict that names the smallest and the cheapest codec."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import wire_codecs as bench  # noqa: E402


def _sizes() -> dict[str, dict[str, Any]]:
    per_frame = {"none": 1000, "lz4": 900, "zstd": 700, "snappy": 950}
    sizes = {}
    for value_type, scale in (("float32", 1.0), ("float16", 0.75)):
        for codec, size in per_frame.items():
            sizes[f"{value_type}/{codec}"] = {"bytes_total": int(4 * size * scale), "frames": 4,
                                              "frames_sent_raw": 1 if codec == "snappy" else 0}
    return sizes


def _rounds() -> list[dict[str, dict[str, float]]]:
    # none 10 us + 10 us; zstd 3x in round 1 and 4x in round 2 (median 3.5x), lz4 1.5x, snappy 2x
    factors = [{"none": 1.0, "lz4": 1.5, "zstd": 3.0, "snappy": 2.0},
               {"none": 2.0, "lz4": 3.0, "zstd": 8.0, "snappy": 4.0}]
    return [{f"{vt}/{codec}": {"encode_s": 10e-6 * f, "decode_s": 10e-6 * f}
             for vt in bench.VALUE_TYPES for codec, f in one.items()} for one in factors]


def test_summarise_gives_bytes_and_time_against_none() -> None:
    rows = {r["codec"]: r for r in bench.summarise(_sizes(), _rounds(), "float32")}
    assert list(rows) == list(bench.CODEC_NAMES)
    assert rows["none"]["bytes_ratio"] == 1.0 and rows["none"]["time_ratio"] == 1.0
    assert rows["zstd"]["bytes_per_frame"] == 700
    assert abs(rows["zstd"]["bytes_ratio"] - 0.7) < 1e-12
    assert abs(rows["zstd"]["time_ratio"] - 3.5) < 1e-12  # median of the per-round ratios
    assert rows["zstd"]["time_ratio_range"] == [3.0, 4.0]
    assert abs(rows["lz4"]["total_us"] - 1e6 * (30e-6 + 60e-6) / 2) < 1e-9
    assert rows["snappy"]["frames_sent_raw"] == 1


def test_parts_table_gives_packed_shares() -> None:
    parts = {"float32/none": {"keys_raw": 100, "keys_packed": 100, "values_raw": 200,
                              "values_packed": 200},
             "float32/zstd": {"keys_raw": 100, "keys_packed": 40, "values_raw": 200,
                              "values_packed": 190}}
    assert bench.parts_table(parts)[2:] == ["| float32 | zstd | 40.0% | 95.0% |"]


def test_table_rows_and_verdict() -> None:
    rows = [r for vt in bench.VALUE_TYPES for r in bench.summarise(_sizes(), _rounds(), vt)]
    lines = bench.table(rows)
    assert lines[0].startswith("| values | codec | bytes per frame | bytes vs none |")
    assert len(lines) == 2 + 8
    assert "| float32 | zstd | 700 | 0.700 | 55.0 | 55.0 | 110.0 | 3.50x (3.00-4.00) | 0 of 4 |" \
        in lines
    text = bench.verdict(rows)
    assert "float32 values: the smallest frames come from zstd, 70.0% of none's bytes" in text
    assert "none's time); snappy" not in text  # snappy sent one frame raw, not all four
    all_raw = [{**r, "frames_sent_raw": r["frames"]} if r["codec"] in ("lz4", "snappy") else r
               for r in rows]
    assert "; lz4 and snappy shrank no frame (every one was sent raw" in bench.verdict(all_raw)
    assert text.endswith("float16 values alone make a frame 75.0% of the float32 frame's bytes.")
