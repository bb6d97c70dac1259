"""Control messages between the coordinator and the other roles: JSON in websocket text frames.

Tensor traffic never goes here (see ``engine.wire.protocol``). Every message is parsed into one
of the
pydantic models below; anything else is refused with a ``ProtocolError`` naming the problem.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.errors import ProtocolError
from engine.keys import KeyLayout, KeyRange, Segment
from engine.usermetrics import MAX_NAMES
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    SyncRecord,
    UserMetricRecord,
)

MAX_CONTROL_BYTES = 8 * 2**20
# A worker's report holds at most this many user metric values (it reports early to keep under
# it): about 1 MiB of JSON, well inside MAX_CONTROL_BYTES.
MAX_REPORTED_METRICS = 8192
RoleName = Literal["server", "worker", "evaluator"]


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


MAX_START_S = 86400.0


class Hello(Message):
    type: Literal["hello"] = "hello"
    role: RoleName
    rank: int = Field(ge=0)
    pid: int = Field(ge=0)
    # Where it runs: the address it binds (its node's, on a cluster) and its machine's name.
    # A pid means something only on its own machine: the coordinator signals none elsewhere.
    node: str = Field("", max_length=255)
    machine: str = Field("", max_length=255)
    # From its process's start (a fresh Python, or its fork from the warm template) to this
    # hello: its start-up, recorded with its join.
    start_s: float | None = Field(None, ge=0.0, le=MAX_START_S)
    forked: bool = False


class ShardInfo(Message):
    index: int = Field(ge=0)
    address: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class SegmentInfo(Message):
    """One parameter tensor's keys: ``[start, end)`` of the flat key space, and its shape."""

    name: str = Field(min_length=1, max_length=256)
    shape: tuple[int, ...] = Field(max_length=8)
    start: int = Field(ge=0)
    end: int = Field(ge=1)
    sparse: bool = False  # stored only where touched (engine.keys.Segment)
    init: str | None = Field(None, max_length=64)  # the servers' rule (engine.initial)


class Welcome(Message):
    type: Literal["welcome"] = "welcome"
    run_id: str
    config: dict[str, Any]
    num_keys: int = Field(ge=1)
    segments: list[SegmentInfo] = Field(min_length=1)  # the key layout, in key order
    shards: list[ShardInfo]  # empty for servers: they learn only the ranges they hold
    started_at: float
    # A server of a resumed run: the checkpoint folder its copies start from.
    checkpoint: str | None = Field(None, max_length=4096)
    # A server: every key range it holds a copy of, and those it serves (the primary of); a
    # worker: per shard, the addresses of its backups in chain order (where its keys are served
    # after a failover).
    held: list[ShardInfo] = Field(default_factory=list, max_length=4096)
    primaries: list[int] = Field(default_factory=list, max_length=4096)
    backups: dict[int, list[str]] = Field(default_factory=dict)
    # A worker that joins a running job: the clock its first iteration has.
    clock_base: int = Field(0, ge=0)
    # A server of a run with replicas: the UDP port on the coordinator's host its heartbeat
    # thread sends to (``engine.wire.beats``); None: no heartbeats.
    heartbeat_port: int | None = Field(None, ge=1, le=65535)
    # ... and the number its beats carry: drawn for this process alone, so that a beat of an
    # earlier process of the same rank (replayed, or late) is not taken for its own.
    heartbeat_incarnation: int = Field(0, ge=0, le=2**64 - 1)


class Iterations(Message):
    type: Literal["iterations"] = "iterations"
    rows: list[IterationRecord]
    layers: list[LayerRecord] = Field(default_factory=list)  # the scheduled loop's, per layer
    # What the user's code logged with psctl.log, per iteration of these rows.
    metrics: list[UserMetricRecord] = Field(default_factory=list, max_length=MAX_REPORTED_METRICS)


class Evaluation(Message):
    type: Literal["evaluation"] = "evaluation"
    row: EvaluationRecord
    final: bool = False
    # What the user's code logged with psctl.log while the evaluator tested (at most one a name).
    metrics: list[UserMetricRecord] = Field(default_factory=list, max_length=MAX_NAMES)


class Event(Message):
    type: Literal["event"] = "event"
    row: EventRecord


class Syncs(Message):
    """ElasticBSP barrier decisions and completions, from shard server 0."""

    type: Literal["syncs"] = "syncs"
    rows: list[SyncRecord] = Field(min_length=1)


class Serving(Message):
    """A shard server listens: where each copy it holds takes connections."""

    type: Literal["serving"] = "serving"
    copies: list[ShardInfo] = Field(default_factory=list, max_length=4096)


class Ready(Message):
    """A worker has its data and model and is about to train."""

    type: Literal["ready"] = "ready"
    iterations_per_epoch: int = Field(ge=1)
    train_samples: int = Field(ge=1)
    # The iteration it starts from: its clock on the servers (above 0 after a restart or a
    # resume; the iterations before it were done).
    first_iteration: int = Field(0, ge=0)


class Start(Message):
    """To every worker once all of them are ready: training starts together, so that start-up
    skew (process spawn, torch import, data load) is not counted as one worker leading."""

    type: Literal["start"] = "start"
    # To the shard servers (before any worker starts): a worker's clocks per epoch, what a
    # schedule indexed by epoch needs (iterations per epoch / push_every under Downpour).
    clocks_per_epoch: float | None = Field(None, gt=0, allow_inf_nan=False)


class EpochDone(Message):
    type: Literal["epoch_done"] = "epoch_done"
    epoch: int = Field(ge=0)


class Done(Message):
    type: Literal["done"] = "done"
    iterations: int = Field(ge=0)
    reason: str


class Fatal(Message):
    type: Literal["fatal"] = "fatal"
    message: str
    traceback: str = ""
    diverged: bool = False  # the model diverged (a NaN or infinite loss or gradient)


class Evaluate(Message):
    type: Literal["evaluate"] = "evaluate"
    epoch: float = Field(ge=0)
    final: bool = False


class Stop(Message):
    type: Literal["stop"] = "stop"
    reason: str


class Exit(Message):
    type: Literal["exit"] = "exit"


class Chain(Message):
    """Coordinator -> server: the copy of key range ``index`` forwards its updates to
    ``successor`` (None: it is the chain's tail). Answered by a ``chain_linked`` event."""

    type: Literal["chain"] = "chain"
    index: int = Field(ge=0)
    successor: str | None = None


class Members(Message):
    """Coordinator -> server: the workers of the job from now on (``psctl scale``): those not
    there before join, those missing have left. Answered by a ``members_updated`` event."""

    type: Literal["members"] = "members"
    workers: list[int] = Field(max_length=4096)


class Promote(Message):
    """Coordinator -> server: its backup of key range ``index`` is the primary from now on."""

    type: Literal["promote"] = "promote"
    index: int = Field(ge=0)


class Checkpoint(Message):
    """Coordinator -> server: save the shard now as checkpoint ``seq``; the server answers with
    a ``checkpoint_saved`` event."""

    type: Literal["checkpoint"] = "checkpoint"
    seq: int = Field(ge=0)
    folder: str = Field(min_length=1, max_length=4096)


class Handoff(Message):
    """Coordinator -> the tail of key range ``index``'s chain: a server joins the chain after
    you; write your copy to ``path`` now and keep every later update for it. Answered by a
    ``handoff_saved`` (or ``handoff_failed``) event."""

    type: Literal["handoff"] = "handoff"
    index: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)


class Restore(Message):
    """Coordinator -> a joining server: load your copy of key range ``index`` from ``path``
    (a tail's handoff). Answered by a ``handoff_restored`` (or ``handoff_failed``) event."""

    type: Literal["restore"] = "restore"
    index: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)


class Adopt(Message):
    """Coordinator -> server: hold an empty copy of key range ``index`` ([start, end)), as a
    backup, to be filled by a handoff. Answered by a ``copy_listening`` event."""

    type: Literal["adopt"] = "adopt"
    index: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=1)


class Demote(Message):
    """Coordinator -> the primary of key range ``index``: stop serving workers (they are
    answered ``not_primary``) and wait until every update you applied reached the chain's
    tail. Answered by a ``demoted`` event."""

    type: Literal["demote"] = "demote"
    index: int = Field(ge=0)


class Release(Message):
    """Coordinator -> a demoted copy of key range ``index``: close your workers' connections;
    they move to the primary they were told of. Answered by a ``released`` event."""

    type: Literal["release"] = "release"
    index: int = Field(ge=0)


class Drop(Message):
    """Coordinator -> server: you no longer hold key range ``index``; close its copy.
    Answered by a ``copy_dropped`` event."""

    type: Literal["drop"] = "drop"
    index: int = Field(ge=0)


class Replicas(Message):
    """Coordinator -> workers and the evaluator: per key range, where its copies listen, in
    chain order (the primary first); where a client goes when its server is lost."""

    type: Literal["replicas"] = "replicas"
    copies: dict[int, list[str]] = Field(max_length=4096)



# -- Sandblaster L-BFGS (seed 004): the coordinator's tasks and vector operations ---------------

VectorName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,15}$")]
MAX_VECTOR_OPS = 256


class VectorOp(Message):
    """One operation on every shard's part of named vectors (``x``: the parameters, ``g``: the
    summed gradient, any other name: a vector the shard keeps for the run):
    zero a; copy a <- b; scale a *= c; axpy a += c * b; dot a . b (answers the shard's part)."""

    op: Literal["zero", "copy", "scale", "axpy", "dot"]
    a: VectorName
    b: VectorName | None = None
    c: float = Field(0.0, allow_inf_nan=False)


class VectorOps(Message):
    """Coordinator -> server: apply ``ops`` in order on each key range it serves; answered by
    ``vector_results`` with the same ``seq``."""

    type: Literal["vector_ops"] = "vector_ops"
    seq: int = Field(ge=0)
    ops: list[VectorOp] = Field(min_length=1, max_length=MAX_VECTOR_OPS)


class VectorResults(Message):
    """Server -> coordinator: one value per ``dot`` of the ops, summed over its key ranges; or
    why they could not be applied (nothing after the failing op was)."""

    type: Literal["vector_results"] = "vector_results"
    seq: int = Field(ge=0)
    values: list[float] = Field(default_factory=list, max_length=MAX_VECTOR_OPS)
    error: str | None = Field(None, max_length=2000)


class Task(Message):
    """Coordinator -> worker: sum the loss and gradient over training rows [start, end) at the
    parameters of pass ``evaluation``; report ``task_done``."""

    type: Literal["task"] = "task"
    task: int = Field(ge=0)
    evaluation: int = Field(ge=0)
    iteration: int = Field(ge=0)  # the worker's row for it: its tasks numbered one by one
    start: int = Field(ge=0)
    end: int = Field(ge=1)


class TaskDone(Message):
    """Worker -> coordinator: the task's sums are ready; it waits for a ``verdict``."""

    type: Literal["task_done"] = "task_done"
    task: int = Field(ge=0)
    loss_sum: float = Field(allow_inf_nan=False)
    samples: int = Field(ge=1)


class Verdict(Message):
    """Coordinator -> worker: push the task's gradient (the first copy to finish), or drop it
    (a backup copy finished first)."""

    type: Literal["verdict"] = "verdict"
    task: int = Field(ge=0)
    commit: bool


class TaskPushed(Message):
    """Worker -> coordinator: the committed task's gradient is on every shard (acknowledged)."""

    type: Literal["task_pushed"] = "task_pushed"
    task: int = Field(ge=0)

# -- the launcher and psctl scale: parties that ask the coordinator and are told ------------------

ClientName = Literal["launcher", "scale"]
# The most workers and servers psctl scale may ask a job for (engine.roles.membership says so
# in words first).
MAX_SCALE = 4096


class Attach(Message):
    """Launcher or ``psctl scale`` -> coordinator, first on its connection (instead of a
    hello): it is no process of the run, only a party that asks and is told."""

    type: Literal["attach"] = "attach"
    client: ClientName
    pid: int = Field(ge=0)


class Attached(Message):
    """Coordinator -> an attached party: the run it reached, and how many of its processes
    have joined so far."""

    type: Literal["attached"] = "attached"
    run_id: str = Field(min_length=1, max_length=64)
    joined: int = Field(ge=0)


class Joined(Message):
    """Coordinator -> launcher, at each process it admits: how many have joined so far (the
    launcher starts the next wave once a wave joined)."""

    type: Literal["joined"] = "joined"
    count: int = Field(ge=0)


class StartRoles(Message):
    """Coordinator -> launcher: every worker and server rank the job has now (``psctl scale``
    added some); the launcher starts those it has not started."""

    type: Literal["start_roles"] = "start_roles"
    workers: list[int] = Field(max_length=MAX_SCALE)
    servers: list[int] = Field(max_length=MAX_SCALE)


class RoleEnded(Message):
    """Launcher -> coordinator: a role ended in a way a restart will not mend (an error, a
    crash that repeated itself, a restart that failed), in words; the coordinator ends the run
    with it instead of waiting out the role's rejoin."""

    type: Literal["role_ended"] = "role_ended"
    role: RoleName
    rank: int = Field(ge=0)
    why: str = Field(min_length=1, max_length=2000)


# A moment or a span of a run's start-up: "coordinator", "template_stage_0_s" ...
StartUpName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
StartUpSeconds = Annotated[float, Field(ge=0.0, le=MAX_START_S)]


class StartUp(Message):
    """Launcher -> coordinator, once the roles it started first have all joined: where the
    run's start-up went. ``origin`` is when the command started (wall clock); ``at`` the moments
    since then (the launcher began, the coordinator listened, the template was warm, the roles
    were started, they all joined), ``took`` the spans (the template's imports, the data set)."""

    type: Literal["start_up"] = "start_up"
    mode: Literal["template", "fresh", "ray"]
    note: str | None = Field(None, max_length=1000)
    origin: float = Field(ge=0.0)
    at: dict[StartUpName, StartUpSeconds] = Field(max_length=16)
    took: dict[StartUpName, StartUpSeconds] = Field(max_length=16)


class RunEnded(Message):
    """Coordinator -> launcher, last: how the run ended, and whether the database holds that
    (when it does not, the launcher records it, or says why it cannot)."""

    type: Literal["run_ended"] = "run_ended"
    status: Literal["finished", "failed", "interrupted"]
    reason: str | None = Field(None, max_length=8192)
    recorded: bool


class Scale(Message):
    """``psctl scale`` -> coordinator: the number of workers or servers the job should have."""

    type: Literal["scale"] = "scale"
    role: Literal["workers", "servers"]
    count: int = Field(ge=0, le=MAX_SCALE)


class ScaleAnswer(Message):
    """Coordinator -> ``psctl scale``: what it did, as the event it recorded (``membership``,
    ``server_membership`` or ``scale_refused``)."""

    type: Literal["scale_answer"] = "scale_answer"
    kind: Literal["membership", "server_membership", "scale_refused"]
    detail: dict[str, Any]


ControlMessage = Annotated[
    Hello
    | Welcome
    | Serving
    | Ready
    | Iterations
    | Evaluation
    | Event
    | Syncs
    | Start
    | EpochDone
    | Done
    | Fatal
    | Evaluate
    | Stop
    | Exit
    | Checkpoint
    | Chain
    | Promote
    | Members
    | Handoff
    | Restore
    | Adopt
    | Demote
    | Release
    | Drop
    | Replicas
    | VectorOps
    | VectorResults
    | Task
    | TaskDone
    | Verdict
    | TaskPushed
    | Attach
    | Attached
    | Joined
    | StartRoles
    | RoleEnded
    | StartUp
    | RunEnded
    | Scale
    | ScaleAnswer,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[ControlMessage] = TypeAdapter(ControlMessage)


def parse_control(message: str | bytes | bytearray) -> ControlMessage:
    if not isinstance(message, str):
        raise ProtocolError("binary frame on the control connection: send JSON text")
    if len(message) > MAX_CONTROL_BYTES:
        raise ProtocolError(f"control message of {len(message)} bytes exceeds {MAX_CONTROL_BYTES}")
    try:
        return _ADAPTER.validate_json(message)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        raise ProtocolError(f"invalid control message at {where}: {first['msg']}") from None


def dump_control(message: Message) -> str:
    return message.model_dump_json()


def layout_info(layout: KeyLayout) -> list[SegmentInfo]:
    return [SegmentInfo(name=s.name, shape=s.shape, start=s.keys.start, end=s.keys.end,
                        sparse=s.sparse, init=s.init) for s in layout.segments]


def layout_of(welcome: Welcome) -> KeyLayout:
    """The key layout a welcome describes (validated: contiguous, covering every key)."""
    layout = KeyLayout(tuple(Segment(s.name, s.shape, KeyRange(s.start, s.end), s.sparse,
                                     s.init) for s in welcome.segments))
    if layout.num_keys != welcome.num_keys:
        raise ProtocolError(f"the welcome's segments cover {layout.num_keys} keys, "
                            f"not {welcome.num_keys}")
    return layout
