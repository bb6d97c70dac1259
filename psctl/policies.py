"""Help texts read from the policies' registries, so that a new consistency model shows up in
them without touching the CLI (``psctl launch``'s own are made from the settings' fields:
psctl/launch_options.py)."""

from __future__ import annotations

from engine.consistency.registry import CHANGING_WORKERS, CONSISTENCY_MODELS

SCALE_WORKERS_HELP = ("the number of workers the job should have ("
                      + ", ".join(CONSISTENCY_MODELS.able(CHANGING_WORKERS)) + ")")
