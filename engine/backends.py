"""Where a run's roles run: a small Protocol and its registry.

``local`` starts every role as a process on this machine (``engine.launcher``); ``ray`` starts
each in a Ray actor across a cluster (the same launcher on ``engine.hosts.ray_cluster``); ``sim``
runs the whole cluster in one process in virtual time (``engine.sim``). ``psctl launch`` and
``psctl study`` pick one by ``cluster.backend``; all record the run the same way, so every view
works on any.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from engine.registry import Registry

if TYPE_CHECKING:
    from engine.config import RunConfig
    from engine.launcher import LaunchResult


class RunHandle(Protocol):
    """One run being started and watched by a backend."""

    run_id: str
    name: str
    db: Path

    def start(self) -> None:
        """Begin the run; returns once its row is in the database."""
        ...

    def wait(self, on_tick: Callable[[], None] | None = None,
             tick_s: float = 0.5) -> LaunchResult:
        """Block until the run has ended (Ctrl-C stops it), calling ``on_tick`` meanwhile."""
        ...


class Backend(Protocol):
    def __call__(self, config: RunConfig, *, db: Path,
                 requested_at: float | None = None) -> RunHandle:
        """``requested_at``: when the user asked for the run (wall clock), from which its
        start-up is measured."""
        ...


def _local(config: RunConfig, *, db: Path, requested_at: float | None = None) -> RunHandle:
    from engine.launcher import Launcher

    return Launcher(config, db=db, requested_at=requested_at)


def _ray(config: RunConfig, *, db: Path, requested_at: float | None = None) -> RunHandle:
    from engine.hosts.ray_cluster import RayHosts
    from engine.launcher import Launcher

    return Launcher(config, db=db, hosts=RayHosts(config), requested_at=requested_at)


def _sim(config: RunConfig, *, db: Path, requested_at: float | None = None) -> RunHandle:
    from engine.sim.launcher import SimLauncher

    del requested_at  # its processes start in virtual time: no start-up to measure
    return SimLauncher(config, db=db)


def _simulable(config: RunConfig) -> None:
    """The simulator runs the real loops, servers and evaluator; it does not model these."""
    from engine.policies.loops import ANY_ROWS, WORKER_LOOPS, loop_name

    comm = config.comm
    unmodelled = [name for name, used in (
        ("comm.compress", comm.compress != "none"),
        ("comm.range_size", comm.range_size is not None),
        ("comm.schedule", comm.schedule != "none" or config.train.loop == "scheduled"),
        ("train.loop wait-free", config.train.loop == "wait-free"),
        (f"train.loop {loop_name(config)}", WORKER_LOOPS.can(loop_name(config), ANY_ROWS)),
        ("fault.inject", bool(config.fault.inject)),
        ("cluster.replicas", config.cluster.replicas > 0),
        ("cluster.key_ranges", config.cluster.ranges != config.cluster.servers),
        ("fault.checkpoint_every_s", config.fault.checkpoint_every_s is not None),
    ) if used]
    if unmodelled:
        raise ValueError(f"cluster.backend sim does not model {', '.join(unmodelled)}; run "
                         "them on the local backend")
    if config.sim.costs == "given" and (config.regime.compute_ms is None
                                        or config.sim.server_ms is None):
        raise ValueError("sim.costs given needs regime.compute_ms and sim.server_ms "
                         "(--compute-ms, --server-ms): nothing is measured")


BACKENDS: Registry[Backend] = Registry("backend")
# Its roles are processes of this machine: they share its cores (oversubscription is said),
# its GPUs are the ones --device is checked against, and psctl resume restarts them here.
THIS_MACHINE = "this-machine"
# Its clock is virtual: what a run measures does not depend on how busy this machine is, so
# psctl study may run several at once (only when no cost is timed here: see load_free).
VIRTUAL_TIME = "virtual-time"
BACKENDS.register("local", _local, "every role a process on this machine, over websockets",
                  capabilities=frozenset({THIS_MACHINE}))
BACKENDS.register("ray", _ray, "every role a Ray actor, placed across a Ray cluster "
                  "(pip install 'psctl[ray]'; see docs/cluster.md)")
BACKENDS.register("sim", _sim, "the whole cluster in one process, in virtual time (seed "
                  "experiments at any scale; see docs/simulation.md)", requires=(_simulable,),
                  capabilities=frozenset({VIRTUAL_TIME}))


# The config sections only one backend reads: given to a run on another, they would be ignored.
OWN_SECTIONS = {"sim": "sim", "ray": "ray"}


def settings_apply(config: RunConfig) -> None:
    """A setting that does not apply to the run's backend is refused, never ignored."""
    backend = config.cluster.backend
    for owner, section in OWN_SECTIONS.items():
        given = getattr(config, section)
        default = type(given)()
        changed = [f"{section}.{name}" for name in type(given).model_fields
                   if getattr(given, name) != getattr(default, name)]
        if owner != backend and changed:
            raise ValueError(f"{', '.join(changed)} appl{'ies' if len(changed) == 1 else 'y'} "
                             f"to the {owner} backend only, and this run's is {backend} "
                             f"(--backend {owner}, or leave {'it' if len(changed) == 1 else 'them'}"
                             " out)")


def load_free(config: RunConfig) -> bool:
    """Whether the run's numbers are the same however busy this machine is: a virtual-time
    backend. Its measured costs are timed on this machine once and cached (a busy machine would
    time them slow): ``engine.sim.building.calibrate`` measures them before several such runs
    start at once."""
    return BACKENDS.can(config.cluster.backend, VIRTUAL_TIME)
