"""``psctl launch``'s command: its options and what it does with them. Its own module, so that
``psctl role coordinator``, which takes the same options, parses them without the whole CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from engine.errors import PsctlError, StoreError
from psctl import policies, settings
from psctl.cliutil import DbOption, err
from psctl.cliutil import fail as _fail


def launch(
    workers: Annotated[int | None, typer.Option(help="worker processes [4]")] = None,
    servers: Annotated[int | None, typer.Option(help="shard server processes [2]")] = None,
    sync: Annotated[str | None, typer.Option(help=policies.SYNC_HELP)] = None,
    staleness: Annotated[int | None, typer.Option(
        help="ssp, dssp: clocks the fastest worker may lead the slowest [3]")] = None,
    dssp_range: Annotated[int | None, typer.Option(
        "--range", help="dssp: extra clocks the servers may allow at run time [4]")] = None,
    delay: Annotated[int | None, typer.Option(
        help="bounded-delay: own iterations a worker may run ahead of its finished ones [2]")] =
        None,
    lookahead: Annotated[int | None, typer.Option(
        help="elastic: R, future iterations predicted per worker [15]")] = None,
    predictor: Annotated[str | None, typer.Option(
        help="elastic: last (the paper's) or ewma (robust recent average) [ewma]")] = None,
    history: Annotated[str | None, typer.Option(
        help="elastic: seed the predictor with a recorded run's timings (run selector)")] = None,
    straggler: Annotated[list[str] | None, typer.Option(
        help="RANK:FACTOR[@ONSET], e.g. 2:3x or 2:3x@60s: slow worker RANK down (repeatable)")] =
        None,
    jitter: Annotated[str | None, typer.Option(
        help="per-iteration compute noise, DISTRIBUTION:SIGMA, e.g. lognormal:0.3")] = None,
    dataset: Annotated[str | None, typer.Option(
        help="mnist, fashion-mnist, digits (bundled, offline), path/to/file.py:load (a "
        "function returning train_x, train_y, test_x, test_y) or libsvm:PATH [mnist]")] = None,
    model: Annotated[str | None, typer.Option(
        help="mlp, cnn (LeNet), logreg, or path/to/file.py:build (a function build(input_shape, "
        "num_classes) returning a torch.nn.Module) [mlp]")] = None,
    device: Annotated[str | None, typer.Option(
        help="where workers and the evaluator compute: auto (a GPU when there is one), cpu or "
        "cuda[:N] [auto]")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with the data set's IDX files [env: PSCTL_DATA_DIR]")] = None,
    epochs: Annotated[int | None, typer.Option(help="passes over the training set [10]")] = None,
    batch_size: Annotated[int | None, typer.Option(help="samples per worker iteration [64]")] =
        None,
    lr: Annotated[float | None, typer.Option(help=policies.LR_HELP)] = None,
    momentum: Annotated[float | None, typer.Option(help="server SGD momentum [0.9]")] = None,
    optimizer: Annotated[str | None, typer.Option(help=policies.OPTIMIZER_HELP)] = None,
    lr_schedule: Annotated[str | None, typer.Option(
        help="learning-rate schedule over each shard's updates: constant, step:EVERY[:GAMMA] or "
        "cosine:TOTAL[:FLOOR] [constant]")] = None,
    lr_warmup: Annotated[int | None, typer.Option(
        help="updates (or epochs) of linear warm-up before the schedule [0]")] = None,
    lr_unit: Annotated[str | None, typer.Option(
        help="what --lr-schedule's and --lr-warmup's numbers count: updates (of each shard) or "
        "epochs (by the clock of each push) [updates]")] = None,
    lr_rule: Annotated[str | None, typer.Option(help=policies.RULE_HELP)] = None,
    global_lr: Annotated[float | None, typer.Option(
        help="every --lr-rule but none: the global rate each push is multiplied by "
        "[1/workers]")] =
        None,
    fetch_every: Annotated[int | None, typer.Option(
        help="asp (Downpour): pull fresh values every N iterations [1]")] = None,
    push_every: Annotated[int | None, typer.Option(
        help="asp (Downpour): push the sum of N gradients at once [1]")] = None,
    warm_start: Annotated[int | None, typer.Option(
        help="asp (Downpour): worker 0 trains alone for its first N iterations [0]")] = None,
    prune: Annotated[str | None, typer.Option(
        help="push filter per layer: none, topk:P% (e.g. topk:1%), sigma:K (|g| > K standard "
        "deviations) or dynamic (seed 002); pruned pushes travel as sparse frames [none]")] =
        None,
    error_feedback: Annotated[bool | None, typer.Option(
        "--error-feedback/--no-error-feedback",
        help="add what --prune did not send to the next gradient [on]")] = None,
    momentum_correction: Annotated[float | None, typer.Option(
        help="with --prune: Deep Gradient Compression's momentum correction on the worker, "
        "with this momentum (use --momentum 0 on the servers) [0: off]")] = None,
    wire_dtype: Annotated[str | None, typer.Option(
        help="workers' values on the wire: float32, float16 or bfloat16 (servers keep and "
        "accumulate float32) [float32]")] = None,
    compress: Annotated[str | None, typer.Option(
        help="compress sparse frames (key lists) with none, lz4, zstd or snappy, where it "
        "shrinks them [none]")] = None,
    pull_filter: Annotated[str | None, typer.Option(
        help="servers answer a worker's pull with only the values that moved by more than "
        "DELTA since it last got them: none or significant:DELTA [none]")] = None,
    refresh_every: Annotated[int | None, typer.Option(
        help="with --pull-filter: every Nth pull of a worker is answered whole [100]")] = None,
    schedule: Annotated[str | None, typer.Option(
        help="pull and push layer by layer through a request pool in this order: fifo, filo "
        "or stalest-first (seed 002) [none]")] = None,
    pool_size: Annotated[int | None, typer.Option(
        help="with --schedule: requests in flight at once [1]")] = None,
    range_size: Annotated[int | None, typer.Option(
        help="split every push and pull into pipelined frames of at most KEYS keys [off]")] =
        None,
    kkt_filter: Annotated[bool | None, typer.Option(
        "--kkt-filter/--no-kkt-filter", help="sparse logistic regression with --l1: skip "
        "pushing keys the proximal step would keep at 0 [on]")] = None,
    l1: Annotated[float | None, typer.Option(
        help="L1 penalty applied by the servers as a proximal (soft-threshold) step; sgd with "
        "--momentum 0, or adagrad [0: off]")] = None,
    clip_norm: Annotated[float | None, typer.Option(
        help="servers scale each pushed gradient down to this L2 norm (per shard) [off]")] = None,
    lbfgs_history: Annotated[int | None, typer.Option(
        help="--optimizer lbfgs: correction pairs kept (L-BFGS's m) [10]")] = None,
    portions: Annotated[int | None, typer.Option(
        help="--optimizer lbfgs: data portions per pass over the training set [8 per worker]")] \
        = None,
    backups: Annotated[bool | None, typer.Option(
        "--backups/--no-backups", help="--optimizer lbfgs: idle workers take copies of the "
        "portions that have run longest; the first to finish counts [on]")] = None,
    aggregation: Annotated[str | None, typer.Option(help=policies.AGGREGATION_HELP)] = None,
    loop: Annotated[str | None, typer.Option(help=policies.LOOP_HELP)] = None,
    seed: Annotated[int | None, typer.Option(help="seed for initialisation and shuffling [0]")] =
        None,
    overlap: Annotated[bool | None, typer.Option(
        "--overlap/--no-overlap", help="asp: prefetch the next pull during compute")] = None,
    pipeline: Annotated[bool | None, typer.Option(
        "--pipeline/--no-pipeline", help="send the next pull right behind each push, not "
        "after its ack; the model still decides when it is answered [on]")] = None,
    layer_pulls: Annotated[bool | None, typer.Option(
        "--layer-pulls/--no-layer-pulls", help="--loop wait-free: send each layer's next pull "
        "from inside backward, right behind its push [off]")] = None,
    train_limit: Annotated[int | None, typer.Option(
        help="use only the first N training samples")] = None,
    eval_interval: Annotated[float | None, typer.Option(
        help="evaluate at least every S seconds [10]")] = None,
    target_accuracy: Annotated[float | None, typer.Option(
        help="stop once the test accuracy reaches A (0-1)")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="stop after S seconds")] = None,
    name: Annotated[str | None, typer.Option(help="a name for the run")] = None,
    backend: Annotated[str | None, typer.Option(help=policies.BACKEND_HELP)] = None,
    ray_address: Annotated[str | None, typer.Option(
        help="ray: the cluster's head, HOST:PORT, or auto: RAY_ADDRESS, else the cluster `ray "
        "start` began on this machine [auto]")] = None,
    worker_cpus: Annotated[float | None, typer.Option(
        help="ray: CPUs each worker actor holds [1]")] = None,
    worker_gpus: Annotated[float | None, typer.Option(
        help="ray: GPUs each worker actor holds [0]")] = None,
    server_cpus: Annotated[float | None, typer.Option(
        help="ray: CPUs each server actor holds [1]")] = None,
    placement: Annotated[str | None, typer.Option(
        help="ray: how the workers are placed: spread, pack, strict-spread or strict-pack "
        "(servers always spread) [spread]")] = None,
    compute: Annotated[str | None, typer.Option(
        help="sim: a worker's compute time per batch, measured (timed once on this machine, "
        "cached) or given by --compute-ms [measured]")] = None,
    compute_ms: Annotated[float | None, typer.Option(
        help="sim: milliseconds of compute per batch (implies --compute given)")] = None,
    network: Annotated[str | None, typer.Option(
        help="sim: BANDWIDTH:LATENCY of each server's link, e.g. 10gbit:50us [10gbit:50us]")] =
        None,
    server_network: Annotated[str | None, typer.Option(
        help="sim: BANDWIDTH:LATENCY of each shard server's link, when it differs from a "
        "worker's [--network]")] = None,
    server_ms: Annotated[float | None, typer.Option(
        help="sim: milliseconds a server takes to apply a dense update of the whole model "
        "[measured]")] = None,
    key_ranges: Annotated[int | None, typer.Option(
        help="cut the keys into this many ranges, spread over the servers (one per server by "
        "default); a server joining the running job (psctl scale --servers) takes whole ranges"
    )] = None,
    transport: Annotated[str | None, typer.Option(
        help="how workers reach the shard servers: tcp (psctl's own framing, one copy per hop) "
        "or websocket [tcp]")] = None,
    template: Annotated[bool | None, typer.Option(
        "--template/--no-template",
        help="fork the roles from one warm process that imported torch once (local backend, "
        "Linux) [--template]; --no-template: each role starts a fresh Python")] = None,
    replicas: Annotated[int | None, typer.Option(
        help="backup copies of every key range on other servers (chain replication): a dead "
        "server's keys fail over to the next copy [0]")] = None,
    checkpoint_every: Annotated[float | None, typer.Option(
        help="every S seconds (and at the end) each shard saves its values, optimizer state "
        "and clocks to the run's folder, for psctl resume")] = None,
    max_restarts: Annotated[int | None, typer.Option(
        help="times a worker (or, with replicas, a server) killed by a signal is restarted: a "
        "worker rejoins at its clock, a server takes its copies back [3]")] = None,
    fault: Annotated[list[str] | None, typer.Option(
        help="inject a fault (repeatable): kill:worker:RANK@SECONDS, kill:server:RANK@SECONDS, "
        "kill:evaluator:0@SECONDS (after training started), drop:PERCENT% or delay:MSms on "
        "the workers' data plane")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML file with [cluster], [sync], [train], ... sections")] = None,
    no_config: Annotated[bool, typer.Option(
        "--no-config", help="ignore ./psctl.toml, [tool.psctl] and the user config file")] =
        False,
    db: DbOption = None,
    live: Annotated[bool, typer.Option(help="show live progress")] = True,
    ui: Annotated[bool, typer.Option(
        "--ui/--no-ui", help="serve the live dashboard during the run (127.0.0.1)")] = False,
    repeat: Annotated[int, typer.Option(
        min=1, max=100, help="run N times, with seeds S, S+1, ..., S+N-1, tagged as one group "
        "(group=NAME) that psctl compare shows as mean ± standard deviation")] = 1,
) -> None:
    """Train a model on shard servers and workers started on this machine, recording the run."""
    from psctl.launch import repeats
    from psctl.launchopts import launch_config

    path = settings.database_path(db)
    try:
        resolved = launch_config(locals(), path)
        group, configs = repeats(resolved, repeat) if repeat > 1 else (None, [resolved])
        prepare_database(path)
        dashboard = start_dashboard(path) if ui else None
        try:
            results = _run_all(configs, group, path, live=live)
            # The page is most useful once the run is over; a run stopped with Ctrl-C was
            # meant to stop everything.
            if dashboard is not None and results[-1].status.value != "interrupted":
                err.print(f"run ended; the dashboard stays at {dashboard.address}/runs/"
                          f"{results[-1].run_id} (Ctrl-C to stop)", highlight=False,
                          markup=False)
                dashboard.serve_until_signalled()
        finally:
            if dashboard is not None:
                dashboard.stop()
    except PsctlError as exc:
        raise _fail(exc) from None
    statuses = {result.status.value for result in results}
    if statuses == {"finished"}:
        raise typer.Exit(settings.EXIT_OK)
    raise typer.Exit(settings.EXIT_INTERRUPTED if "interrupted" in statuses
                     else settings.EXIT_ERROR)


def _run_all(configs: list[Any], group: str | None, path: Path, *, live: bool) -> list[Any]:
    """Each run in turn (one, or a group of repeated seeds); Ctrl-C ends the group."""
    from psctl.launch import print_group

    results: list[Any] = []
    try:
        _run_each(configs, group, path, live=live, results=results)
    except KeyboardInterrupt:  # between two runs of a group: none is running
        err.print("interrupted between runs; no run is left running", highlight=False)
        raise typer.Exit(settings.EXIT_INTERRUPTED) from None
    if group is not None and len(results) > 1:
        print_group(path, group, err)
    return results


def _run_each(configs: list[Any], group: str | None, path: Path, *, live: bool,
              results: list[Any]) -> None:
    from psctl.launch import print_summary, run_launch

    for index, one in enumerate(configs):
        tags = None if group is None else {"group": group}
        if group is not None:
            err.print(f"group {group}: run {index + 1} of {len(configs)}, seed "
                      f"{one.train.seed}", highlight=False, markup=False)
        try:
            result = run_launch(one, path, err, live=live, tags=tags)
            print_summary(result, path, err)
        except KeyboardInterrupt:  # Ctrl-C again while the run stopped: it stops at once
            err.print("interrupted again while the run was stopping; its processes end with "
                      "this command", highlight=False)
            raise typer.Exit(settings.EXIT_INTERRUPTED) from None
        results.append(result)
        if result.status.value == "interrupted":
            break


def prepare_database(path: Path) -> None:
    """Create (or upgrade) the database before any process starts, so that an unusable path
    fails here, in one line, rather than in the coordinator or the log folder beside it."""
    from engine.db import open_engine

    if path.is_dir():
        raise StoreError(f"the experiments database {path} is a folder; give a file path")
    try:
        open_engine(path).dispose()
    except OSError as exc:  # creating its folder
        raise StoreError(f"cannot create the experiments database {path}: "
                         f"{exc.strerror or exc}") from None


def start_dashboard(db: Path) -> Any:
    from engine.errors import ConfigError
    from webui.server import DEFAULT_HOST, DEFAULT_PORT, BackgroundServer, port_taken

    try:
        server = BackgroundServer(db, DEFAULT_HOST, DEFAULT_PORT)
    except ConfigError as exc:
        if not port_taken(exc):
            raise
        # Another dashboard, most likely: any free port will do, said plainly.
        server = BackgroundServer(db, DEFAULT_HOST, 0)
        err.print(f"port {DEFAULT_PORT} is taken; the dashboard is at {server.address}/",
                  highlight=False, markup=False)
    try:
        address = server.start()
    except RuntimeError as exc:
        raise ConfigError(f"the dashboard did not start on {server.address}") from exc
    err.print(f"dashboard: {address}/runs/@last", highlight=False)
    return server
