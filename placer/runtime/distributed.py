"""Run a placed training step with one process per device over ``torch.distributed``.

Rank ``j`` is plan device ``j``. Every rank compiles the same
:class:`~placer.runtime.program.Program`, keeps the state the plan puts on
its device (parameters, buffers, optimizer state) and runs its own
operations in plan order. A value another device needs leaves with a
non-blocking send as soon as it exists (a snapshot when the step later
overwrites its storage in place). Tensors travel as flat buffers laid out by
the strides recorded at capture, so the receiver rebuilds the sender's exact
layout; Python scalars travel as 0-d tensors (float64, int64 or bool).

Backends: gloo on CPUs, where a rank posts all its receives at the start of
the step (matched by tag) so that each transfer moves as soon as it is sent;
NCCL on GPUs, with one process group per ordered pair of ranks (each
direction its own FIFO stream) and receives posted when their first consumer
is about to run, in each peer's send order.

Ranks start here with ``torch.multiprocessing`` (:func:`run_distributed`) or
under ``torchrun`` on one or several hosts (:func:`rank_main` with
``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` set). Every blocking
wait is bounded by the process group's timeout. The launcher stops every rank
as soon as one fails, dies or outlives the deadline, raising :class:`RunError`
with the failing rank's message; it stops them too on SIGINT or SIGTERM, and
ranks it started exit when it dies.

Random operations draw from per-operation streams seeded from one base seed
(:func:`~placer.runtime.program.op_seed`), the same on every rank: a run draws
what the local executor draws with the same base seed.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import statistics
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.fx as fx

from ..cluster import Cluster
from ..errors import OptionError, PlacerError
from ..graph import OpGraph
from ..plan import Plan
from ..terminate import terminate_raises
from .portable import PortableStep
from .program import (
    Program,
    bind_call,
    call_node,
    compile_program,
    copy_to,
    draw_seed,
    message_bytes,
    pack,
    receive_buffer,
    unpack,
    value_spec,
)

__all__ = [
    "RunError",
    "RankJob",
    "KernelChoice",
    "DistributedResult",
    "run_distributed",
    "run_under_torchrun",
    "rank_main",
    "resolve_backend",
    "under_torchrun",
    "torchrun_world",
    "free_port",
]

#: A receive's wait longer than this blocked: its message arrived during it (the wait for a message
#: already there returns well within it).
BLOCKED_WAIT_S = 50e-6
#: Seconds the ranks of a failed run have to end on SIGTERM before they are killed.
STOP_GRACE_S = 5.0


class RunError(PlacerError):
    """A placed run failed: a rank raised, died, or did not finish in time."""


def float32_precision() -> tuple[str, str]:
    """This process's float32 precision of cuDNN convolutions and of matrix products (``"tf32"``, ``"ieee"``...)."""
    return torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision


def set_float32_precision(precision: tuple[str, str]) -> None:
    """Set what :func:`float32_precision` reads."""
    torch.backends.cudnn.conv.fp32_precision, torch.backends.cuda.matmul.fp32_precision = precision


@dataclass(frozen=True)
class KernelChoice:
    """A process's settings that choose the kernels computing its operations, and so their last bits.

    A spawned rank starts with torch's defaults; it takes its launcher's
    (:meth:`here`, then :meth:`apply` in the rank) so that a placed step
    computes what the unplaced one in the launcher does.
    """

    #: :func:`float32_precision` (TF32 or not).
    float32_precision: tuple[str, str]
    #: Whether cuDNN must pick deterministic algorithms, and whether it may benchmark them: a spawned
    #: rank that chose otherwise than its launcher drifts apart from it within a few steps.
    cudnn_algorithm_choice: tuple[bool, bool]

    @classmethod
    def here(cls) -> "KernelChoice":
        """This process's choice."""
        return cls(float32_precision(), (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark))

    def apply(self) -> None:
        """Make it this process's choice."""
        set_float32_precision(self.float32_precision)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self.cudnn_algorithm_choice


@dataclass
class RankJob:
    """Everything a rank needs; picklable where ``gm`` is a :class:`~placer.runtime.portable.PortableStep`
    (a captured GraphModule does not pickle: spawned ranks get it so; forked ones share the module).

    ``hook(rank)`` runs in every rank after the process group is up and
    before the first step (fault injection in tests, logging).
    """

    gm: fx.GraphModule | PortableStep
    graph: OpGraph
    plan: dict
    cluster: Cluster
    flat_inputs: list
    steps: int
    backend: str
    timeout_s: float
    carrier: dict[str, str] | None = None
    threads: int = 1
    hook: Callable[[int], None] | None = None
    result_path: str | None = None
    profile: bool = False
    same_host: bool = True  # ranks share a clock: transfer times can be measured
    # The launcher's choice of kernels (TF32 or not, cuDNN's algorithms), for spawned ranks.
    kernel_choice: KernelChoice | None = None
    # Base seed of the random operations (None: rank 0 draws one and sends it to the others).
    seed: int | None = None
    # Ranks that each built the model and read the plan themselves (torchrun): they start from rank 0's
    # state and inputs, as DistributedDataParallel starts from rank 0's parameters, and refuse other plans.
    from_rank0: bool = False
    # A data-parallel plan's step traced on each replica's number of samples (compile_program's replica_steps).
    replica_steps: dict[int, fx.GraphModule | PortableStep] | None = None
    # How a data-parallel plan's buckets are reduced (compile_program's collectives).
    collectives: str = "torch"


@dataclass
class DistributedResult:
    """What a distributed run measured and computed.

    Times are taken after the first step (a warm-up) unless said otherwise.

    Attributes
    ----------
    step_s : list of float
        Wall time of every step, barrier to barrier (the slowest rank's finish).
    outputs : list
        The step's flat outputs after the last step (the loss), on the CPU.
    state : dict of int to tensor
        Flat input position -> its value after the last step, for every input
        the step writes (parameters, buffers, optimizer state), on the CPU.
    op_s : dict of str to float
        Graph node id -> median seconds of its runs on its rank, from the rank's
        previous operation's end, less the waiting for its inputs: the rank's
        busy time, the executor's own work between operations included. A state
        input's is its share of its rank's work before the first operation.
    transfer_s : list of (int, int, int, float)
        ``(source rank, destination rank, bytes, seconds)`` of the transfers a
        rank had to wait for (a wait longer than ``BLOCKED_WAIT_S``), from the
        producer's send to the wait's end (CPU ranks on one host).
    predicted_s : float
        The reference simulator's step time for the plan.
    timeline : dict of int to list of (str, float, float, float)
        Per rank, the last step's operations in the order it ran them: ``(node id,
        began, seconds waiting for its inputs, ended)``, in seconds from the
        first rank's start of the step (ranks on one host, which share a clock;
        empty otherwise). On GPUs these are launch times unless the run
        profiles. :func:`placer.runtime.trace.run_trace` shows it beside the
        simulator's timeline.
    op_message_s : dict of str to float
        Of ``op_s``, the host seconds the node's messages took (packing and
        sending its outputs); what is left is the operation's own, whatever the
        plan sends (:func:`placer.sim.messages.messages_graph`).
    message_s : list of (int, int, int, float, float)
        ``(source rank, destination rank, bytes, sending seconds, receiving
        seconds)`` of every message: the host time each side spent on it
        (sending: packing and the send call; receiving: posting, a wait that
        did not block, unpacking).
    tail_s : float
        Median seconds from the end of the last operation of the rank that ended
        last to the step's end: its outstanding sends and the closing barrier,
        which no operation's time holds (on GPUs without ``profile``, also the
        kernels still queued).
    """

    step_s: list[float]
    outputs: list
    state: dict[int, Any]
    op_s: dict[str, float] = field(default_factory=dict)
    predicted_s: float = math.nan
    transfer_s: list[tuple[int, int, int, float]] = field(default_factory=list)
    timeline: dict[int, list[tuple[str, float, float, float]]] = field(default_factory=dict)
    op_message_s: dict[str, float] = field(default_factory=dict)
    message_s: list[tuple[int, int, int, float, float]] = field(default_factory=list)
    tail_s: float = 0.0


def under_torchrun() -> bool:
    """Whether this process is one rank of a ``torchrun`` launch (its environment says so)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def torchrun_world() -> tuple[int, int]:
    """``(ranks, ranks on this host)`` of the ``torchrun`` launch this process is a rank of."""
    world = int(os.environ["WORLD_SIZE"])
    return world, int(os.environ.get("LOCAL_WORLD_SIZE", world))


def resolve_backend(backend: str, world: int) -> str:
    """``"gloo"`` or ``"nccl"`` for ``backend`` in {"auto", "gloo", "nccl"}; ``world`` is the ranks on this host.

    Raises
    ------
    OptionError
        Unknown backend, or NCCL asked for without one GPU per rank.
    """
    if backend not in ("auto", "gloo", "nccl"):
        raise OptionError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= world and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and gpus < world:
        raise OptionError(f"backend 'nccl' needs one GPU per rank: {world} ranks, {gpus} GPU(s) here")
    return backend


# ------------------------------------------------------------------ one rank
class _RankRunner:
    """One rank's part of every step."""

    def __init__(self, program: Program, rank: int, device: torch.device, backend: str, seed: int = 0):
        self.program = program
        self.seed = seed
        self.steps_run = 0
        self.rank = rank
        self.device = device
        self.backend = backend
        prog = program
        self.schedule = prog.schedule_of(rank)
        # Each node's inputs and call, resolved once (random nodes draw with their step's seed: call_node).
        self.inputs = {v: tuple(v.all_input_nodes) for v in self.schedule}
        self.calls = {v: bind_call(v, device) for v in self.schedule if v not in prog.random}
        self.owned = [k for k, p in enumerate(prog.placeholders) if prog.device_of[p] == rank]
        self.specs = {x.node: value_spec(x.node, prog.compact_views) for x in prog.transfers if rank in (x.src, x.dst)}
        # Receives from each peer, in the order that peer sends them.
        self.incoming: dict[int, list] = {}
        for x in prog.transfers:
            if x.dst == rank:
                self.incoming.setdefault(x.src, []).append(x)
        self.frees_after: dict[fx.Node, list[fx.Node]] = {}
        for k, v in enumerate(prog.schedule):
            dead = [node for node, d in prog.frees[k] if d == rank]
            if dead:
                self.frees_after.setdefault(v, []).extend(dead)
        self.pair_groups: dict[tuple[int, int], Any] = {}
        self.op_s: dict[fx.Node, list[float]] = {}  # seconds of every run of each node
        self.op_message_s: dict[fx.Node, list[float]] = {}  # of those, the host time of its messages
        # Per step, transfer index -> host seconds this rank spent on it (sending: packing and
        # the send call; receiving: posting, a wait that did not block, unpacking).
        self.host_s: list[dict[int, float]] = []
        # Per step, transfer index -> when it was sent here / when it arrived here. An arrival
        # is known only for a message this rank had to wait for (it came when the wait ended),
        # which are the transfers on the step's critical path.
        self.sent_at: list[dict[int, float]] = []
        self.arrived_at: list[dict[int, float]] = []
        # The last step's operations: (node, when it began, seconds waiting for inputs, when it ended).
        self.timeline: list[tuple[fx.Node, float, float, float]] = []
        self.ops_ended = 0.0  # clock when the last step's operations ended (its sends may not have)
        # On GPUs an op's host time is its launch; with profile, synchronize around each op.
        self.profile_gpu = False

    def make_pair_groups(self) -> None:
        """NCCL: one group per ordered pair, so that each direction is its own FIFO (every rank calls this)."""
        world = self.program.num_devices
        for i in range(world):
            for j in range(world):
                if i != j:
                    self.pair_groups[(i, j)] = dist.new_group([i, j])

    # ----------------------------------------------------------- messages
    def _isend(self, buf: torch.Tensor, x) -> Any:
        if self.backend == "nccl":
            return dist.isend(buf, dst=x.dst, group=self.pair_groups[(x.src, x.dst)])
        return dist.isend(buf, dst=x.dst, tag=x.index)

    def _irecv(self, buf: torch.Tensor, x) -> Any:
        if self.backend == "nccl":
            return dist.irecv(buf, src=x.src, group=self.pair_groups[(x.src, x.dst)])
        return dist.irecv(buf, src=x.src, tag=x.index)

    # ---------------------------------------------------------------- step
    def step(self, state: dict[int, Any]) -> dict[int, Any]:
        """Run this rank's part of one step on its ``state`` (flat index -> value); its outputs."""
        prog = self.program
        rank = self.rank
        env: dict[fx.Node, Any] = {prog.placeholders[k]: state[k] for k in self.owned}
        posted: dict[int, tuple[Any, Any]] = {}
        next_post = {src: 0 for src in self.incoming}
        sending: list[tuple[Any, Any]] = []
        sent_at: dict[int, float] = {}
        arrived_at: dict[int, float] = {}
        host_s: dict[int, float] = {}
        self.sent_at.append(sent_at)
        self.arrived_at.append(arrived_at)
        self.host_s.append(host_s)
        clock = time.perf_counter

        def send(v, value) -> float:
            """Send ``v``'s value to every rank that needs it; the host seconds it took."""
            total = 0.0
            for x in prog.sends.get(v, ()):
                began = clock()
                buf = pack(value, self.specs[v], self.device, x.snapshot)
                if buf is not None:
                    sending.append((self._isend(buf, x), buf))
                    sent_at[x.index] = clock()
                    host_s[x.index] = sent_at[x.index] - began
                    total += host_s[x.index]
            return total

        def post(y):
            began = clock()
            buf = receive_buffer(self.specs[y.node], self.device)
            posted[y.index] = (None if buf is None else self._irecv(buf, y), buf)
            host_s[y.index] = clock() - began

        def receive(a):
            x = prog.recv[(a, rank)]
            queue = self.incoming[x.src]
            while x.index not in posted:
                post(queue[next_post[x.src]])
                next_post[x.src] += 1
            work, buf = posted.pop(x.index)
            began = clock()
            if work is not None:
                try:
                    work.wait()
                except RuntimeError as exc:
                    raise RuntimeError(f"rank {rank}: {a.name!r} from rank {x.src} did not arrive: {exc}") from exc
                ended = clock()
                # Gloo's receive says it is complete only once waited on, so only a wait
                # that blocked dates the message's arrival (it came as the wait ended).
                if ended - began > BLOCKED_WAIT_S and self.device.type == "cpu":
                    arrived_at[x.index] = began = ended  # waiting, not work
            value = unpack(buf, self.specs[a], self.device)
            host_s[x.index] = host_s.get(x.index, 0.0) + clock() - began
            return value

        step_began = clock()
        if self.backend == "gloo":
            # Gloo moves a message once its receive is posted: post them all now, so that
            # every transfer starts when its producer finishes, as in the simulator.
            # (Tags match them; NCCL instead posts in each peer's send order, on demand.)
            for src, queue in self.incoming.items():
                while next_post[src] < len(queue):
                    post(queue[next_post[src]])
                    next_post[src] += 1
        for k in self.owned:
            send(prog.placeholders[k], state[k])
        op_s, op_message_s = self.op_s, self.op_message_s
        # The rank's work before its first operation (posting its receives, sending its
        # state) is charged to its state inputs,
        # which plans run first on their device, so that the simulator sees it.
        share = (clock() - step_began) / max(1, len(self.owned))
        for k in self.owned:
            op_s.setdefault(prog.placeholders[k], []).append(share)
            op_message_s.setdefault(prog.placeholders[k], []).append(share)
        timeline = self.timeline = []
        inputs, calls, sends, profile_gpu = self.inputs, self.calls, prog.sends, self.profile_gpu
        frees_after, runs_with = self.frees_after, prog.runs_with
        previous_end = clock()
        for v in self.schedule:
            # On a CPU an op's time is the rank's busy time for it (receiving less the
            # waiting, running, sending, freeing), as the simulator's device is busy with
            # it, from the previous op's end: the executor's own work between two ops
            # (small, but thousands of times a step) is busy time too, which the
            # simulator has nowhere else to see. On a GPU, with profile_gpu, the kernel
            # time between synchronisations.
            t0 = clock()
            waited = 0.0
            for a in inputs[v]:
                if a not in env:
                    env[a] = receive(a)
                    waited = clock() - t0
            busy_from = previous_end
            if profile_gpu:
                torch.cuda.synchronize(self.device)
                t0 = busy_from = clock()
                waited = 0.0
            call = calls.get(v)
            out = (
                call(env)
                if call is not None
                else call_node(v, env, self.device, prog.seed_of(v, self.seed, self.steps_run))
            )
            if profile_gpu:
                torch.cuda.synchronize(self.device)
            env[v] = out
            sent = send(v, out) if v in sends else 0.0
            for a in frees_after.get(v, ()):
                env.pop(a, None)
            ended = previous_end = clock()
            owner = runs_with.get(v)
            if owner in op_s:
                op_s[owner][-1] += ended - busy_from - waited  # its op ran earlier in this step
                op_message_s[owner][-1] += sent
            else:
                op_s.setdefault(v, []).append(ended - busy_from - waited)
                op_message_s.setdefault(v, []).append(sent)
            timeline.append((v, t0, waited, ended))
        self.ops_ended = clock()
        self.steps_run += 1
        for work, _ in sending:
            work.wait()
        return {
            i: env[v] if isinstance(v, fx.Node) else v
            for i, v in enumerate(prog.outputs)
            if not isinstance(v, fx.Node) or prog.device_of[v] == rank
        }


def _barrier(backend: str, device: torch.device) -> None:
    if backend == "nccl":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def rank_main(
    rank: int, world: int, job: RankJob, init_method: str = "env://", local_rank: int | None = None
) -> dict | None:
    """Run ``job`` as ``rank`` of ``world``; on rank 0 return (and save, with a result path) the merged results.

    Under ``torchrun`` call it from every rank with ``init_method="env://"``.
    """
    torch.set_num_threads(max(1, job.threads))
    if job.kernel_choice is not None:
        job.kernel_choice.apply()
    backend = job.backend
    local = rank if local_rank is None else local_rank
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=job.timeout_s)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timeout,
        **({"device_id": device} if backend == "nccl" else {}),
    )
    try:
        flat_inputs = _rank0_start(rank, world, job) if job.from_rank0 else job.flat_inputs
        gm = job.gm.module() if isinstance(job.gm, PortableStep) else job.gm
        steps = {n: m.module() if isinstance(m, PortableStep) else m for n, m in (job.replica_steps or {}).items()}
        program = compile_program(
            gm,
            job.graph,
            Plan.from_dict(job.plan),
            job.cluster,
            carrier=job.carrier,
            replica_steps=steps,
            collectives=job.collectives,
        )
        if program.num_devices != world:
            raise RunError(f"the plan has {program.num_devices} devices but {world} ranks were started")
        seed = job.seed
        if seed is None and program.random:
            # Under torchrun every rank captured the step itself: rank 0's seed is everyone's.
            shared = [draw_seed() if rank == 0 else None]
            dist.broadcast_object_list(shared, src=0)
            seed = shared[0]
        runner = _RankRunner(program, rank, device, backend, seed or 0)
        runner.profile_gpu = job.profile and device.type == "cuda"
        if backend == "nccl":
            runner.make_pair_groups()
        state = {k: copy_to(program.feeds[k].value(flat_inputs, private=False), device) for k in runner.owned}
        if job.hook is not None:
            job.hook(rank)
        step_s: list[float] = []
        tail_s: list[float] = []
        outputs: dict[int, Any] = {}
        for _ in range(job.steps):
            _barrier(backend, device)
            t0 = time.perf_counter()
            outputs = runner.step(state)
            if backend == "nccl":
                torch.cuda.synchronize(device)
            _barrier(backend, device)
            ended = time.perf_counter()
            step_s.append(ended - t0)
            tail_s.append(ended - runner.ops_ended)
        written = {root for roots in program.writes.values() for root in roots}
        payload = {
            "state": {k: _to_cpu(state[k]) for k in runner.owned if program.placeholders[k] in written},
            "outputs": {i: _to_cpu(v) for i, v in outputs.items()},
            # the first step warms up caches and allocators
            "op_s": {
                program.node_id(v): statistics.median(s[1:] or s)
                for v, s in runner.op_s.items()
                if v in program.graph_node
            },
            "op_message_s": {
                program.node_id(v): statistics.median(s[1:] or s)
                for v, s in runner.op_message_s.items()
                if v in program.graph_node
            },
            "host_s": runner.host_s,
            "step_s": step_s,
            "tail_s": statistics.median(tail_s[1:] or tail_s),
            "sent_at": runner.sent_at,
            "arrived_at": runner.arrived_at,
            "began": t0,  # the last step's start
            "timeline": [
                (program.node_id(v) if v in program.graph_node else v.name, t0, waited, ended)
                for v, t0, waited, ended in runner.timeline
            ],
        }
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        if rank != 0:
            return None
        merged = {
            "step_s": gathered[0]["step_s"],
            "state": {},
            "outputs": {},
            "op_s": {},
            "op_message_s": {},
            "predicted_s": program.predicted_s,
            "num_outputs": len(program.outputs),
            "transfer_s": _transfer_times(program, gathered) if job.same_host else [],
            "message_s": _message_times(program, gathered),
            "timeline": _timeline(gathered) if job.same_host else {},
            # The ranks leave the barrier together: the last to end its operations waits least.
            "tail_s": min(part["tail_s"] for part in gathered),
        }
        for part in gathered:
            for key in ("state", "outputs", "op_s", "op_message_s"):
                merged[key].update(part[key])
        merged["state"] = program.flat_state(merged["state"], flat_inputs)
        if job.result_path:
            torch.save(merged, job.result_path)
        return merged
    except BaseException as exc:
        exc.failed_at = time.time()  # before closing the group makes the others fail too
        raise
    finally:
        dist.destroy_process_group()


def _transfer_times(program: Program, gathered: list[dict]) -> list[tuple[int, int, int, float]]:
    """``(src, dst, bytes, seconds)`` of every transfer whose arrival was observed, after the first step.

    Sender and receiver read the same monotonic clock (one host), so a
    transfer's time is its arrival on the receiver less its sending on the sender.
    """
    out = []
    for step in range(1, len(gathered[0]["sent_at"])):
        for part in gathered:
            for index, arrived in part["arrived_at"][step].items():
                x = program.transfers[index]
                sent = gathered[x.src]["sent_at"][step].get(index)
                if sent is not None and arrived > sent:
                    out.append((x.src, x.dst, message_bytes(value_spec(x.node, program.compact_views)), arrived - sent))
    return out


def _message_times(program: Program, gathered: list[dict]) -> list[tuple[int, int, int, float, float]]:
    """``(src, dst, bytes, sending seconds, receiving seconds)`` of every message after the first step."""
    out = []
    for step in range(1, len(gathered[0]["host_s"])):
        for x in program.transfers:
            sent = gathered[x.src]["host_s"][step].get(x.index)
            received = gathered[x.dst]["host_s"][step].get(x.index)
            if sent is not None and received is not None:
                out.append((x.src, x.dst, message_bytes(value_spec(x.node, program.compact_views)), sent, received))
    return out


def _timeline(gathered: list[dict]) -> dict[int, list[tuple[str, float, float, float]]]:
    """Every rank's operations in the last step, in seconds from the first rank's start of it (one host, one clock)."""
    zero = min(part["began"] for part in gathered)
    return {
        rank: [(name, t0 - zero, waited, ended - zero) for name, t0, waited, ended in part["timeline"]]
        for rank, part in enumerate(gathered)
    }


def _to_cpu(value: Any) -> Any:
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _die_with_launcher(launcher: int) -> None:
    """Make this rank exit when the launcher (process ``launcher``, its parent) dies.

    Linux: the kernel sends SIGKILL when the parent goes (``PR_SET_PDEATHSIG``);
    elsewhere a daemon thread watches the parent pid.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != launcher:  # it died before we asked
        os._exit(1)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="placer-launcher-watch", daemon=True).start()


def _spawned(rank: int, main: Callable, world: int, job: Any, init_method: str, error_dir: str, launcher: int) -> None:
    """A rank started by :func:`launch_ranks`: ``main(rank, world, job, init_method)``, its failure written
    to ``error_dir`` for the launcher, and the rank gone with the launcher."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the launcher's handler (forked): stop means stop
    _die_with_launcher(launcher)
    try:
        main(rank, world, job, init_method)
    except BaseException as exc:
        # When and why this rank failed: the launcher names the first failure, not its echoes.
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        when = getattr(exc, "failed_at", time.time())
        Path(error_dir, f"rank{rank}.err").write_text(f"{when!r}\n{text[0] if text else type(exc).__name__}")
        raise


def launch_ranks(
    main: Callable, world: int, job: Any, error_dir: str, deadline: float, timeout_s: float, start_method: str
) -> None:
    """Run ``main(rank, world, job, init_method)`` in ``world`` local processes over a fresh TCP rendezvous
    and wait for them all (:func:`_wait`); on a failure, an interrupt or the deadline every rank is stopped
    before the error is raised, so no rank outlives the call. ``main`` is a module-level function (spawned
    ranks import it by name)."""
    import torch.multiprocessing as mp  # deferred: imports torch

    context = mp.start_processes(
        _spawned,
        args=(main, world, job, f"tcp://127.0.0.1:{free_port()}", error_dir, os.getpid()),
        nprocs=world,
        join=False,
        start_method=start_method,
    )
    try:
        _wait(context.processes, deadline, timeout_s, error_dir)
    except BaseException:
        _stop(context.processes)  # interrupted, terminated, or a failure: no rank outlives the run
        raise


# ------------------------------------------------------------------ launcher
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a local process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_distributed(
    gm: fx.GraphModule,
    graph: OpGraph,
    plan: Plan,
    cluster: Cluster,
    flat_inputs: Sequence[Any],
    *,
    steps: int = 1,
    backend: str = "auto",
    timeout_s: float = 60.0,
    carrier: dict[str, str] | None = None,
    threads: int = 1,
    hook: Callable[[int], None] | None = None,
    deadline_s: float | None = None,
    profile: bool = False,
    seed: int | None = None,
    start_method: str | None = None,
    replica_steps: dict[int, fx.GraphModule] | None = None,
    collectives: str = "torch",
) -> DistributedResult:
    """Train ``steps`` steps with one local process per plan device; return times, outputs and state.

    Parameters
    ----------
    gm, graph, plan, cluster
        The captured step, its graph, a plan of it and the plan's cluster.
    flat_inputs : sequence
        The step's flat inputs (e.g. :meth:`placer.capture.CapturedStep.step_inputs`);
        not modified: the new state comes back in the result.
    steps : int
        Steps to train.
    backend : {"auto", "gloo", "nccl"}
        ``auto`` is NCCL with one GPU per rank, else gloo on CPUs.
    timeout_s : float
        Longest any rank may wait for a message, a barrier or the start of the others.
    carrier : dict, optional
        The captured step's fx node -> graph node map.
    threads : int
        Intra-op threads per rank.
    hook : callable, optional
        ``hook(rank)`` runs in every rank before the first step (picklable where
        ranks are spawned).
    deadline_s : float, optional
        Wall-clock limit of the whole run (default: ``timeout_s * (steps + 3)``).
    profile : bool
        On GPUs, synchronise around every operation so that ``op_s`` holds kernel
        times (slower). On CPUs operations are always timed.
    seed : int, optional
        Base seed of the random operations (default: drawn from torch's global
        generator, when the step has random operations).
    start_method : {"fork", "spawn"}, optional
        ``fork`` shares the captured module; ``spawn`` (fresh processes, which
        CUDA needs) sends it as a :class:`~placer.runtime.portable.PortableStep`.
        Default: ``spawn`` with NCCL, else ``fork``.
    replica_steps : dict of int to GraphModule, optional
        For a data-parallel plan, the step traced on each replica's number of
        samples (:func:`~placer.runtime.replicas.replica_steps`).
    collectives : {"torch", "nodes"}
        How a data-parallel plan's buckets are reduced: one ``torch.distributed``
        collective a bucket where the plan has a replica on every rank, each in
        the same order (faster), or the plan's own steps as messages between
        ranks (:func:`~placer.runtime.program.compile_program`).

    Returns
    -------
    DistributedResult

    Raises
    ------
    OptionError
        Bad ``steps``, ``timeout_s`` or backend.
    RunError
        A rank raised, died or did not finish by the deadline; every rank is stopped
        (as it is when this process is interrupted or terminated).
    """

    if not isinstance(steps, int) or steps < 1:
        raise OptionError(f"steps must be a positive integer, got {steps!r}")
    if not timeout_s > 0:
        raise OptionError(f"timeout_s must be > 0, got {timeout_s!r}")
    if collectives not in ("torch", "nodes"):
        raise OptionError(f"collectives must be 'torch' or 'nodes', got {collectives!r}")
    world = cluster.num_devices
    backend = resolve_backend(backend, world)
    method = start_method or ("spawn" if backend == "nccl" else "fork")
    if method not in ("fork", "spawn"):
        raise OptionError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
    # Refuse a bad plan here, not in every rank.
    program = compile_program(gm, graph, plan, cluster, carrier=carrier, replica_steps=replica_steps)
    if seed is None and program.random:
        seed = draw_seed()
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else timeout_s * (steps + 3))
    # (SIGTERM's handler outside the directory: it is removed before the process terminates.)
    with terminate_raises(), tempfile.TemporaryDirectory(prefix="placer-run-") as tmp:
        result_path = str(Path(tmp) / "result.pt")
        job = RankJob(
            PortableStep(gm) if method == "spawn" else gm,
            graph,
            plan.to_dict(),
            cluster,
            list(flat_inputs),
            steps,
            backend,
            timeout_s,
            carrier,
            threads,
            hook,
            result_path,
            profile,
            kernel_choice=KernelChoice.here(),
            seed=seed,
            replica_steps={n: PortableStep(m) if method == "spawn" else m for n, m in (replica_steps or {}).items()}
            or None,
            collectives=collectives,
        )
        launch_ranks(rank_main, world, job, tmp, deadline, timeout_s, method)
        merged = torch.load(result_path, weights_only=False)
    return _result(merged)


def _rank0_start(rank: int, world: int, job: RankJob) -> list:
    """Rank 0's flat inputs (parameters, buffers, optimizer state, batch), sent to every rank, once every
    rank has checked that its plan and captured step are rank 0's.

    Ranks of a ``torchrun`` launch each build the model and read the plan; a model file that does not
    seed its initialisation would give each rank other weights and inputs.

    Raises
    ------
    RunError
        On every rank, where some rank's plan or captured step differs from rank 0's.
    """
    mine = (job.plan, job.graph.digest())
    shared = [(mine, job.flat_inputs) if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    (first, flat), agree = shared[0], [None] * world
    dist.all_gather_object(agree, mine == first)
    others = [k for k, same in enumerate(agree) if not same]
    if others:
        raise RunError(
            f"rank(s) {others} have another plan or captured step than rank 0: give every rank the "
            f"same plan file, model and batch"
        )
    return flat


def run_under_torchrun(
    gm: fx.GraphModule,
    graph: OpGraph,
    plan: Plan,
    cluster: Cluster,
    flat_inputs: Sequence[Any],
    *,
    steps: int = 1,
    backend: str = "auto",
    timeout_s: float = 60.0,
    carrier: dict[str, str] | None = None,
    threads: int = 1,
    profile: bool = False,
    replica_steps: dict[int, fx.GraphModule] | None = None,
) -> DistributedResult | None:
    """This process's rank of a run launched by ``torchrun`` (one or several hosts).

    Every rank calls it with the same arguments (capture is deterministic, so
    each rank captures the step itself); ``MASTER_ADDR``, ``MASTER_PORT``,
    ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` come from ``torchrun``. Every
    rank starts from rank 0's ``flat_inputs`` (:func:`_rank0_start`). Rank 0
    returns the result, the others None. A rank that fails or waits longer than
    ``timeout_s`` raises, and ``torchrun`` stops the others.

    Raises
    ------
    RunError
        If ``WORLD_SIZE`` is not the plan's number of devices, a rank's plan or
        step is not rank 0's, or the run fails on this rank (torch's error, on one line).
    """
    world, local_world = torchrun_world()
    if world != cluster.num_devices:
        raise RunError(f"torchrun started {world} ranks for a plan over {cluster.num_devices} devices")
    job = RankJob(
        gm,
        graph,
        plan.to_dict(),
        cluster,
        list(flat_inputs),
        steps,
        resolve_backend(backend, local_world),
        timeout_s,
        carrier,
        threads,
        None,
        None,
        profile,
        same_host=local_world == world,
        from_rank0=True,
        replica_steps=replica_steps,
    )
    rank = int(os.environ["RANK"])
    try:
        merged = rank_main(rank, world, job, "env://", int(os.environ.get("LOCAL_RANK", 0)))
    except PlacerError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch's errors of a failed or stopped peer, as the spawned runs say them
        message = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        where = "" if message.startswith(f"rank {rank}:") else f"rank {rank}: "
        raise RunError(
            f"{where}{message} (one of {world} ranks failed, hung or was stopped; the run was stopped)"
        ) from exc
    if merged is None:
        return None
    return _result(merged)


def _result(merged: dict) -> DistributedResult:
    """The result of a run from rank 0's merge of every rank's measurements (:func:`rank_main`)."""
    outputs = [merged["outputs"].get(i) for i in range(merged["num_outputs"])]
    return DistributedResult(
        merged["step_s"],
        outputs,
        merged["state"],
        merged["op_s"],
        merged["predicted_s"],
        merged["transfer_s"],
        merged["timeline"],
        merged["op_message_s"],
        merged["message_s"],
        merged["tail_s"],
    )


def _wait(processes: list, deadline: float, timeout_s: float, error_dir: str) -> None:
    """Wait for every rank; on a failure, death or the deadline stop them all and raise RunError.

    The error names the root cause: a rank killed by a signal (it could not
    report), else the rank whose error came first (the others then fail
    waiting for it), and the ranks still running at that moment.
    """
    while True:
        codes = [p.exitcode for p in processes]
        if all(c == 0 for c in codes):
            return
        failed = any(c not in (None, 0) for c in codes)
        if failed or time.monotonic() > deadline:
            if failed:
                time.sleep(0.5)  # let the echoes of the first failure land too
                codes = [p.exitcode for p in processes]
            _stop(processes)
            raise RunError(_failure_message(codes, error_dir, timeout_s))
        time.sleep(0.05)


def _failure_message(codes: list, error_dir: str, timeout_s: float) -> str:
    running = [r for r, c in enumerate(codes) if c is None]
    killed = [(r, c) for r, c in enumerate(codes) if c is not None and c < 0]
    reports = []
    for r in range(len(codes)):
        path = Path(error_dir, f"rank{r}.err")
        if path.exists():
            when, _, text = path.read_text().partition("\n")
            reports.append((float(when), r, text))
    reported = {r for _, r, _ in reports}
    # A rank that died without a word (a signal, or an exit with a status but no report) is the
    # cause: the others' reports are their echoes of its death.
    exited = [r for r, c in enumerate(codes) if c is not None and c > 0 and r not in reported]
    if killed:
        r, c = killed[0]
        cause = f"rank {r} was killed by signal {signal.Signals(-c).name}"
    elif exited:
        r = exited[0]
        cause = f"rank {r} exited with status {codes[r]}"
    elif reports:
        _, r, text = min(reports)
        cause = f"rank {r} failed: {text}"
    else:
        cause = f"the run did not finish by its deadline (raise timeout_s from {timeout_s:g} s if it is just slow)"
    if running:
        cause += f"; rank(s) {running} were still running (hung?)"
    return cause + "; every rank was stopped"


def _stop(processes: list) -> None:
    """Terminate the ranks, and kill those still alive :data:`STOP_GRACE_S` later.

    Each rank is also continued (SIGCONT): a stopped rank acts on SIGTERM only
    once continued. The grace is shared, not per rank.
    """
    for p in processes:
        if p.is_alive():
            p.terminate()
            with suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=5)
