"""How long a run's roles have to join it, what its coordinator says when some did not, and
the configuration a role is welcomed with."""

from __future__ import annotations

from typing import Any

from engine.config import RunConfig
from engine.wire.messages import Hello

# Seconds of the join deadline per process of the run, on top of cluster.connect_timeout_s: a
# machine with few cores starts processes (each imports torch) only a few at a time. Measured on
# 2 cores: 1.4 s a process for 15, slowing to 3 s a process past 50 (the joined ones idle, but
# not for free); 103 processes need about 290 s.
JOIN_S_PER_PROCESS = 3.0
_NAMES_SHOWN = 8


def process_count(config: RunConfig) -> int:
    """Every role process of a run: servers, workers and the evaluator."""
    return config.cluster.servers + config.cluster.workers + 1


def join_deadline_s(config: RunConfig) -> float:
    """How long every role of the run has, from the coordinator's start, to join it."""
    return config.cluster.connect_timeout_s + JOIN_S_PER_PROCESS * process_count(config)


def join_failure(missing: list[str], config: RunConfig) -> str:
    """Why the run failed when ``missing`` did not join in time, and which setting to raise."""
    shown = ", ".join(missing[:_NAMES_SHOWN])
    if len(missing) > _NAMES_SHOWN:
        shown += f" and {len(missing) - _NAMES_SHOWN} more"
    processes = process_count(config)
    return (f"{len(missing)} of {processes} processes ({shown}) did not join within "
            f"{join_deadline_s(config):.0f} s (cluster.connect_timeout_s = "
            f"{config.cluster.connect_timeout_s:g} s plus {JOIN_S_PER_PROCESS:g} s for each of "
            f"the {processes} processes); see their logs. If the machine is just slow to start "
            f"them, raise cluster.connect_timeout_s (a [cluster] connect_timeout_s in the "
            f"--config file, PSCTL_CLUSTER__CONNECT_TIMEOUT_S, or psctl role coordinator's "
            f"--join-timeout), or start fewer workers")


def role_config(config: RunConfig) -> dict[str, Any]:
    """The configuration the roles get in their welcome: the user's, except that a role waits
    for its peers (a worker for the start of training) as long as the run gives them to join,
    since the first worker to start waits for the last."""
    patient = config.cluster.model_copy(
        update={"connect_timeout_s": max(config.cluster.connect_timeout_s,
                                         join_deadline_s(config))})
    return config.model_copy(update={"cluster": patient}).to_json_dict()


def start_up(hello: Hello) -> dict[str, object]:
    """What a joining process's event says of its start-up: the seconds from its process's
    start to its hello, and whether it was forked from the warm template (nothing from a role
    too old to say)."""
    if hello.start_s is None:
        return {}
    return {"start_s": round(hello.start_s, 3), "forked": hello.forked}
