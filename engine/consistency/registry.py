"""The consistency models by name: ``--sync``'s choices, the config's allowed values and the docs'
table all come from ``CONSISTENCY_MODELS``. A new model is one module plus a line here (or its
own registration, from its module). Each is registered ``Lazy``: listing and checking the models
imports none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.registry import Lazy, Registry

if TYPE_CHECKING:
    from engine.config import RunConfig, SyncConfig
    from engine.consistency.base import ConsistencyController

# (sync settings, workers, clock ranges on the shard) -> the shard's controller
ControllerFactory = Callable[["SyncConfig", int, int], "ConsistencyController"]

CONSISTENCY_MODELS: Registry[ControllerFactory] = Registry("consistency model")
# Its servers count a changing set of workers: a running job may grow or shrink (psctl scale).
CHANGING_WORKERS = "changing-workers"
# A copy of a key range may be handed to another server mid-run (re-replication, psctl scale
# --servers): nothing the copy needs lives outside the shard's values and clocks.
HANDOFF = "handoff"
# Its servers answer every pull at once: a worker may prefetch or compute on an old copy
# (train.overlap, Downpour's settings) without a clock ever waiting for it.
ASYNCHRONOUS = "asynchronous"
# Its workers keep sync.delay iterations of communication in flight behind computation (the
# delayed loop), their pulls stamped with the iteration they gate.
OWN_DELAY = "own-delay"
# A pull for clock c is ready once every worker has pushed the clocks before c - sync.staleness
# (SSP's bound, DSSP's lower one): a worker may answer a read from a copy it fetched while that
# copy's slowest clock is still within the bound (sync.cache; engine.worker.cache).
CACHED_READS = "cached-reads"


def _runs_delayed_loop(run: RunConfig) -> None:
    """Bounded delay's pulls are stamped by the delayed loop (or the sparse loop, which keeps
    the same dependency); another loop would run it as ssp."""
    if run.train.loop not in ("auto", "sparse", "delayed"):
        raise ValueError(f"train.loop {run.train.loop} does not fit sync.model "
                         f"{run.sync.model}: bounded-delay runs the delayed loop, and only it "
                         "does")


CONSISTENCY_MODELS.register(
    "bsp", Lazy("engine.consistency.base:build_bsp"),
    "bulk synchronous: every clock waits for every worker; staleness 0",
    capabilities=frozenset({HANDOFF}))
CONSISTENCY_MODELS.register(
    "asp", Lazy("engine.consistency.base:build_asp"),
    "asynchronous: every push applied at once, no waiting",
    capabilities=frozenset({CHANGING_WORKERS, HANDOFF, ASYNCHRONOUS}))
CONSISTENCY_MODELS.register(
    "ssp", Lazy("engine.consistency.ssp:build_ssp"),
    "stale synchronous: the fastest leads the slowest by at most --staleness clocks",
    capabilities=frozenset({CHANGING_WORKERS, HANDOFF, CACHED_READS}))
CONSISTENCY_MODELS.register(
    "bounded-delay", Lazy("engine.consistency.ssp:build_bounded_delay"),
    "OSDI'14: no worker computes iteration c before every worker's pushes before c - --delay "
    "are in; up to --delay iterations of communication in flight",
    capabilities=frozenset({CHANGING_WORKERS, HANDOFF, OWN_DELAY}),
    requires=(_runs_delayed_loop,))
CONSISTENCY_MODELS.register(
    "dssp", Lazy("engine.consistency.ssp:build_dssp"),
    "dynamic SSP: the bound stretches within [S, S+R] when waiting would be idle time",
    capabilities=frozenset({CHANGING_WORKERS, HANDOFF, CACHED_READS}))
CONSISTENCY_MODELS.register(
    "elastic", Lazy("engine.consistency.elastic:build_elastic"),
    "ElasticBSP: barriers placed by ZipLine where predicted waiting is least")
# ElasticBSP neither: it counts a fixed set of workers in every round, and places its barriers
# from a timing history that a copy handed over cannot have.


def asynchronous(run: RunConfig) -> bool:
    """Whether the run's consistency model answers every pull at once."""
    return CONSISTENCY_MODELS.can(run.sync.model, ASYNCHRONOUS)


def read_bound(run: RunConfig) -> int | None:
    """How many clocks behind a worker's cached copy may be and still answer its reads (the
    copy holds every push of the clocks below its slowest clock); None: every read fetches."""
    if run.sync.cache and CONSISTENCY_MODELS.can(run.sync.model, CACHED_READS):
        return run.sync.staleness
    return None


def asynchronous_names() -> str:
    """The models that answer every pull at once, for messages: ``asp``."""
    return " or ".join(CONSISTENCY_MODELS.able(ASYNCHRONOUS))


def make_controller(sync: str | SyncConfig, *, workers: int,
                    ranges: int = 1) -> ConsistencyController:
    """The controller for a model name (with default settings) or a whole ``SyncConfig``."""
    from engine.config import SyncConfig

    if isinstance(sync, str):
        CONSISTENCY_MODELS.get(sync)  # an unknown name fails here, listing the known ones
        sync = SyncConfig.model_validate({"model": sync})
    return CONSISTENCY_MODELS.get(sync.model)(sync, workers, ranges)
