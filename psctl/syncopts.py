"""Parsing of the consistency and heterogeneity flags of ``psctl launch``.

``--straggler 2:3x@60s`` (worker 2 three times slower from 60 s on), ``--jitter lognormal:0.3``
and ``--history RUN`` become plain config values here, so the resolved config stored with the
run says exactly what was injected and what seeded the predictor.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

_STRAGGLER = re.compile(
    r"^\s*(?P<rank>\d+)\s*:\s*(?P<factor>\d+(?:\.\d+)?)\s*x?\s*"
    r"(?:@\s*(?P<onset>\d+(?:\.\d+)?)\s*(?P<unit>s|m)?)?\s*$")
_JITTER = re.compile(r"^\s*(?P<dist>[a-z]+)\s*:\s*(?P<sigma>\d+(?:\.\d+)?)\s*$")
JITTER_DISTRIBUTIONS = ("lognormal", "exponential")


def parse_straggler(text: str) -> dict[str, Any]:
    """``RANK:FACTOR[x][@ONSET[s|m]]``, e.g. ``2:3x`` or ``0:1.5x@90s``."""
    match = _STRAGGLER.match(text)
    if match is None:
        raise ConfigError(f"--straggler {text!r}: expected RANK:FACTOR[@ONSET], e.g. 2:3x or "
                          "2:3x@60s (worker 2 three times slower, from 60 s on)")
    onset = float(match["onset"] or 0.0) * (60.0 if match["unit"] == "m" else 1.0)
    factor = float(match["factor"])
    if factor < 1.0:
        raise ConfigError(f"--straggler {text!r}: the factor must be at least 1 (1 = no slowdown)")
    return {"rank": int(match["rank"]), "factor": factor, "onset_s": onset}


def parse_jitter(text: str) -> dict[str, Any]:
    """``DISTRIBUTION:SIGMA``, e.g. ``lognormal:0.3``."""
    match = _JITTER.match(text)
    if match is None or match["dist"] not in JITTER_DISTRIBUTIONS:
        raise ConfigError(f"--jitter {text!r}: expected DISTRIBUTION:SIGMA with a distribution "
                          f"among {', '.join(JITTER_DISTRIBUTIONS)}, e.g. lognormal:0.3")
    return {"distribution": match["dist"], "sigma": float(match["sigma"])}


def sync_overrides(*, stragglers: list[str] | None, jitter: str | None, history: str | None,
                   db: Path) -> dict[str, Any]:
    """Dotted config overrides for the flags that need parsing or a database lookup."""
    overrides: dict[str, Any] = {}
    if stragglers:
        overrides["heterogeneity.stragglers"] = [parse_straggler(s) for s in stragglers]
    if jitter:
        overrides["heterogeneity.jitter"] = parse_jitter(jitter)
    if history:
        overrides["sync.history"] = read_history(db, history).model_dump(mode="json")
    return overrides


def read_history(db: Path, selector: str) -> Any:
    from engine.analysis.replay import history_seed
    from engine.db import open_engine
    from engine.db.queries import resolve_run

    engine = open_engine(db, readonly=True)
    try:
        return history_seed(engine, resolve_run(engine, selector))
    finally:
        engine.dispose()
