"""Choosing runs: selectors (id, prefix, name, @last~N) and ``--where key=value`` filters.

A ``--where`` key is looked up, in order, as a dotted config key (``optimizer.lr``), a run column
(``name``, ``status``, ``sync``, ``dataset``, ``workers``, ``servers``), a tag (``tag.KEY`` or
plain ``KEY``), then as the last part of exactly one config key (``lr`` for ``optimizer.lr``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import RunNotFound

if TYPE_CHECKING:  # the database layer is imported when runs are selected, not with the CLI
    from sqlalchemy import Engine

    from engine.db.metrics import RunRecord

RUN_COLUMNS = ("name", "status", "sync", "dataset", "workers", "servers")


class UsageError(ValueError):
    """A malformed option value; the CLI reports it with exit code 2."""


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as dotted keys: {"cluster": {"workers": 2}} -> {"cluster.workers": 2}."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def text(value: Any) -> str:
    """How a value is written and compared on the command line (JSON for lists and bools)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value)


def parse_pairs(pairs: Sequence[str], option: str) -> list[tuple[str, str]]:
    from engine.db.queries import quoted

    parsed = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{option} takes KEY=VALUE, got {quoted(pair)}")
        parsed.append((key.strip(), value.strip()))
    return parsed


def select_runs(
    engine: Engine, selectors: Sequence[str], where: Sequence[str], *, crash_after_s: float
) -> list[RunRecord]:
    """The runs named by ``selectors`` (all runs, oldest first, if none) that match ``where``."""
    from engine.db.metrics import run_records
    from engine.db.queries import list_runs, quoted, resolve_run

    conditions = parse_pairs(where, "--where")
    if selectors:
        ids = list(dict.fromkeys(resolve_run(engine, s) for s in selectors))
    else:
        ids = [run.id for run in reversed(list_runs(engine))]
    if not ids:
        raise RunNotFound("no runs have been recorded in this database yet")
    records = run_records(engine, ids, crash_after_s=crash_after_s)
    for key, _ in conditions:
        _check_known(key, records)
    chosen = [r for r in records if all(_matches(r, k, v) for k, v in conditions)]
    if not chosen:
        shown = quoted(" ".join(where))
        raise RunNotFound(f"no run among the {len(records)} selected matches --where {shown}")
    return chosen


def lookup(record: RunRecord, key: str) -> tuple[bool, Any]:
    """(found, value) of ``key`` for one run, by the order in the module docstring."""
    config = flatten(record.config)
    if key in config:
        return True, config[key]
    if key in RUN_COLUMNS:
        return True, getattr(record.summary, key)
    tag = key.removeprefix("tag.")
    if tag in record.tags:
        return True, record.tags[tag]
    leaves = [k for k in config if k.rsplit(".", 1)[-1] == key]
    if len(leaves) == 1:
        return True, config[leaves[0]]
    return False, None


def _matches(record: RunRecord, key: str, wanted: str) -> bool:
    found, value = lookup(record, key)
    if not found:
        return False
    if text(value) == wanted:
        return True
    # 0.1 and 1e-1, 8 and 8.0 name the same number.
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _check_known(key: str, records: Sequence[RunRecord]) -> None:
    from engine.db.queries import quoted

    if any(lookup(r, key)[0] for r in records) or key.startswith("tag."):
        return
    known = sorted({k for r in records for k in flatten(r.config)} | set(RUN_COLUMNS))
    # The nearest keys say what was probably meant; without any, a few to show the form.
    near = difflib.get_close_matches(key[:200], known, n=6, cutoff=0.6) or known[:8]
    raise UsageError(
        f"unknown key {quoted(key)} in --where; use a config key, a run column or a tag, e.g. "
        + ", ".join(near)
    )
