"""The run configuration's schema: frozen sections, their bounds, and TOML reading.

This module knows the shape of a run, not its policies: it imports only pydantic and
``engine.errors``. Which names a setting may take and which settings combine are the policies'
own rules, asked by ``engine.plan``, which composes a ``RunConfig`` from (lowest to highest
precedence) the defaults below, a TOML file (``--config``), and command-line flags. The result is
serialised to JSON and handed to every process of the run, which reads it back with
``RunConfig.model_validate``; nothing downstream re-reads flags or the environment.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.errors import ConfigError

# Longer than any run, and short enough for every wait built on it: a thread's timed wait
# overflows past ~9.2e9 s, so a huge timeout would crash the workers instead of waiting.
_LONGEST_S = 1e7
# The largest seed every generator takes: torch wants a signed 64-bit one, numpy a non-negative.
_SEED_MAX = 2**63 - 1


def flag(name: str) -> dict[str, JsonValue]:
    """Field metadata: the setting's psctl launch flag (``--no-NAME`` too for a switch); its
    help is the field's description, where ``{choices}`` lists the policies the setting names
    and ``{implied}`` the value each policy implies (psctl/launch_options.py)."""
    return {"flag": name}


def whole_number(text: str) -> int:
    """``16777216``, ``16_777_216``, ``2^24`` or ``10^9``: a whole number as psctl's specs write
    it (``sparse-synthetic:features=2^40``, ``--hash-features 2^24``); ValueError for anything
    else. Powers are at most 64, so that no text makes a huge number before the range check."""
    base, caret, power = text.replace("_", "").partition("^")
    if not caret:
        return int(base)
    if not 0 <= int(power) <= 64:
        raise ValueError(f"a power of at most 64, not {power}")
    whole: int = int(base) ** int(power)
    return whole


class _Frozen(BaseModel):
    # inf and nan pass every bound check (nan compares false, inf is "> 0") but break the
    # processes that use them, and the JSON the config is stored and sent as cannot carry them.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class _NamesPolicies(_Frozen):
    """A section with a setting that names a policy: a policy with settings of its own keeps
    them in a table named after it ([sync.NAME]); engine.plan checks every such table against
    the policy's registered settings and refuses any other key."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)


# A server's ranges start at its own positions on the replica ring (engine.replication.ring).
MAX_RANGES_PER_SERVER = 64


class ClusterConfig(_NamesPolicies):
    backend: str = Field("local", json_schema_extra=flag("--backend"), description=(
        "where the roles run: {choices}"))
    workers: int = Field(4, ge=1, le=256, json_schema_extra=flag("--workers"), description=(
        "worker processes [4]"))
    servers: int = Field(2, ge=1, le=64, json_schema_extra=flag("--servers"), description=(
        "shard server processes [2]"))
    host: str = Field("127.0.0.1", description="address every process binds and connects on")
    connect_timeout_s: float = Field(60.0, gt=0, le=_LONGEST_S,
                                     description="how long a process waits for a peer")
    request_timeout_s: float = Field(300.0, gt=0, le=_LONGEST_S,
                                     description="longest wait for one push or pull")
    max_frame_bytes: int = Field(64 * 2**20, ge=2**16, description="largest accepted frame")
    transport: str = Field(
        "tcp", json_schema_extra=flag("--transport"), description=(
            "how workers reach the shard servers (tcp: psctl's own framing, one copy per hop): "
            "{choices}"))
    max_queued_bytes: int = Field(32 * 2**20, ge=2**16, description=(
        "unread reply bytes one connection may have queued at a server before it is "
        "disconnected as too slow a reader (one reply always goes through)"))
    max_server_queued_bytes: int = Field(32 * 2**20, ge=2**16, description=(
        "unread reply bytes all connections together may have queued at one server process; "
        "past it the slowest readers are disconnected first (each connection still gets one "
        "reply through)"))
    max_pending_pulls: int = Field(1024, ge=1, le=2**20, description=(
        "pulls one sender (a worker's credential, over all its connections) may have waiting "
        "at a server for a clock; a connection's first 16 are never refused for it"))
    max_server_pending_pulls: int = Field(8192, ge=1, le=2**22, description=(
        "pulls all senders together may have waiting at one server process for a clock"))
    server_memory: int | None = Field(None, ge=2**24, le=2**50, description=(
        "bytes the keys a server process stores of sparse key ranges may take (their values, "
        "optimizer slots and key map); a push that needs more is refused and the run fails "
        "saying so [a quarter of the machine's memory over cluster.servers]"))
    replicas: int = Field(0, ge=0, le=8, json_schema_extra=flag("--replicas"), description=(
        "backup copies of every key range on other servers (chain replication): a dead server's "
        "keys fail over to the next copy [0]"))
    template: bool = Field(True, json_schema_extra=flag("--template"), description=(
        "fork the roles from one warm process that imported torch once (local backend, Linux) "
        "[--template]; --no-template: each role starts a fresh Python"))

    heartbeat_timeout_s: float = Field(0.5, ge=0.05, le=_LONGEST_S, description=(
        "with replicas: the pause every server's heartbeat (a datagram every fifth of this) "
        "may take on top of the delays observed; a server silent past that (an accrual "
        "detector, at most 10 times this) whose process is gone, stopped or blocked is killed "
        "and its keys fail over, one that still works is waited for"))
    server_stall_s: float = Field(60.0, gt=0, le=_LONGEST_S, description=(
        "with replicas: a server whose event loop has not turned for this long, or whose "
        "process works but has sent no heartbeat for this long, is taken for hung and killed"))
    key_ranges: int | None = Field(
        None, ge=1, le=4096, json_schema_extra=flag("--key-ranges"), description=(
            "cut the keys into this many ranges, spread over the servers (one per server by "
            "default); a server joining the running job (psctl scale --servers) takes whole "
            "ranges"))

    @model_validator(mode="after")
    def _room_for_replicas(self) -> ClusterConfig:
        if self.replicas >= self.servers:
            raise ValueError(f"cluster.replicas {self.replicas} needs at least "
                             f"{self.replicas + 1} servers, one per copy; there are "
                             f"{self.servers}")
        if self.key_ranges is not None and not (
                self.servers <= self.key_ranges <= MAX_RANGES_PER_SERVER * self.servers):
            raise ValueError(f"cluster.key_ranges {self.key_ranges} must be between the "
                             f"{self.servers} servers and {MAX_RANGES_PER_SERVER} per server "
                             f"({MAX_RANGES_PER_SERVER * self.servers})")
        return self

    @property
    def ranges(self) -> int:
        """How many key ranges the keys are cut into."""
        return self.key_ranges if self.key_ranges is not None else self.servers



class HistorySeed(_Frozen):
    """Recent iteration intervals of a previous run's workers, seeding ElasticBSP's monitoring."""

    run: str = Field(min_length=1, description="the run the intervals were read from")
    intervals: tuple[tuple[float, ...], ...] = Field(
        min_length=1, description="per recorded worker, its last busy iteration intervals (s)")

    @model_validator(mode="after")
    def _usable(self) -> HistorySeed:
        if any(not row or min(row) <= 0 for row in self.intervals):
            raise ValueError("every worker's history needs at least one positive interval")
        return self


class SyncConfig(_NamesPolicies):
    model: str = Field("bsp", json_schema_extra=flag("--sync"), description=(
        "consistency model: {choices}"))
    staleness: int = Field(3, ge=0, le=10_000, json_schema_extra=flag("--staleness"), description=(
        "ssp, dssp: clocks the fastest worker may lead the slowest [3]"))
    range: int = Field(4, ge=0, le=10_000, json_schema_extra=flag("--range"), description=(
        "dssp: extra clocks the servers may allow at run time [4]"))
    cache: bool = Field(True, json_schema_extra=flag("--cache"), description=(
        "ssp, dssp: serve a read from the worker's cached copy while it is fresh enough for "
        "the bound, fetch only when it is not (Ho et al., NIPS 2013) [on]"))
    delay: int = Field(2, ge=0, le=10_000, json_schema_extra=flag("--delay"), description=(
        "bounded-delay: T, no worker computes iteration c before every worker's pushes "
        "before c - T are in (OSDI'14) [2]"))
    lookahead: int = Field(
        15, ge=1, le=10_000, json_schema_extra=flag("--lookahead"), description=(
            "elastic: R, future iterations predicted per worker [15]"))
    max_ahead: int = Field(
        32, ge=1, le=10_000, json_schema_extra=flag("--max-ahead"), description=(
            "elastic: the farthest a worker's next barrier may be placed, in its iterations "
            "after the last one (ZipLine searches min(R, this) candidates per worker) [32]"))
    predictor: Literal["last", "ewma"] = Field(
        "last", json_schema_extra=flag("--predictor"), description=(
            "elastic: last (the paper's: the last busy interval, linearly extrapolated) or "
            "ewma (robust recent average) [last]"))
    history: HistorySeed | None = Field(
        None, description="elastic: timings of a previous run that replace the monitoring phase")
    push_scale: str = Field("mean", json_schema_extra=flag("--aggregation"), description=(
        "how pushes combine, per key: {choices}"))



class Straggler(_Frozen):
    rank: int = Field(ge=0, description="the worker slowed down")
    factor: float = Field(ge=1.0, le=1000.0, description="compute takes this many times longer")
    onset_s: float = Field(0.0, ge=0, le=_LONGEST_S,
                           description="seconds after the worker starts training")


class JitterConfig(_Frozen):
    distribution: Literal["lognormal", "exponential"] = "lognormal"
    sigma: float = Field(gt=0, le=5, description=(
        "lognormal: sigma of log(factor); exponential: mean extra fraction of compute"))


class HeterogeneityConfig(_Frozen):
    """Injected slowness, so the consistency models differ visibly on one machine. The delay is
    spent inside the compute phase and recorded as compute time."""

    stragglers: tuple[Straggler, ...] = ()
    jitter: JitterConfig | None = None


class DataConfig(_Frozen):
    dataset: str = Field("mnist", json_schema_extra=flag("--dataset"), description=(
        "mnist, fashion-mnist, digits (bundled, offline), path/to/file.py:load (a function "
        "returning train_x, train_y, test_x, test_y) or libsvm:PATH [mnist]"))
    data_dir: str | None = Field(None, json_schema_extra=flag("--data-dir"), description=(
        "folder with the data set's IDX files [env: PSCTL_DATA_DIR]"))
    train_limit: int | None = Field(
        None, ge=1, json_schema_extra=flag("--train-limit"), description=(
            "use only the first N training samples"))
    # A setting, not part of the data set's name: a path may hold any character, so no suffix
    # of libsvm-hashed:PATH could be told from the file's name (engine.datasets.hashed). Up to
    # 2^62, as sparse-synthetic's features: a key space holds no more.
    hash_features: int | None = Field(
        None, ge=2, le=2**62, json_schema_extra=flag("--hash-features"), description=(
            "libsvm-hashed:PATH and criteo:PATH only: the feature ids their features are hashed "
            "into, a whole number from 2 to 2^62, written 2^24 or 16777216 [2^30]"))

    @field_validator("hash_features", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        # 2^24 as a flag, an environment variable or a TOML string gives it.
        if not isinstance(value, str):
            return value
        try:
            return whole_number(value)
        except ValueError:
            raise ValueError(f"a whole number such as 2^24 or 16777216, not {value!r}") from None



class ModelConfig(_NamesPolicies):
    name: str = Field("mlp", json_schema_extra=flag("--model"), description=(
        "mlp, cnn (LeNet), logreg, embedding (sparse data sets), or path/to/file.py:build (a "
        "function build(input_shape, num_classes) returning a torch.nn.Module) [mlp]"))
    hidden: tuple[int, ...] = Field((512, 512, 512), description="hidden layer widths of the MLP")



class OptimizerConfig(_NamesPolicies):
    name: str = Field("sgd", json_schema_extra=flag("--optimizer"), description=(
        "server optimizer: {choices}; implied by a model: {implied}"))
    # Filled in from the optimizer's own default when not given (engine.plan asks its
    # registry), so the stored config always says which rate the run used.
    lr: float = Field(0.1, gt=0, json_schema_extra=flag("--lr"), description=(
        "server learning rate [the optimizer's own: {implied}]"))
    momentum: float = Field(0.9, ge=0, lt=1, json_schema_extra=flag("--momentum"), description=(
        "server SGD momentum [0.9]"))
    nesterov: bool = Field(False, description="sgd: Nesterov momentum")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty added to the gradient")
    betas: tuple[float, float] = Field((0.9, 0.999), description=(
        "adam: decay rates of the running mean of the gradient and of its square"))
    alpha: float = Field(0.99, gt=0, lt=1, description=(
        "rmsprop: decay rate of the running mean of the squared gradient"))
    eps: float | None = Field(None, gt=0, le=1, description=(
        "added to the denominator [adagrad 1e-10, adam and rmsprop 1e-8, as torch.optim]"))
    l1: float = Field(0.0, ge=0, json_schema_extra=flag("--l1"), description=(
        "L1 penalty applied by the servers as a proximal (soft-threshold) step; sgd with "
        "--momentum 0, or adagrad [0: off]"))
    clip_norm: float | None = Field(
        None, gt=0, json_schema_extra=flag("--clip-norm"), description=(
            "servers scale each pushed gradient down to this L2 norm (per shard) [off]"))
    history: int = Field(10, ge=1, le=20, json_schema_extra=flag("--lbfgs-history"), description=(
        "--optimizer lbfgs: correction pairs kept (L-BFGS's m) [10]"))
    portions: int | None = Field(
        None, ge=1, le=65536, json_schema_extra=flag("--portions"), description=(
            "--optimizer lbfgs: data portions per pass over the training set [8 per worker]"))
    backups: bool = Field(True, json_schema_extra=flag("--backups"), description=(
        "--optimizer lbfgs: idle workers take copies of the portions that have run longest; the "
        "first to finish counts [on]"))

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in value):
            raise ValueError(f"betas are decay rates in [0, 1), got {list(value)}")
        return value



class LearningConfig(_NamesPolicies):
    """How large each update's step is on the servers (engine.server.learning, docs/learning.md):
    a schedule over the shard's update count, and a staleness-aware rule for pushes applied on
    arrival. Both multiply the optimizer's learning rate."""

    schedule: str = Field("constant", description="learning-rate schedule: constant, step, cosine")
    unit: Literal["updates", "epochs"] = Field(
        "updates", json_schema_extra=flag("--lr-unit"), description=(
            "what --lr-schedule's and --lr-warmup's numbers count: updates (of each shard) or "
            "epochs (by the clock of each push) [updates]"))
    warmup: int = Field(0, ge=0, le=10**9, json_schema_extra=flag("--lr-warmup"), description=(
        "updates (or epochs) of linear warm-up before the schedule [0]"))
    step_every: int | None = Field(None, ge=1, le=10**9,
                                   description="step: updates (or epochs) between decays")
    gamma: float = Field(0.1, gt=0, le=1, description="step: the factor of each decay")
    total: int | None = Field(None, ge=1, le=10**9,
                              description="cosine: updates (or epochs) to anneal over")
    floor: float = Field(0.0, ge=0, lt=1, description="cosine: the final factor")
    rule: str = Field("none", json_schema_extra=flag("--lr-rule"), description=(
        "staleness-aware rule for pushes applied on arrival: {choices}"))
    global_lr: float | None = Field(
        None, gt=0, le=1, json_schema_extra=flag("--global-lr"), description=(
            "every --lr-rule but none: the global rate λ each push is multiplied by, the "
            "sources' λ (1: plain asynchronous SGD at its full rate) [1/workers]"))
    window: int | None = Field(None, ge=1, le=100_000, description=(
        "dynssgc: pushes over which the maximum staleness is taken [2 × workers]"))


class TrainConfig(_NamesPolicies):
    epochs: int = Field(10, ge=1, json_schema_extra=flag("--epochs"), description=(
        "passes over the training set [10]"))
    batch_size: int = Field(
        64, ge=1, le=65536, json_schema_extra=flag("--batch-size"), description=(
            "samples per worker iteration [64]"))
    seed: int = Field(0, ge=0, le=_SEED_MAX, json_schema_extra=flag("--seed"), description=(
        "seed for initialisation and shuffling [0]"))
    overlap: bool = Field(False, json_schema_extra=flag("--overlap"), description=(
        "asp: prefetch the next pull during compute"))
    pipeline: bool = Field(True, json_schema_extra=flag("--pipeline"), description=(
        "send the next pull right behind each push, not after its ack; the model still decides "
        "when it is answered [on]"))
    layer_pulls: bool = Field(False, json_schema_extra=flag("--layer-pulls"), description=(
        "--loop wait-free: send each layer's next pull from inside backward, right behind its push"
        " [off]"))
    torch_threads: int = Field(1, ge=1, le=1024, description="intra-op threads per worker")
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:[0-9]{1,2})?)$",
        json_schema_extra=flag("--device"), description=(
            "where workers and the evaluator compute: auto (a GPU when there is one), cpu or "
            "cuda[:N] [auto]"))
    loop: str = Field("auto", json_schema_extra=flag("--loop"), description=(
        "worker loop: {choices}; auto picks overlapped, downpour, delayed or plain as the other "
        "options need"))
    fetch_every: int = Field(
        1, ge=1, le=10_000, json_schema_extra=flag("--fetch-every"), description=(
            "asp (Downpour): pull fresh values every N iterations [1]"))
    push_every: int = Field(
        1, ge=1, le=10_000, json_schema_extra=flag("--push-every"), description=(
            "asp (Downpour): push the sum of N gradients at once [1]"))
    warm_start: int = Field(
        0, ge=0, le=10**9, json_schema_extra=flag("--warm-start"), description=(
            "asp (Downpour): worker 0 trains alone for its first N iterations [0]"))
    local_lr: float = Field(
        0.01, ge=0, le=10.0, json_schema_extra=flag("--local-lr"), description=(
            "Downpour: α of the replica's own step between fetches, p ← p − α·g (DistBelief's "
            "Algorithm 1.1); 0 computes every gradient on the copy fetched last [0.01]"))
    local_momentum: float = Field(
        0.0, ge=0, lt=1, json_schema_extra=flag("--local-momentum"), description=(
            "Downpour: momentum of the replica's own SGD step (0: the paper's plain step) [0]"))

    @property
    def downpour(self) -> bool:
        """Whether the run needs the Downpour loop (any of its three settings is in use)."""
        return self.fetch_every > 1 or self.push_every > 1 or self.warm_start > 0



class CommConfig(_Frozen):
    """What a worker's pushes carry (engine.worker.filters, docs/communication.md)."""

    prune: str = Field("none", json_schema_extra=flag("--prune"), description=(
        "push filter per layer: none, topk:P% (e.g. topk:1%), sigma:K (|g| > K standard "
        "deviations) or dynamic (seed 002); pruned pushes travel as sparse frames [none]"))
    error_feedback: bool = Field(True, json_schema_extra=flag("--error-feedback"), description=(
        "add what --prune did not send to the next gradient [on]"))
    kkt_filter: bool = Field(True, json_schema_extra=flag("--kkt-filter"), description=(
        "sparse logistic regression with --l1: skip pushing keys the proximal step would keep at 0"
        " [on]"))
    momentum_correction: float = Field(
        0.0, ge=0, lt=1, json_schema_extra=flag("--momentum-correction"), description=(
            "with --prune: Deep Gradient Compression's momentum correction on the worker, with "
            "this momentum (use --momentum 0 on the servers) [0: off]"))
    local_clip: float | None = Field(
        None, gt=0, le=1e9, json_schema_extra=flag("--local-clip"), description=(
            "with --prune: Deep Gradient Compression's local gradient clipping, each gradient "
            "scaled to L2 norm at most THIS / sqrt(workers) before it is accumulated [off]"))
    warmup_epochs: int = Field(
        0, ge=0, le=100, json_schema_extra=flag("--prune-warmup"), description=(
            "with --prune topk: Deep Gradient Compression's warm-up, the share sent falling "
            "exponentially (25 %, 6.25 %, ...) to --prune's over this many epochs [0]"))
    wire_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        "float32", json_schema_extra=flag("--wire-dtype"), description=(
            "workers' values on the wire: float32, float16 or bfloat16 (servers keep and "
            "accumulate float32) [float32]"))
    pull_filter: str = Field("none", json_schema_extra=flag("--pull-filter"), description=(
        "servers answer a worker's pull with only the values that moved by more than DELTA since "
        "it last got them: none or significant:DELTA [none]"))
    refresh_every: int = Field(
        100, ge=1, le=10**6, json_schema_extra=flag("--refresh-every"), description=(
            "with --pull-filter: every Nth pull of a key range (a layer) by a worker is answered "
            "whole [100]"))
    schedule: Literal["none", "fifo", "filo", "stalest-first"] = Field(
        "none", json_schema_extra=flag("--schedule"), description=(
            "pull and push layer by layer through a request pool in this order: fifo, filo or "
            "stalest-first (seed 002) [none]"))
    pool_size: int = Field(1, ge=1, le=1024, json_schema_extra=flag("--pool-size"), description=(
        "with --schedule: requests in flight at once [1]"))
    range_size: int | None = Field(
        None, ge=1, le=2**31, json_schema_extra=flag("--range-size"), description=(
            "split every push and pull into pipelined frames of at most KEYS keys [off]"))
    compress: Literal["none", "lz4", "zstd", "snappy"] = Field(
        "none", json_schema_extra=flag("--compress"), description=(
            "compress sparse frames (key lists) with none, lz4, zstd or snappy, where it shrinks "
            "them [none]"))

    @model_validator(mode="after")
    def _consistent(self) -> CommConfig:
        if self.momentum_correction and not self.error_feedback:
            raise ValueError("comm.momentum_correction needs comm.error_feedback: the corrected "
                             "momentum is what the filter holds back")
        return self


class StopConfig(_Frozen):
    target_accuracy: float | None = Field(
        None, gt=0, le=1, json_schema_extra=flag("--target-accuracy"), description=(
            "stop once the test accuracy reaches A: a fraction (0.97) or a percentage (97)"))
    max_seconds: float | None = Field(
        None, gt=0, le=_LONGEST_S, json_schema_extra=flag("--max-seconds"), description=(
            "stop after S seconds"))
    budget: str | None = Field(
        None, json_schema_extra=flag("--budget"), description=(
            "train every worker until the budget is spent, cycling over its shard, and end the "
            "run for all at once: SECONDSs of training (from the first iteration), Nsamples or "
            "Nupdates over all workers; --epochs is then not used (engine/budget.py) [off]"))

    @field_validator("target_accuracy", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> Any:
        # 97 in a config file or PSCTL_STOP__TARGET_ACCURACY means 97 %, as on the command line;
        # past 100 it is left to the bound above, which refuses it.
        if isinstance(value, int | float) and not isinstance(value, bool) and 1 < value <= 100:
            return value / 100
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return value
            return number / 100 if 1 < number <= 100 else value
        return value


class EvalConfig(_Frozen):
    interval_s: float = Field(
        10.0, gt=0, le=_LONGEST_S, json_schema_extra=flag("--eval-interval"), description=(
            "evaluate at least every S seconds [10]"))


class RegimeConfig(_Frozen):
    """The compute and network a run is made to take, whatever runs it (``docs/simulation.md``):
    the simulator models them in virtual time; real processes (local, ray) pad every batch and
    shape every data-plane connection to them, so that a simulated verdict can be checked on
    real processes in the same regime."""

    compute_ms: float | None = Field(
        None, gt=0, le=_LONGEST_S, json_schema_extra=flag("--compute-ms"), description=(
            "milliseconds of compute per batch at least: a real batch is padded to it (its "
            "gradient still computed; a slower one takes what it takes), a simulated one "
            "takes it; --straggler and --jitter stretch it [the batch's own time]"))
    network: str | None = Field(
        None, json_schema_extra=flag("--network"), description=(
            "BANDWIDTH:LATENCY of each worker's link, e.g. 100mbit:5ms: real connections are "
            "shaped to it in user space, the simulator models it [this machine's loopback]"))
    server_network: str | None = Field(
        None, json_schema_extra=flag("--server-network"), description=(
            "BANDWIDTH:LATENCY of each shard server's link, when it differs from a worker's "
            "[--network]"))


class SimConfig(_Frozen):
    """How the simulated cluster (``cluster.backend = "sim"``) turns work into virtual time,
    beyond the regime every backend takes (``RegimeConfig``)."""

    costs: Literal["measured", "given"] = Field(
        "measured", json_schema_extra=flag("--sim-costs"), description=(
            "sim: measured: every piece of work costs what it costs a local run on this "
            "machine, on its shared cores; given: only what the run gives costs time (the "
            "batch --compute-ms, the update --server-ms, both needed; every role on a machine "
            "of its own), the same on every machine [measured]"))
    server_ms: float | None = Field(
        None, ge=0, le=_LONGEST_S, json_schema_extra=flag("--server-ms"), description=(
            "sim: milliseconds a server takes to apply a dense update of the whole model (a "
            "model of sparse samples: the push of one batch's working set) [measured]"))
    cores: int | None = Field(
        None, ge=0, le=4096, json_schema_extra=flag("--sim-cores"), description=(
            "sim: the cores the run's processes share, as a local run's share this machine's; "
            "0: every role on a machine of its own [this machine's cores]"))

    @model_validator(mode="after")
    def _given_alone(self) -> SimConfig:
        if self.costs == "given" and self.cores is not None:
            raise ValueError("sim.cores is for measured costs: with sim.costs given every role "
                             "has a machine of its own")
        return self


# Settings that moved (old stored configs and files name them so): old dotted key -> new, or
# None where the setting is gone (its meaning is now always so).
MOVED = {"sim.compute_ms": "regime.compute_ms", "sim.network": "regime.network",
         "sim.server_network": "regime.server_network", "sim.compute": None}


def upgraded(values: dict[str, Any]) -> dict[str, Any]:
    """A stored run's ``values`` with the settings of ``MOVED`` under their new names (a copy),
    so that a run recorded before they moved still resumes. They applied to the simulator only:
    a real run's (its ``sim.network`` default among them) are dropped, never carried into a
    regime it did not run in."""
    sim = values.get("sim")
    if not isinstance(sim, dict) or not any(old.split(".")[1] in sim for old in MOVED):
        return values
    out = {**values, "sim": {k: v for k, v in sim.items()
                             if f"sim.{k}" not in MOVED}}
    cluster = values.get("cluster")
    simulated = isinstance(cluster, dict) and cluster.get("backend") == "sim"
    regime = values.get("regime") or {}
    if simulated and isinstance(regime, dict):
        moved = {new.split(".")[1]: sim[old.split(".")[1]] for old, new in MOVED.items()
                 if new is not None and sim.get(old.split(".")[1]) is not None}
        out["regime"] = {**moved, **regime}
    return out


class FaultConfig(_Frozen):
    """Checkpoints, restarts and injected faults (``docs/fault-tolerance.md``)."""

    checkpoint_every_s: float | None = Field(
        None, gt=0, le=_LONGEST_S, json_schema_extra=flag("--checkpoint-every"), description=(
            "every S seconds (and at the end) each shard saves its values, optimizer state and "
            "clocks to the run's folder, for psctl resume"))
    max_restarts: int = Field(
        3, ge=0, le=1000, json_schema_extra=flag("--max-restarts"), description=(
            "times a worker (or, with replicas, a server) killed by a signal is restarted: a "
            "worker rejoins at its clock, a server takes its copies back [3]"))
    inject: tuple[str, ...] = Field(
        (), max_length=64, json_schema_extra=flag("--fault"), description=(
            "inject a fault (repeatable): kill:worker:RANK@SECONDS, kill:server:RANK@SECONDS, "
            "kill:evaluator:0@SECONDS (after training started), drop:PERCENT% or delay:MSms on the"
            " workers' data plane"))
    resend_after_s: float = Field(0.1, gt=0, le=60, description=(
        "with drop faults, a data-plane request unanswered this long is sent again (by "
        "request id; the servers discard duplicates)"))



_RAY_ADDRESS = re.compile(r"^(auto|[A-Za-z0-9._-]+:[0-9]{1,5})$")


class RayConfig(_Frozen):
    """Where a run on ``cluster.backend = "ray"`` places its roles (``docs/cluster.md``)."""

    address: str = Field("auto", json_schema_extra=flag("--ray-address"), description=(
        "ray: the cluster's head, HOST:PORT, or auto: RAY_ADDRESS, else the cluster `ray start` "
        "began on this machine [auto]"))
    worker_cpus: float = Field(
        1.0, gt=0, le=1024, json_schema_extra=flag("--worker-cpus"), description=(
            "ray: CPUs each worker actor holds [1]"))
    worker_gpus: float = Field(
        0.0, ge=0, le=64, json_schema_extra=flag("--worker-gpus"), description=(
            "ray: GPUs each worker actor holds [0]"))
    server_cpus: float = Field(
        1.0, gt=0, le=1024, json_schema_extra=flag("--server-cpus"), description=(
            "ray: CPUs each server actor holds [1]"))
    evaluator_cpus: float = Field(0.0, ge=0, le=1024, description=(
        "CPUs the evaluator holds (it evaluates every eval.interval_s; 0 fits it anywhere)"))
    placement: Literal["pack", "spread", "strict-pack", "strict-spread"] = Field(
        "spread", json_schema_extra=flag("--placement"), description=(
            "ray: how the workers are placed: spread, pack, strict-spread or strict-pack (servers "
            "always spread) [spread]"))
    start_timeout_s: float = Field(60.0, gt=0, le=_LONGEST_S, description=(
        "how long the cluster may take to find room for every role before the launch fails"))

    @field_validator("address")
    @classmethod
    def _usable_address(cls, value: str) -> str:
        if value.startswith("ray://"):
            raise ValueError("a Ray client address (ray://) is not supported: psctl's driver "
                             "records the run in a local database, so it runs on a node of the "
                             "cluster; pass the head's HOST:PORT (the GCS address) instead")
        if not _RAY_ADDRESS.match(value):
            raise ValueError(f"ray.address {value!r} is not auto or HOST:PORT")
        return value


class RunConfig(_Frozen):
    name: str | None = Field(None, json_schema_extra=flag("--name"), description=(
        "a name for the run"))
    cluster: ClusterConfig = ClusterConfig()
    sync: SyncConfig = SyncConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    learning: LearningConfig = LearningConfig()
    train: TrainConfig = TrainConfig()
    comm: CommConfig = CommConfig()
    stop: StopConfig = StopConfig()
    eval: EvalConfig = EvalConfig()
    heterogeneity: HeterogeneityConfig = HeterogeneityConfig()
    regime: RegimeConfig = RegimeConfig()
    sim: SimConfig = SimConfig()
    fault: FaultConfig = FaultConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _coherent(self) -> RunConfig:
        """The rules between sections that no policy owns (a policy's own are its spec's)."""
        if self.comm.pull_filter != "none" and any(
                spec.startswith("drop:") for spec in self.fault.inject):
            raise ValueError("fault.inject drop and comm.pull_filter do not mix: a filtered "
                             "answer that is lost cannot be sent again as it was")
        if self.cluster.replicas and self.comm.range_size is not None:
            raise ValueError("cluster.replicas and comm.range_size do not mix: a push cut into "
                             "pieces could be applied twice when it is sent again after a "
                             "failover")
        ranks = [s.rank for s in self.heterogeneity.stragglers]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"a worker is named twice in heterogeneity.stragglers: {ranks}")
        if any(rank >= self.cluster.workers for rank in ranks):
            raise ValueError(f"straggler ranks {ranks} must be below cluster.workers "
                             f"({self.cluster.workers}); ranks count from 0")
        return self

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def merge(file_values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``file_values`` with ``overrides`` (dotted keys such as ``"cluster.workers"``; None: not
    given) written over them; neither argument is changed."""
    merged = _deep_copy(file_values)
    for dotted, value in overrides.items():
        if value is None:
            continue
        section = merged
        *parents, leaf = dotted.split(".")
        for part in parents:
            section = section.setdefault(part, {})
        section[leaf] = value
    return merged


def validate(values: dict[str, Any]) -> RunConfig:
    """The schema's verdict on ``values``: a ConfigError naming each setting that is out of its
    bounds. Names and combinations are checked by engine.plan, which composes every run."""
    try:
        return RunConfig.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


# Tables and arrays inside one another: psctl's own files nest a handful of levels; far deeper
# is a damaged or hostile file that would exhaust Python's recursion limit downstream.
MAX_NESTING = 32


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            values = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text, as TOML must be") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"cannot read config file {path}: it nests arrays or tables too "
                          f"deeply (psctl reads at most {MAX_NESTING} levels)") from None
    check_nesting(values, f"config file {path}")
    return values


def check_nesting(value: Any, where: str) -> None:
    """ConfigError when ``value`` holds tables or arrays more than MAX_NESTING deep (checked
    without recursion, so that the check itself cannot overflow)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"{where} nests tables or arrays more than {MAX_NESTING} levels "
                              "deep; psctl's settings nest a few")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def describe(exc: ValidationError, within: tuple[str, ...] = ()) -> str:
    """One line, naming each setting (under ``within``, the table that was validated) and the
    value given, so the CLI can print it as it is."""
    problems = []
    for error in exc.errors():
        # Our own validators' messages already quote the offending values.
        ours = error["type"] == "value_error"
        message = error["msg"].removeprefix("Value error, ")
        if not (ours or error["type"] == "missing"):
            message += f" (got {_clipped(error['input'])})"
        where = ".".join([*within, *(str(part) for part in error["loc"])])
        if error["type"] == "extra_forbidden" and where in MOVED:
            message = (f"moved to {MOVED[where]}" if MOVED[where] else
                       "is gone: --compute-ms alone says the compute time")
        problems.append(f"{where}: {message}" if where else message)
    return "invalid configuration: " + "; ".join(problems)


def _clipped(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _deep_copy(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in values.items()}
