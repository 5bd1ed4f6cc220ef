"""The control protocol between the coordinator and its workers: every message, typed.

Each message is a frozen dataclass (:mod:`.to_worker`, :mod:`.to_coordinator`);
:func:`encode` makes it the msgpack map that travels (its fields and a ``"type"``, so
that frames stay readable in a capture) and :func:`decode` makes a received map a
message again, or raises :class:`MessageError` naming the peer and what is wrong.
Frames, the handshake that comes before them and the data plane are
:mod:`runtime.protocol`'s. Both ends dispatch with ``match`` on these classes: the
coordinator in ``took`` (:mod:`controlplane.coordinator.inbox`), the
worker in ``WorkerProcess._control_loop`` (:mod:`runtime.worker`). Each side sends through one
function (``WorkerProcess.send``; ``Cluster.send``, ``_WorkerConn.send``) that encodes.

Control connection (the worker dials the coordinator; handshake context ``"control"``,
the control key). The conversation, in order:

1. Registration: the worker sends ``register``; the coordinator answers ``registered``,
   or ``refused`` and closes.
2. Deployment: ``deploy`` to every worker hosting a task; each answers ``deployed`` or
   ``deploy_failed``.
3. Start: ``start`` to those workers, no reply; the other workers get ``warm`` (they
   import the job's code now, not when a task moves there), no reply.
4. Running: ``metrics`` every second; ``task_finished``, ``task_failed`` and
   ``worker_error`` when they happen; ``inject_barrier`` is answered by ``barrier_ack``
   per task for a barrier the coordinator waits for; ``stop`` by ``stopped``.
   Checkpoints (:mod:`controlplane.coordinator.checkpointer`): a checkpoint barrier
   (``inject_barrier``) -> ``checkpoint_captured`` then ``checkpoint_ack`` (its part is
   durable) or ``checkpoint_failed`` per task; ``abandon_checkpoint``, no reply.
5. Live reconfiguration (steps in :mod:`controlplane.coordinator.reconfig`, the worker's
   part in :mod:`runtime.reconfigure`): ``prepare`` -> ``prepared`` or
   ``prepare_failed``; the reconfiguration barrier (``inject_barrier``) -> ``paused``
   per affected task; ``update`` -> ``updated`` per task or ``update_failed``; or
   ``abort``, no reply.
6. Fluid stages: ``stage`` -> ``stage_done``; ``stage_withdraw`` -> ``stage_withdrawn``;
   ``stages_end``, no reply.
7. Stop-and-restart baseline (:mod:`controlplane.coordinator.restart`): ``savepoint`` ->
   ``snapshot`` per task, then ``stop`` and a new ``deploy`` with ``restore``.
8. End: ``shutdown``, and the worker exits; when the control connection closes, the
   worker stops its tasks and exits.

Heartbeat connection (a thread of the worker dials the coordinator once registered;
context ``"heartbeat:<worker id>"``, the control key): ``heartbeat`` every second.

Coordinator -> worker (:class:`ToWorker`), type (class) {fields}:

- ``registered`` (:class:`Registered`) {worker_id}
- ``refused`` (:class:`Refused`) {reason}
- ``deploy`` (:class:`Deploy`) {job_id, graph, code, layout, workers, config, attempt,
  restore, checkpoints}:
  ``graph`` the pickled :class:`runtime.dataflow.JobGraph`; ``code`` the uploaded
  modules its pickles name, installed before unpickling (:mod:`runtime.codeload`);
  ``workers`` every alive worker's data address; ``config`` a :class:`ChannelConfig`
  {batch_size, linger_s, credits, hot_keys}; ``attempt`` which deployment of the job this is (1,
  then one more at each redeploy: a recovery, a resume, a restart), named by its data
  connections, which a worker refuses once it runs a later one
  (:mod:`runtime.dataserver`); ``restore`` per task a :class:`Restore` {groups,
  position, chains, sink} (a restart from a snapshot, or a recovery from a checkpoint;
  else empty); ``checkpoints`` a
  :class:`CheckpointConfig` {store, full_every}, or None (the job takes none)
- ``warm`` (:class:`Warm`) {job_id, graph, code}
- ``start`` (:class:`Start`) {job_id, start_time}: the job's common clock origin
- ``inject_barrier`` (:class:`InjectBarrier`) {job_id, kind, barrier_id}: at the sources
- ``stop`` (:class:`Stop`) {job_id}
- ``prepare`` (:class:`Prepare`) {job_id, rid, barrier_id, layout, affected, workers,
  code, fluid, precopy_min_bytes, precopy_budget_s, precopy_pause_s, stages,
  stage_barriers, graph, current_layout, config, start_time, checkpoints, attempt}: the
  whole new layout; copying ahead (:mod:`runtime.precopy`) for groups of at least ``precopy_min_bytes``
  (None: never), for at most ``precopy_budget_s``, until the rest would ship within
  ``precopy_pause_s``; ``stages`` (fluid) the layouts to go through and a barrier id
  for each after the first; the last six only for a worker that hosts none of the
  job's tasks yet (it joins the job), else None: ``attempt`` the deployment of the job
  running (a change keeps it)
- ``update`` (:class:`Update`) {job_id, rid}
- ``abort`` (:class:`Abort`) {job_id, rid}
- ``stage`` (:class:`StageStart`) {job_id, rid, stage, barrier_id, inject}: ``inject``
  the tasks here that emit the stage's barrier
- ``stage_withdraw`` (:class:`StageWithdraw`) {job_id, rid, stage, barrier_id, inject}
- ``stages_end`` (:class:`StagesEnd`) {job_id, rid, last}: the change ends at stage
  ``last``
- ``abandon_checkpoint`` (:class:`AbandonCheckpoint`) {job_id, checkpoint_id}
- ``commit_checkpoint`` (:class:`CommitCheckpoint`) {job_id, checkpoint_id}: the
  checkpoint is complete; sinks commit what they prepared at or before its barrier
- ``end_input`` (:class:`EndInput`) {job_id, task}: a bounded partitioned source's task
  without partitions ends (every task that read one has finished)
- ``list_partitions`` (:class:`ListPartitions`) {request_id, graph, code, operators}: a
  job being submitted has partitioned sources; the worker lists their partitions
  (workers reach brokers; the control plane runs no job code)
- ``savepoint`` (:class:`Savepoint`) {job_id, barrier_id}
- ``shutdown`` (:class:`Shutdown`) {}

Worker -> coordinator (:class:`ToCoordinator`), type (class) {fields}:

- ``register`` (:class:`Register`) {host, pid, cpus, memory_mb, data_host, data_port,
  name, executor_id}: ``executor_id`` the Spark executor hosting it, if any
- ``heartbeat`` (:class:`Heartbeat`) {}: on the heartbeat connection only
- ``deployed`` (:class:`Deployed`) {job_id, attempt, tasks, restored}: ``attempt`` the
  deploy's; ``restored`` the bytes of key-group state it restored from checkpoint parts:
  ``local_bytes`` (its own copies), ``store_bytes`` (read from the store)
- ``deploy_failed`` (:class:`DeployFailed`) {job_id, attempt, error}
- ``metrics`` (:class:`Metrics`) {worker_id, time, cpu_percent, rss_mb, jobs}: ``jobs``
  job -> task -> metrics snapshot
- ``partitions_listed`` (:class:`PartitionsListed`) {request_id, partitions, error}
- ``partitions_found`` (:class:`PartitionsFound`) {job_id, operator, partitions}: the
  source's first task listed partitions no task of the job reads (every
  ``discovery_interval_s`` until a change gives them out)
- ``task_finished`` (:class:`TaskFinished`) {job_id, task, metrics}
- ``task_failed`` (:class:`TaskFailed`) {job_id, task, error}
- ``worker_error`` (:class:`WorkerError`) {job_id, error}: a data link of the job broke
- ``barrier_ack`` (:class:`BarrierAck`) {job_id, task, kind, barrier_id}
- ``checkpoint_captured`` (:class:`CheckpointCaptured`) {job_id, task, checkpoint_id}
- ``checkpoint_ack`` (:class:`CheckpointAck`) {job_id, task, checkpoint_id, part,
  written, size}: ``part`` the task's part of the manifest (``groups``: key group ->
  chain of [path, offset, length, full, keys]; ``position``; ``sink``), ``written`` the
  bytes written now, ``size`` the bytes of every chain
- ``checkpoint_failed`` (:class:`CheckpointFailed`) {job_id, task, checkpoint_id, error}
- ``stopped`` (:class:`Stopped`) {job_id, metrics}: its tasks' last counts
- ``snapshot`` (:class:`Snapshot`) {job_id, task, metrics, groups, position}
- ``prepared`` (:class:`Prepared`) {job_id, rid, precopy}: ``precopy`` what it copied
  ahead (``ms``, ``bytes``, ``groups``...), or None
- ``prepare_failed`` (:class:`PrepareFailed`) {job_id, rid, error}
- ``paused`` (:class:`Paused`) {job_id, rid, task}
- ``updated`` (:class:`Updated`) {job_id, rid, task, pause_ms, update_ms, metrics}:
  ``metrics`` the last counts of a task that left this worker, else None
- ``update_failed`` (:class:`UpdateFailed`) {job_id, rid, error}
- ``stage_done`` (:class:`StageDone`) {job_id, rid, stage}
- ``stage_withdrawn`` (:class:`StageWithdrawn`) {job_id, rid, stage, clean}: ``clean``
  when the stage's barrier had started nowhere here

Refusals. A message that does not decode is refused: logged with the peer's name and
the reason, and dropped; the connection goes on. A worker drops what it cannot read
from the coordinator; the coordinator drops what it cannot read from an authenticated
worker (the frame layer has already closed the connection for a frame that is not
msgpack; every reply the coordinator waits for has a timeout, which then fails or
aborts what waited). Before registration, anything but a ``register`` gets
``refused`` with the reason, and the connection is closed.

Exception tree::

    ValueError
     └── MessageError       a peer's frame is not a control message (names the peer)
          ├── UnknownMessage    no ``type``, or one this protocol has not (in that direction)
          └── MalformedMessage  a known type with a missing, extra or mistyped field
"""

from __future__ import annotations

from ._codec import (
    MESSAGES,
    MalformedMessage,
    Message,
    MessageError,
    ToCoordinator,
    ToWorker,
    UnknownMessage,
    check_annotations,
    decode,
    encode,
)
from .to_coordinator import (
    BarrierAck,
    CheckpointAck,
    CheckpointCaptured,
    CheckpointFailed,
    Deployed,
    DeployFailed,
    Heartbeat,
    Metrics,
    PartitionsFound,
    PartitionsListed,
    Paused,
    Prepared,
    PrepareFailed,
    Register,
    Snapshot,
    StageDone,
    StageWithdrawn,
    Stopped,
    TaskFailed,
    TaskFinished,
    Updated,
    UpdateFailed,
    WorkerError,
)
from .to_worker import (
    AbandonCheckpoint,
    Abort,
    Address,
    ChannelConfig,
    CheckpointConfig,
    CommitCheckpoint,
    Deploy,
    EndInput,
    InjectBarrier,
    ListPartitions,
    Prepare,
    Refused,
    Registered,
    Restore,
    Savepoint,
    Shutdown,
    StagesEnd,
    StageStart,
    StageWithdraw,
    Start,
    Stop,
    Update,
    Warm,
)

__all__ = [
    "MESSAGES",
    "AbandonCheckpoint",
    "Abort",
    "Address",
    "BarrierAck",
    "ChannelConfig",
    "CheckpointAck",
    "CheckpointCaptured",
    "CheckpointConfig",
    "CheckpointFailed",
    "CommitCheckpoint",
    "Deploy",
    "DeployFailed",
    "Deployed",
    "EndInput",
    "Heartbeat",
    "InjectBarrier",
    "ListPartitions",
    "MalformedMessage",
    "Message",
    "MessageError",
    "Metrics",
    "PartitionsFound",
    "PartitionsListed",
    "Paused",
    "Prepare",
    "PrepareFailed",
    "Prepared",
    "Refused",
    "Register",
    "Registered",
    "Restore",
    "Savepoint",
    "Shutdown",
    "Snapshot",
    "StageDone",
    "StageStart",
    "StageWithdraw",
    "StageWithdrawn",
    "StagesEnd",
    "Start",
    "Stop",
    "Stopped",
    "TaskFailed",
    "TaskFinished",
    "ToCoordinator",
    "ToWorker",
    "UnknownMessage",
    "Update",
    "UpdateFailed",
    "Updated",
    "Warm",
    "WorkerError",
    "decode",
    "encode",
]

check_annotations()  # a field without a wire form fails here, at import, not on first use
