"""``psctl launch``'s options turned into a run's settings; ``psctl role coordinator`` takes the
same options and goes through here too, so that a run started by hand is configured exactly as
one that psctl launches."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.config import RunConfig

# Option name -> the setting it overrides (None: not given, the setting keeps its value).
SETTINGS = {
    "name": "name", "workers": "cluster.workers", "servers": "cluster.servers",
    "sync": "sync.model", "dataset": "data.dataset", "model": "model.name",
    "device": "train.device", "train_limit": "data.train_limit",
    "epochs": "train.epochs", "batch_size": "train.batch_size", "seed": "train.seed",
    "overlap": "train.overlap", "pipeline": "train.pipeline",
    "layer_pulls": "train.layer_pulls", "lr": "optimizer.lr",
    "momentum": "optimizer.momentum",
    "optimizer": "optimizer.name", "clip_norm": "optimizer.clip_norm", "l1": "optimizer.l1",
    "kkt_filter": "comm.kkt_filter", "lbfgs_history": "optimizer.history",
    "portions": "optimizer.portions", "backups": "optimizer.backups",
    "fetch_every": "train.fetch_every", "push_every": "train.push_every",
    "warm_start": "train.warm_start", "lr_warmup": "learning.warmup", "lr_rule": "learning.rule",
    "lr_unit": "learning.unit", "prune": "comm.prune", "error_feedback": "comm.error_feedback",
    "momentum_correction": "comm.momentum_correction", "wire_dtype": "comm.wire_dtype",
    "compress": "comm.compress", "pull_filter": "comm.pull_filter",
    "refresh_every": "comm.refresh_every", "range_size": "comm.range_size",
    "schedule": "comm.schedule", "pool_size": "comm.pool_size",
    "global_lr": "learning.global_lr", "aggregation": "sync.push_scale", "loop": "train.loop",
    "eval_interval": "eval.interval_s", "target_accuracy": "stop.target_accuracy",
    "max_seconds": "stop.max_seconds", "staleness": "sync.staleness", "dssp_range": "sync.range",
    "delay": "sync.delay", "lookahead": "sync.lookahead", "predictor": "sync.predictor",
    "backend": "cluster.backend", "compute_ms": "sim.compute_ms", "network": "sim.network",
    "server_ms": "sim.server_ms", "server_network": "sim.server_network",
    "replicas": "cluster.replicas", "key_ranges": "cluster.key_ranges",
    "transport": "cluster.transport", "template": "cluster.template",
    "ray_address": "ray.address", "worker_cpus": "ray.worker_cpus",
    "worker_gpus": "ray.worker_gpus", "server_cpus": "ray.server_cpus",
    "placement": "ray.placement", "checkpoint_every": "fault.checkpoint_every_s",
    "max_restarts": "fault.max_restarts",
}


def launch_overrides(options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings ``options`` (psctl launch's, by parameter name) override."""
    overrides = {setting: options.get(option) for option, setting in SETTINGS.items()}
    data_dir, fault = options.get("data_dir"), options.get("fault")
    overrides |= {
        "data.data_dir": str(data_dir) if data_dir else None,
        "sim.compute": ("given" if options.get("compute_ms") is not None
                        else options.get("compute")),
        "fault.inject": tuple(fault) if fault else None,
    }
    return overrides


def launch_config(options: Mapping[str, Any], db: Path) -> RunConfig:
    """The run psctl launch's ``options`` describe, over the config files they name (a
    ConfigError says what is wrong)."""
    from psctl.launch import resolve_config
    from psctl.learnopts import parse_schedule
    from psctl.syncopts import sync_overrides

    overrides = launch_overrides(options)
    overrides |= sync_overrides(stragglers=options.get("straggler"), jitter=options.get("jitter"),
                                history=options.get("history"), db=db)
    if options.get("lr_schedule") is not None:
        overrides |= parse_schedule(str(options["lr_schedule"]))
    return resolve_config(options.get("config"), overrides,
                          no_config=bool(options.get("no_config")))
