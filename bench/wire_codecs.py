"""Wire codecs on a real pruned push: bytes per frame and encode + decode time, none vs lz4,
zstd and snappy, with float32 and float16 values.

The frames are the ones a worker of ``psctl launch --dataset mnist --servers 2 --prune topk:1%``
sends: the default MNIST MLP (784-512-512-512-10, ``engine.models.flat``) computes real gradients
on real MNIST batches of 64 (``engine.models.flat.train_step_np``), its push filter
(``engine.worker.filters.GradientFilter``, top-1 % of each layer, error feedback on) picks the
keys, and the model takes the pushed values as a plain SGD step (lr 0.1), as a single worker
under asp would; after a warm-up, each push becomes one sparse PUSH frame per shard (sorted
uint32 keys, values in the wire type; the key space split as ``RangePartitioner`` splits it for
two servers), exactly as ``ParameterClient`` builds them. Each frame is encoded with
``engine.wire.protocol.encode`` (``Frame(codec=...)``) and decoded with ``decode``, the
functions a worker and a shard server call.

Measured per codec and value type: bytes per frame as sent (``encode`` falls back to a raw body
where packing does not shrink it; such frames are counted), encode and decode time per frame.
Each sample times every frame, enough times to last at least ``--sample-s``; each round takes
one sample of every codec, in an order that alternates between rounds, and a codec's time
ratio is the median over rounds of its time / none's time in the same round.

Reproduce: ``python bench/wire_codecs.py`` (about 30 s; ``--quick`` for a smoke test, docs
untouched). Raw samples: ``bench/results/wire_codecs.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import _common as C  # noqa: E402

NAME = "wire_codecs"
DOCS_TITLE = "Wire codecs on a top-1% sparse push (bench/wire_codecs.py; issue 15, acceptance 5)"
BASELINE = "none"
CODEC_NAMES = ("none", "lz4", "zstd", "snappy")
VALUE_TYPES = ("float32", "float16")
PRUNE = "topk:1%"
SERVERS = 2
LR = 0.1
MAX_FRAME_BYTES = C.MAX_FRAME_BYTES


# -- the frames ----------------------------------------------------------------------------------


def build_pushes(data_dir: str | None, *, warmup: int, pushes: int, seed: int = 0,
                 dataset: str = "mnist") -> dict[str, Any]:
    """``pushes`` top-1 % pushes of the MNIST MLP after ``warmup`` steps: per push, per shard,
    (shard span, sorted keys, float32 values)."""
    import numpy as np

    from engine.datasets.loader import load_dataset
    from engine.keys import RangePartitioner, split_keys_by_shard
    from engine.models.flat import FlatModel, train_step_np
    from engine.models.spec import MLPSpec
    from engine.worker.filters import GradientFilter, parse_prune

    data = load_dataset(dataset, Path(data_dir) if data_dir else None, allow_download=False)
    spec = MLPSpec(data.spec.input_dim, C.HIDDEN, int(data.spec.num_classes))
    model = FlatModel(spec, seed=seed)
    shards = RangePartitioner().ranges(spec.num_keys, SERVERS)
    filt = GradientFilter(parse_prune(PRUNE), [s.keys for s in spec.segments()], spec.num_keys)
    rng = np.random.default_rng(seed)
    frames: list[list[tuple[tuple[int, int], np.ndarray, np.ndarray]]] = []
    losses = []
    for step in range(warmup + pushes):
        batch = rng.choice(len(data.train_x), 64, replace=False)
        losses.append(train_step_np(model, data.train_x[batch], data.train_y[batch]))
        keys, values = filt.apply(model.grads_np)
        model.params_np[keys] -= LR * values  # what the servers would apply (one worker, asp)
        if step < warmup:
            continue
        frames.append([((shards[i].start, shards[i].end), keys[mine].astype(np.uint32),
                        values[mine].copy())
                       for i, mine in split_keys_by_shard(keys, shards)])
    return {"frames": frames, "num_keys": spec.num_keys, "shards": [(s.start, s.end)
                                                                      for s in shards],
            "loss_first": losses[0], "loss_last": losses[-1],
            "keys_per_push": statistics.mean(sum(len(k) for _, k, _ in p) for p in frames)}


def make_frames(pushes: list[list[tuple[tuple[int, int], Any, Any]]], value_type: str,
                codec: str) -> list[Any]:
    """The PUSH frames of ``pushes`` with values in ``value_type`` and bodies packed by
    ``codec``, built as ``ParameterClient._part`` builds them."""
    import numpy as np

    from engine.keys import KeyRange
    from engine.wire.codecs import CODECS, narrow
    from engine.wire.protocol import FLAG_COMMIT, Frame, MsgType, Role, numpy_dtype, wire_dtype

    dtype = wire_dtype(value_type)
    code = CODECS.get(codec).code
    frames = []
    for number, push in enumerate(pushes):
        for (start, end), keys, values in push:
            frames.append(Frame(MsgType.PUSH, number + 1, KeyRange(start, end), run=C.RUN_ID,
                                role=Role.WORKER, rank=0, clock=number, flags=FLAG_COMMIT,
                                dtype=dtype, payload=narrow(values, numpy_dtype(dtype)),
                                index=np.asarray(keys), codec=code))
    return frames


def check_round_trip(frames: list[Any]) -> dict[str, int]:
    """Decode every encoded frame and compare it with what was framed; bytes and raw fallbacks."""
    import numpy as np

    from engine.wire.protocol import decode, encode

    sizes, raw = [], 0
    for frame in frames:
        data = encode(frame)
        back = decode(data, max_bytes=MAX_FRAME_BYTES)
        if back.index is None or not (np.array_equal(back.index, frame.index)
                and np.array_equal(back.values, frame.payload) and back.keys == frame.keys):
            raise AssertionError(f"frame {frame.request_id} did not survive {frame.codec.name}")
        sizes.append(len(data))
        raw += int(back.codec != frame.codec)
    return {"bytes_total": sum(sizes), "frames": len(frames), "frames_sent_raw": raw,
            "min_bytes": min(sizes), "max_bytes": max(sizes)}


def part_sizes(pushes: list[list[tuple[tuple[int, int], Any, Any]]], value_type: str,
               codec: str) -> dict[str, int]:
    """Raw and packed bytes of the key lists alone and of the values alone (a diagnostic: which
    part of a frame packs)."""
    from engine.wire.codecs import CODECS, narrow, pack
    from engine.wire.protocol import numpy_dtype, wire_dtype

    code = CODECS.get(codec).code
    dtype = numpy_dtype(wire_dtype(value_type))
    totals = {"keys_raw": 0, "keys_packed": 0, "values_raw": 0, "values_packed": 0}
    for push in pushes:
        for _, keys, values in push:
            for part, array in (("keys", keys), ("values", narrow(values, dtype))):
                raw = memoryview(array.tobytes())
                totals[f"{part}_raw"] += len(raw)
                totals[f"{part}_packed"] += len(raw) if codec == BASELINE else len(pack(code, raw))
    return totals


def time_sample(frames: list[Any], min_s: float) -> dict[str, float]:
    """Seconds per frame to encode, and to decode, from sweeps over all ``frames`` repeated
    until each phase has lasted at least ``min_s``: ``*_s`` from the fastest sweep (timeit's
    convention: a slower sweep was interrupted by something else on the machine), ``*_mean_s``
    over all of them."""
    from engine.wire.protocol import decode, encode

    encoded = [encode(frame) for frame in frames]
    result = {}
    for phase in ("encode", "decode"):
        sweeps: list[float] = []
        started = time.perf_counter()
        while True:
            begun = time.perf_counter()
            if phase == "encode":
                for frame in frames:
                    encode(frame)
            else:
                for data in encoded:
                    decode(data, max_bytes=MAX_FRAME_BYTES)
            ended = time.perf_counter()
            sweeps.append(ended - begun)
            if ended - started >= min_s:
                break
        result[f"{phase}_s"] = min(sweeps) / len(frames)
        result[f"{phase}_mean_s"] = sum(sweeps) / (len(sweeps) * len(frames))
    return result


# -- analysis (pure; tests/bench/test_codecs_bench.py) --------------------------------------------


def summarise(sizes: dict[str, dict[str, Any]], rounds: list[dict[str, dict[str, Any]]],
              value_type: str) -> list[dict[str, Any]]:
    """One row per codec for ``value_type``: ``sizes[key]`` from ``check_round_trip`` and
    ``rounds`` (each: key -> ``time_sample``), key ``"value_type/codec"``."""
    base_key = f"{value_type}/{BASELINE}"
    base_bytes = sizes[base_key]["bytes_total"] / sizes[base_key]["frames"]
    rows = []
    for codec in CODEC_NAMES:
        key = f"{value_type}/{codec}"
        if key not in sizes:
            continue
        per_frame = sizes[key]["bytes_total"] / sizes[key]["frames"]
        totals = [r[key]["encode_s"] + r[key]["decode_s"] for r in rounds]
        ratios = [(r[key]["encode_s"] + r[key]["decode_s"])
                  / (r[base_key]["encode_s"] + r[base_key]["decode_s"]) for r in rounds]
        rows.append({
            "value_type": value_type, "codec": codec, "bytes_per_frame": per_frame,
            "bytes_ratio": per_frame / base_bytes,
            "frames_sent_raw": sizes[key]["frames_sent_raw"], "frames": sizes[key]["frames"],
            "encode_us": 1e6 * C.median([r[key]["encode_s"] for r in rounds]),
            "decode_us": 1e6 * C.median([r[key]["decode_s"] for r in rounds]),
            "total_us": 1e6 * C.median(totals),
            "time_ratio": C.median(ratios),
            "time_ratio_range": [min(ratios), max(ratios)],
        })
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| values | codec | bytes per frame | bytes vs none | encode µs | decode µs | "
             "encode + decode µs | time vs none (min-max over rounds) | frames sent raw |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        low, high = row["time_ratio_range"]
        lines.append(
            f"| {row['value_type']} | {row['codec']} | {row['bytes_per_frame']:,.0f} | "
            f"{row['bytes_ratio']:.3f} | {row['encode_us']:.1f} | {row['decode_us']:.1f} | "
            f"{row['total_us']:.1f} | {C.fmt_ratio(row['time_ratio'])} "
            f"({low:.2f}-{high:.2f}) | {row['frames_sent_raw']} of {row['frames']} |")
    return lines


def parts_table(parts: dict[str, dict[str, int]]) -> list[str]:
    """Packed size of the key lists alone and of the values alone, per codec and value type."""
    lines = ["| values | codec | key lists packed to | values packed to |", "|---|---|---:|---:|"]
    for key, part in parts.items():
        value_type, codec = key.split("/")
        if codec == BASELINE:
            continue
        lines.append(f"| {value_type} | {codec} | "
                     f"{part['keys_packed'] / part['keys_raw']:.1%} | "
                     f"{part['values_packed'] / part['values_raw']:.1%} |")
    return lines


def verdict(rows: list[dict[str, Any]]) -> str:
    """The smallest frames per value type and what they cost, from the rows only."""
    parts = []
    for value_type in VALUE_TYPES:
        mine = [r for r in rows if r["value_type"] == value_type]
        packed = [r for r in mine if r["codec"] != BASELINE]
        if not mine or not packed:
            continue
        best = min(packed, key=lambda r: r["bytes_ratio"])
        text = (f"{value_type} values: the smallest frames come from {best['codec']}, "
                f"{best['bytes_ratio']:.1%} of none's bytes ({1 - best['bytes_ratio']:.1%} "
                f"fewer), at {best['total_us']:.0f} µs per frame to encode and decode "
                f"({C.fmt_ratio(best['time_ratio'])} none's time)")
        never = [r["codec"] for r in packed if r["frames_sent_raw"] == r["frames"]]
        if never:
            text += (f"; {' and '.join(never)} shrank no frame (every one was sent raw, so "
                     "they cost only the attempt)")
        parts.append(text + ".")
    f32 = {r["codec"]: r for r in rows if r["value_type"] == "float32"}
    f16 = {r["codec"]: r for r in rows if r["value_type"] == "float16"}
    if BASELINE in f32 and BASELINE in f16:
        share = f16[BASELINE]["bytes_per_frame"] / f32[BASELINE]["bytes_per_frame"]
        parts.append(f"float16 values alone make a frame {share:.1%} of the float32 frame's "
                     "bytes.")
    return " ".join(parts)


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--warmup", type=int, default=100,
                        help="pushes before the measured ones (the model trains meanwhile)")
    parser.add_argument("--pushes", type=int, default=16, help="pushes measured (2 frames each)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample-s", type=float, default=0.1,
                        help="least seconds per encode (and decode) sample")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    C.reexec_with_malloc_env()
    dataset = "mnist"
    if args.quick:
        args.warmup, args.pushes, args.rounds, args.sample_s = 5, 4, 3, 0.02
        dataset, args.data_dir = "digits", None
    info = C.machine_info()
    started = time.perf_counter()
    built = build_pushes(args.data_dir, warmup=args.warmup, pushes=args.pushes, dataset=dataset)
    print(f"built {len(built['frames'])} pushes of {built['keys_per_push']:.0f} keys "
          f"(loss {built['loss_first']:.3f} -> {built['loss_last']:.3f})", flush=True)
    frames = {f"{vt}/{codec}": make_frames(built["frames"], vt, codec)
              for vt in VALUE_TYPES for codec in CODEC_NAMES}
    sizes = {key: check_round_trip(group) for key, group in frames.items()}
    parts = {f"{vt}/{codec}": part_sizes(built["frames"], vt, codec)
             for vt in VALUE_TYPES for codec in CODEC_NAMES}
    rounds = []
    keys = list(frames)
    for number in range(args.rounds):
        order = keys if number % 2 == 0 else list(reversed(keys))
        rounds.append({key: time_sample(frames[key], args.sample_s) for key in order})
    rows = [row for vt in VALUE_TYPES for row in summarise(sizes, rounds, vt)]
    lines = table(rows)
    print("\n".join(lines))
    print(verdict(rows))
    print("\n".join(parts_table(parts)))
    payload = {
        "parameters": {k: v for k, v in vars(args).items()},
        "machine": info,
        "model": {"num_keys": built["num_keys"], "shards": built["shards"], "prune": PRUNE,
                  "keys_per_push": built["keys_per_push"], "loss_first": built["loss_first"],
                  "loss_last": built["loss_last"], "dataset": dataset},
        "sizes": sizes, "parts": parts, "rounds": rounds, "rows": rows,
        "elapsed_s": time.perf_counter() - started,
    }
    if args.quick:
        return payload
    C.write_result(NAME, payload)
    C.update_docs_section(DOCS_TITLE, "\n".join(C.wrap_lines(docs_body(payload))))
    return payload


def docs_body(payload: dict[str, Any]) -> list[str]:
    model, params = payload["model"], payload["parameters"]
    rows = payload["rows"]
    frames = rows[0]["frames"] if rows else 0
    return [
        f"The sparse PUSH frames of `psctl launch --dataset mnist --servers 2 --prune {PRUNE}`, "
        "encoded and decoded with `engine.wire.protocol.encode` / `decode` (`Frame(codec=...)`) "
        "in one process. The gradients are real: the default MNIST MLP (784-512-512-512-10, "
        f"{model['num_keys']:,} keys) on real MNIST batches of 64, through the worker's push "
        f"filter (top-1 % of each layer, error feedback on), the model taking each push as an "
        f"SGD step (lr {LR:g}, one worker); after {params['warmup']} warm-up pushes (loss "
        f"{model['loss_first']:.2f} to {model['loss_last']:.2f}), {params['pushes']} pushes "
        f"of {model['keys_per_push']:,.0f} keys each, one frame per shard ({frames} frames per "
        "row: sorted uint32 keys and the values in the wire type). Times are per frame, medians "
        f"of {params['rounds']} rounds; each round's sample is the fastest sweep over all the "
        f"frames within at least {params['sample_s']:g} s per phase (timeit's convention; the "
        "codecs' order alternates between rounds); *time vs none* is the median of the "
        "per-round ratios to none's encode + decode time, with their range.",
        "",
        *table(rows),
        "",
        verdict(rows),
        "",
        "Where `encode` finds that packing does not shrink a frame it sends it raw (last "
        "column). Which part of a frame packs (the same frames' key lists alone and values "
        "alone, each packed on its own):",
        "",
        *parts_table(payload["parts"]),
        "",
        "Reproduce: `python bench/wire_codecs.py` (about 30 s; `--quick` for a smoke test on "
        "digits). Raw samples: `bench/results/wire_codecs.json`.",
        "",
        C.machine_note(payload["machine"]),
    ]


if __name__ == "__main__":
    main()
