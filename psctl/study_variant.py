"""How one invocation of ``psctl study`` differs from its file (``--backend``, ``--only``,
``--tuned-from``): light, so that ``psctl --help`` imports nothing of the engine for it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """How this invocation differs from the file: another backend, some axis values only, the
    points at an earlier tuning's best. Named in the report's command and, for another
    backend, its folder (results/NAME-BACKEND: a simulated study's report is not overwritten
    by its check on real processes)."""

    backend: str | None = None
    only: tuple[str, ...] = ()
    tuned_from: Path | None = None

    def options(self) -> list[str]:
        words = [] if self.backend is None else ["--backend", self.backend]
        for item in self.only:
            words += ["--only", item]
        if self.tuned_from is not None:
            words += ["--tuned-from", str(self.tuned_from)]
        return words

    def folder(self, name: str) -> str:
        return name if self.backend is None else f"{name}-{self.backend}"
