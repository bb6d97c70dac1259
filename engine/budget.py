"""A run's budget (``--budget``, config ``stop.budget``): how much training every worker does,
in seconds of training, samples or updates, instead of a number of epochs of its own.

With a budget every worker trains until the budget is spent, cycling over its shard (a fresh
permutation each pass), so that no worker runs out of data and trains on while the others have
stopped: the run ends for all of them at once. Seconds count from the first iteration (the
workers' start), so start-up is not spent from the budget. Samples and updates count every
worker's: an update is one gradient a worker computed (one iteration). The model is tested at
``MARKS`` of the budget as well as every ``eval.interval_s``, and at its end.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

Unit = Literal["s", "samples", "updates"]
MARKS = (0.25, 0.5, 0.75)  # fractions of the budget the model is tested at (and at its end)
# Epochs a worker runs under a budget: more than any budget will spend (it stops the run first).
UNBOUNDED_EPOCHS = 10**6
_FORM = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*(s|samples|updates)\s*$", re.I)


@dataclass(frozen=True, slots=True)
class Budget:
    amount: float
    unit: Unit

    @property
    def text(self) -> str:
        """The canonical spelling, which ``parse_budget`` reads back to an equal budget."""
        number = f"{self.amount:g}" if self.unit == "s" else f"{int(self.amount)}"
        return f"{number}{self.unit}"

    def marks(self) -> tuple[float, ...]:
        """The amounts spent at which the model is tested, before the end."""
        return tuple(self.amount * fraction for fraction in MARKS)


def parse_budget(text: str) -> Budget:
    """``300s``, ``50000samples`` or ``2000updates``; a ValueError says what to write."""
    found = _FORM.match(text)
    if found is None:
        raise ValueError(f"budget {text!r}: write SECONDSs, Nsamples or Nupdates (e.g. 300s, "
                         "60000samples, 2000updates)")
    amount, unit = float(found.group(1)), found.group(2).lower()
    if not (math.isfinite(amount) and amount > 0):
        raise ValueError(f"budget {text!r}: the amount must be positive")
    if unit != "s" and amount != int(amount):
        raise ValueError(f"budget {text!r}: {unit} are counted whole")
    if amount > 10**12:
        raise ValueError(f"budget {text!r}: at most 10^12")
    return Budget(amount, unit)  # type: ignore[arg-type]  # the pattern allows only Unit's


def budget_of(text: str | None) -> Budget | None:
    return None if text is None else parse_budget(text)


def epochs_to_run(epochs: int, budget: str | None) -> int:
    """Each worker's epochs: the configured ones, or without end under a budget."""
    return epochs if budget is None else UNBOUNDED_EPOCHS
