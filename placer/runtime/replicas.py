"""Execute data-parallel plans: the captured step once per replica, its gradients reduced as planned.

A data-parallel plan places the graph of
:func:`~placer.transform.replicate.data_parallel_graph`: ``r`` replicas of
the step (node ``r{k}/x`` is node ``x`` of replica ``k``) and, per bucket of
gradients, the steps of its collective (``r{k}/allreduce{b}.step{s}``).
:func:`replicate_step` rewrites the captured fx graph the same way, so that
every placed node is an fx node the executors run like any other and every
message of a collective is a transfer of the program:

* replica ``k`` gets its own placeholders (:class:`Feed`): its rows of the
  batch's tensor inputs (the first replicas one sample more where the batch
  does not divide), and the parameters, buffers and optimizer state whole
  (a sharded optimizer's state: its part);
* a bucket's ``pack`` node copies the replica's gradients, scaled by its
  share of the batch ``n_k / N`` (so that their sum is the gradient of the
  global batch's mean loss), into one flat buffer of ``r`` equal chunks;
  each later step adds received chunks in (reduce-scatter) or copies them
  (all-gather), and sends on only the chunks its consumers take;
* every reader of a gradient reads it from the reduced buffer;
* the loss is the replicas' losses weighted by their shares, on replica 0's device.

With a sharded optimizer (ZeRO stage 1) replica ``k`` owns one chunk of every
bucket: it updates only the parameter elements in that chunk, holds only
that part of the optimizer state, and the updated chunks are all-gathered
into every replica's parameters.

Semantics are DDP's without SyncBatchNorm: batch norm sees the replica's
rows; replica 0's parameters, buffers and optimizer state are the caller's,
written in place; the other replicas work on copies, so the model ends with
replica 0's buffers.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.fx as fx

from ..errors import InvalidPlanError, OptionError
from ..graph import OpGraph
from ..transform.replicate import BUCKET_BYTES, _optimizer_arithmetic, _state_writes, collective_stages, replica_layout
from ..transform.split import batch_dependent, part_rows
from .portable import _portable_value

__all__ = [
    "Feed",
    "check_batch_inputs",
    "propagate_meta",
    "replicate_step",
    "replica_steps",
    "batch_coupled",
    "pack_bucket",
    "collective_step",
    "bucket_view",
    "weighted_loss",
    "shard_of",
    "pack_shard",
    "all_reduce_start",
    "all_gather_start",
    "collective_pass",
    "collective_wait",
    "TORCH_COLLECTIVE",
]


@dataclass(frozen=True)
class Feed:
    """How one placeholder of a program is fed from the caller's flat inputs.

    Attributes
    ----------
    flat : int
        Position in the caller's flat inputs.
    rows : (int, int) or None
        Rows ``[lo, hi)`` of that input along its first dimension (a replica's share of the batch).
    shard : (int, int) or None
        Elements ``[lo, hi)`` of that input, flattened (a sharded optimizer's state).
    primary : bool
        Whether the placeholder's writes are the caller's: replica 0's inputs and every shard are
        the caller's tensors themselves (or views of them); another replica's whole state is a copy.
    """

    flat: int
    rows: tuple[int, int] | None = None
    shard: tuple[int, int] | None = None
    primary: bool = True

    def value(self, flat_inputs: Sequence[Any], private: bool = True) -> Any:
        """The placeholder's value: the caller's input or a view of it; for a secondary replica's whole
        state, a copy (``private``; a caller that copies it anyway passes False)."""
        value = flat_inputs[self.flat]
        if not isinstance(value, torch.Tensor):
            return value
        if self.rows is not None:
            lo, hi = self.rows
            return value.narrow(0, lo, hi - lo)
        if self.shard is not None:
            lo, hi = self.shard
            return value.view(-1)[lo:hi]
        return value if self.primary or not private else value.clone()

    def meta(self, traced: Any) -> Any:
        """What the placeholder holds, as an empty tensor on ``meta`` (a scalar as itself), from the
        traced value of the input it is fed from (traced on the replica's rows)."""
        value = _portable_value(traced)
        if not isinstance(value, torch.Tensor):
            return value
        if self.shard is not None:
            lo, hi = self.shard
            return torch.empty(hi - lo, dtype=value.dtype, device="meta")
        return value


#: Batch norm's operations, whose statistics in training mode couple the samples of a batch.
BATCH_NORMS = (
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "cudnn_batch_norm",
    "miopen_batch_norm",
    "batch_norm",
)


def batch_coupled(gm: fx.GraphModule) -> list[str]:
    """The nodes of a captured step whose result for one sample depends on the batch's other samples:
    batch norm in training mode. A data-parallel replica computes them on its rows alone (as DDP
    without SyncBatchNorm does), so its training differs from eager training on the whole batch.

    Examples
    --------
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> bn = torch.nn.BatchNorm1d(3)
    >>> batch_coupled(make_fx(lambda x: bn(x).sum())(torch.ones(4, 3)))
    ['native_batch_norm']
    """
    found = []
    for v in gm.graph.nodes:
        if v.op != "call_function" or not isinstance(v.target, torch._ops.OpOverload):
            continue
        schema = v.target._schema
        if schema.name.split("::")[-1] not in BATCH_NORMS:
            continue
        names = [a.name for a in schema.arguments]
        k = names.index("training") if "training" in names else -1
        training = v.args[k] if 0 <= k < len(v.args) else v.kwargs.get("training", True)
        if training is not False:
            found.append(v.name)
    return found


# ------------------------------------------------------------------ the operations the rewrite adds
def pack_bucket(scale: tuple[int, int], size: int, *grads: torch.Tensor) -> torch.Tensor:
    """The gradients flattened into one buffer of ``size`` elements (zeros after them), times ``n / N``.

    ``scale = (n, N)``: the replica's samples and the batch's. Where the
    replicas share the batch evenly the gradients are divided by their number,
    as DDP divides them.

    Examples
    --------
    >>> pack_bucket((1, 2), 4, torch.tensor([2.0, 4.0]), torch.tensor([6.0])).tolist()
    [1.0, 2.0, 3.0, 0.0]
    """
    buffer = grads[0].new_empty(size)
    n, total = scale
    at = 0
    for g in grads:
        part = buffer.narrow(0, at, g.numel()).view(g.shape)
        if total % n == 0:
            torch.div(g, total // n, out=part)
        else:
            torch.mul(g, n / total, out=part)
        at += g.numel()
    buffer.narrow(0, at, size - at).zero_()
    return buffer


def _chunks(buffer: torch.Tensor, chunks: Sequence[int], chunk: int) -> list[torch.Tensor]:
    return [buffer.narrow(0, j * chunk, chunk) for j in chunks]


def collective_step(
    buffer: torch.Tensor,
    received: Sequence[torch.Tensor],
    taken: Sequence[Sequence[int]],
    add: bool,
    chunk: int,
    sends: Sequence[Sequence[int]],
) -> tuple[torch.Tensor, ...]:
    """One step of a bucket's collective on one replica: ``(buffer, *pieces)``.

    ``received[i]`` holds the chunks ``taken[i]`` (indices into the buffer's
    chunks of ``chunk`` elements) of another replica, which are added into
    the buffer (``add``, a reduce-scatter) or copied into it (an all-gather),
    in place. ``pieces[j]`` is a copy of the chunks ``sends[j]`` of the
    result, for the ``j``-th consumer on another replica.

    Examples
    --------
    >>> out = collective_step(torch.zeros(4), [torch.ones(2)], [[1]], True, 2, [[1], [0, 1]])
    >>> [t.tolist() for t in out]
    [[0.0, 0.0, 1.0, 1.0], [1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]
    """
    for piece, chunks in zip(received, taken):
        for target, value in zip(_chunks(buffer, chunks, chunk), piece.split(chunk)):
            if add:
                target.add_(value)
            else:
                target.copy_(value)
    return (buffer, *(torch.cat(_chunks(buffer, chunks, chunk)) for chunks in sends))


def bucket_view(buffer: torch.Tensor, offset: int, shape: Sequence[int]) -> torch.Tensor:
    """Gradient of ``shape`` at element ``offset`` of a reduced bucket (a view)."""
    numel = int(np.prod(shape, dtype=np.int64))
    return buffer.narrow(0, offset, numel).view(tuple(shape))


def weighted_loss(shares: Sequence[float], *losses: torch.Tensor) -> torch.Tensor:
    """The global batch's loss from the replicas' losses and their shares of the batch.

    Examples
    --------
    >>> float(weighted_loss([0.75, 0.25], torch.tensor(1.0), torch.tensor(3.0)))
    1.5
    """
    device = losses[0].device
    total = losses[0] * shares[0]
    for share, loss in zip(shares[1:], losses[1:]):
        total = total + loss.to(device) * share
    return total


@dataclass
class _Pending:
    """A bucket's collective in flight (``torch.distributed``, asynchronous): its buffer, the work to wait
    for, and for an all-gather the chunks received, and which chunk each rank sent."""

    buffer: torch.Tensor
    work: Any
    gathered: list[torch.Tensor] | None = None
    owners: Sequence[int] = ()
    chunk: int = 0


def all_reduce_start(buffer: torch.Tensor) -> tuple:
    """Start summing ``buffer`` over every rank (``torch.distributed``'s all-reduce, in its own threads);
    ``(pending,)`` for :func:`collective_wait`."""
    import torch.distributed as dist  # deferred: imports torch

    return (_Pending(buffer, dist.all_reduce(buffer, async_op=True)),)


def all_gather_start(buffer: torch.Tensor, chunk: int, own: int, owners: Sequence[int]) -> tuple:
    """Start gathering chunk ``owners[q]`` of ``buffer`` from every rank ``q`` (this rank sends its chunk
    ``own``); ``(pending,)`` for :func:`collective_wait`, which writes them into the buffer."""
    import torch.distributed as dist  # deferred: imports torch

    mine = buffer.narrow(0, own * chunk, chunk).clone()
    gathered = [torch.empty_like(mine) for _ in owners]
    return (_Pending(buffer, dist.all_gather(gathered, mine, async_op=True), gathered, owners, chunk),)


def collective_pass(pending: tuple) -> tuple:
    """A step of a collective that ``torch.distributed`` runs as a whole: nothing to do here."""
    return pending


def collective_wait(pending: tuple) -> tuple:
    """``(buffer,)`` once the collective started on it has ended (an all-gather's chunks written in)."""
    state = pending[0]
    state.work.wait()
    if state.gathered is not None:
        for q, piece in zip(state.owners, state.gathered):
            state.buffer.narrow(0, q * state.chunk, state.chunk).copy_(piece)
    return (state.buffer,)


#: What runs a bucket's collective as one ``torch.distributed`` call (the meta pass leaves them alone).
TORCH_COLLECTIVE = (all_reduce_start, all_gather_start, collective_pass, collective_wait)


def shard_of(t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Elements ``[lo, hi)`` of ``t`` flattened in its logical order (a view where ``t`` is contiguous)."""
    return t.reshape(-1)[lo:hi]


def pack_shard(size: int, offsets: Sequence[int], like: torch.Tensor, *pieces: torch.Tensor) -> torch.Tensor:
    """A buffer of ``size`` elements holding each of ``pieces`` (the parts of the parameters a sharded
    optimizer updated on this replica) flattened at its offset, zeros elsewhere, of ``like``'s dtype.

    Examples
    --------
    >>> pack_shard(4, [1], torch.zeros(1), torch.tensor([5.0, 6.0])).tolist()
    [0.0, 5.0, 6.0, 0.0]
    """
    buffer = like.new_zeros(size)
    for offset, piece in zip(offsets, pieces):
        buffer.narrow(0, offset, piece.numel()).copy_(piece.reshape(-1))
    return buffer


# ------------------------------------------------------------------ the rewrite
#: Operations that only re-index a tensor's elements: a gradient passes through them (a weight's
#: ``t``) before the optimizer's arithmetic, which a bucket holds it after.
VIEW_OPS = frozenset(
    {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "squeeze", "unsqueeze", "alias", "detach"}
)


def _op_name(v: fx.Node) -> str | None:
    if not isinstance(v.target, torch._ops.OpOverload):
        return None
    return v.target._schema.name.split("::")[-1].rstrip("_")


@dataclass
class _Bucket:
    """A bucket as the runtime lays it out: ``tensors[i]`` (fx nodes of the captured step) at element
    ``offsets[i]`` of a flat buffer of ``r`` chunks of ``chunk`` elements."""

    tensors: list[fx.Node]
    offsets: list[int]
    numels: list[int]
    chunk: int


def replicate_step(
    gm: fx.GraphModule,
    graph: OpGraph,
    target: OpGraph,
    carrier: dict[str, str] | None,
    steps: Mapping[int, fx.GraphModule] | None = None,
    collectives: str = "nodes",
) -> tuple[fx.GraphModule, dict[str, fx.Node], dict[str, str], list[Feed]]:
    """The captured step rewritten as the data-parallel graph ``target`` lays it out.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The captured step (not modified).
    graph : OpGraph
        Its graph, which ``target`` replicates.
    target : OpGraph
        The plan's graph (:func:`~placer.transform.replicate.data_parallel_graph` of ``graph``).
    carrier : dict, optional
        fx node name -> graph node id, for the captured step.
    steps : dict of int to GraphModule, optional
        The step traced on each replica's number of samples (:func:`replica_steps`):
        the captured one holds its shapes as constants.
    collectives : {"nodes", "torch"}
        ``nodes``: every step of a bucket's collective is a node and what it sends
        a transfer of the program (any executor). ``torch``: the bucket's first
        step starts a ``torch.distributed`` collective (an all-reduce; a sharded
        optimizer's all-gather), the step its readers read waits for it, the
        others pass; replica ``k`` runs on rank ``k`` of the distributed executor.

    Returns
    -------
    (GraphModule, dict, dict, list of Feed)
        The step to run, ``target``'s node id -> its fx node, the carrier of the
        new step's fx nodes, and how each placeholder is fed from the captured
        step's flat inputs.

    Raises
    ------
    InvalidPlanError
        The batch's size is unknown, a tensor input does not lead with the
        batch, a replica's step is missing from ``steps`` or has other nodes,
        a bucket mixes dtypes, or ``target``'s buckets are not those placer
        lays out for ``graph``.
    """
    if collectives not in ("nodes", "torch"):
        raise ValueError(f"collectives must be 'nodes' or 'torch', got {collectives!r}")
    return _Rewrite(gm, graph, target, carrier or {}, steps or {}, collectives).run()


def replica_steps(captured, plan) -> dict[int, fx.GraphModule] | None:
    """The step traced on each replica's share of the batch where ``plan`` replicates ``captured``'s step, or
    on each micro-batch's rows where it cuts the step into micro-batches (what
    :func:`~placer.runtime.program.compile_program` takes as ``replica_steps``), else None.

    Raises
    ------
    InvalidPlanError
        A tensor input does not lead with the batch, or the model traces other
        operations on fewer samples (:meth:`~placer.capture.CapturedStep.at_batch`).
    """

    target = plan.rewritten_graph
    placeholders = [v for v in captured.gm.graph.nodes if v.op == "placeholder"]
    if target is not None and int((target.extra.get("microbatches") or {}).get("count", 1)) > 1:
        info = target.extra["microbatches"]
        check_batch_inputs(placeholders, captured.batch_size, int(info["count"]), "micro-batches")
        if int(info["total"]) != int(captured.batch_size):
            raise InvalidPlanError(
                f"the plan cuts a batch of {info['total']} samples into micro-batches, but the step's batch has "
                f"{captured.batch_size}; plan again for this batch"
            )
        shares = [int(hi) - int(lo) for lo, hi in info["rows"]]
    elif target is None or "data_parallel" not in target.extra:
        return None
    else:
        shares = _replica_shares(placeholders, captured.batch_size, int(target.extra["data_parallel"]["replicas"]))
    try:
        return {n: captured.at_batch(n) for n in sorted(set(shares))}
    except OptionError as exc:
        raise InvalidPlanError(str(exc)) from None


class _Rewrite:
    """One rewrite of a captured step into its replicas (see :func:`replicate_step`)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        graph: OpGraph,
        target: OpGraph,
        carrier: dict[str, str],
        steps: Mapping[int, fx.GraphModule],
        collectives: str = "nodes",
    ):
        info = target.extra["data_parallel"]
        self.collectives = collectives
        self.gm, self.graph, self.target, self.old_carrier = gm, graph, target, carrier
        self.r = r = int(info["replicas"])
        self.sharded = bool(info["sharded_optimizer"]) and r > 1
        self.hosts = info.get("hosts") or [list(range(r))]
        self.layout = replica_layout(
            graph,
            r,
            int(info.get("bucket_bytes") or BUCKET_BYTES),
            shard_optimizer=self.sharded,
            first_bucket_bytes=int(info.get("first_bucket_bytes") or info.get("bucket_bytes") or BUCKET_BYTES),
        )
        if len(self.layout.buckets) != int(info["buckets"]):
            raise InvalidPlanError(
                f"the plan reduces {info['buckets']} bucket(s) of gradients where this placer "
                f"finds {len(self.layout.buckets)} for its graph; plan again"
            )
        self.stage_ids: dict[tuple[int, int, int], str] = {}
        collective = "ring"
        for i, extra in enumerate(target.node_extra):
            step = extra.get("allreduce")
            if step is not None:
                self.stage_ids[(int(step["bucket"]), int(step["step"]), int(extra["replica"]))] = target.ids[i]
                collective = step["collective"]
        self.nodes = list(gm.graph.nodes)
        self.by_name = {v.name: v for v in self.nodes}
        self.placeholders = [v for v in self.nodes if v.op == "placeholder"]
        self.shares = _replica_shares(self.placeholders, graph.extra.get("batch_size"), r)
        names = [v.name for v in self.nodes]
        self.twins: list[dict[str, fx.Node]] = []  # per replica: the nodes of the step traced on its rows
        for k, n in enumerate(self.shares):
            step = gm if n == sum(self.shares) else steps.get(n)
            if step is None:
                raise InvalidPlanError(
                    f"replica {k} of the plan takes {n} of the batch's {sum(self.shares)} "
                    f"samples, and the step traced on {n} samples was not given "
                    f"(replica_steps; placer.runtime.replicas.replica_steps(captured, plan))"
                )
            twin = {v.name: v for v in step.graph.nodes}
            if list(twin) != names:
                raise InvalidPlanError(f"the step traced on {n} samples has other nodes than the captured one")
            self.twins.append(twin)
        self.stages = [
            collective_stages(self.layout, b, collective, self.hosts) for b in range(len(self.layout.buckets))
        ]
        self.buckets = self._lay_out_buckets()
        self.bucketed = {x: (b, i) for b, bucket in enumerate(self.buckets) for i, x in enumerate(bucket.tensors)}
        self.new = fx.Graph()
        self.env: list[dict[fx.Node, fx.Node]] = [{} for _ in range(r)]
        self.node_of: dict[str, fx.Node] = {}
        self.carrier: dict[str, str] = {}
        self.feeds: list[Feed] = []
        self.outputs: dict[tuple[int, int, int], fx.Node] = {}
        self.consumers: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.reduced: dict[tuple[int, int], fx.Node] = {}
        self.views: dict[tuple[int, int, int], fx.Node] = {}
        self.missing = [len(bucket.tensors) for bucket in self.buckets]  # tensors not yet copied
        self.emitted: set[int] = set()
        self.shards = _Sharding(self) if self.sharded else None

    # ---------------------------------------------------------------- layout
    def _bucket_tensor(self, u: int, t: int) -> fx.Node:
        """The fx node a bucket holds for gradient ``(u, t)``: its value, past the views that bring it to
        the parameter's shape where it has one reader."""
        node_id = self.graph.ids[u]
        v = self.by_name.get(node_id)
        if v is None:
            raise InvalidPlanError(f"gradient {node_id!r} is not a node of the captured step")
        if not (t == 0 and isinstance(v.meta.get("val"), torch.Tensor)):
            v = next((w for w in v.users if w.target is operator.getitem and w.args[1] == t), None)
            if v is None:
                raise InvalidPlanError(f"output {t} of gradient {node_id!r} has no node in the captured step")
        while len(v.users) == 1:
            (w,) = v.users
            if (
                _op_name(w) not in VIEW_OPS
                or not isinstance(w.meta.get("val"), torch.Tensor)
                or w.meta["val"].numel() != v.meta["val"].numel()
            ):
                break
            v = w
        return v

    def _lay_out_buckets(self) -> list[_Bucket]:
        buckets = []
        for b, grads in enumerate(self.layout.buckets):
            tensors = [self._bucket_tensor(u, t) for u, t in grads]
            dtypes = {x.meta["val"].dtype for x in tensors}
            if len(dtypes) > 1:
                raise InvalidPlanError(
                    f"bucket {b} of gradients mixes dtypes {sorted(map(str, dtypes))}; the "
                    f"runtime reduces a bucket as one flat tensor of one dtype"
                )
            numels = [int(x.meta["val"].numel()) for x in tensors]
            offsets = np.concatenate([[0], np.cumsum(numels)[:-1]]).astype(int).tolist() if numels else []
            buckets.append(_Bucket(tensors, offsets, numels, max(1, -(-sum(numels) // self.r))))
        return buckets

    # ---------------------------------------------------------------- nodes
    def bind(self, k: int, old: fx.Node, made: fx.Node) -> None:
        self.env[k][old] = made
        owner = self.old_carrier.get(old.name, old.name)
        node_id = f"r{k}/{owner}"
        # Every node of the replicated graph, also those a split in the plan replaces (split_step finds them).
        self.carrier[made.name] = node_id
        if owner == old.name:
            self.node_of[node_id] = made

    def call(self, fn, args: tuple, carried_by: str) -> fx.Node:
        node = self.new.call_function(fn, args)
        self.carrier[node.name] = carried_by
        return node

    def run(self) -> tuple[fx.GraphModule, dict[str, fx.Node], dict[str, str], list[Feed]]:
        r = self.r
        rows = part_rows(sum(self.shares), r)
        for k in range(r):
            for flat, p in enumerate(self.placeholders):
                q = self.new.placeholder(f"r{k}_{p.name}")
                q.meta = dict(self.twins[k][p.name].meta)
                value = p.meta.get("val")
                if p.name.startswith("input_") and isinstance(value, torch.Tensor) and value.dim() > 0:
                    self.feeds.append(Feed(flat, rows=rows[k]))
                elif self.shards is not None and p in self.shards.state_range:
                    self.feeds.append(Feed(flat, shard=self.shards.state_range[p][k]))
                    self.shards.parts[k].add(q)
                else:
                    self.feeds.append(Feed(flat, primary=k == 0))
                self.bind(k, p, q)
        # Copy the nodes in order, each on every replica; a reader of a gradient waits until every
        # gradient of its bucket is copied (the bucket's collective reads them all).
        waiting: list[fx.Node] = []
        for v in self.nodes:
            if v.op in ("placeholder", "output"):
                continue
            if not self._ready(v):
                waiting.append(v)
            elif self._copy(v) and waiting:
                waiting = self._flush(waiting)
        waiting = self._flush(waiting)
        if waiting:
            raise InvalidPlanError(
                f"node {waiting[0].name!r} reads a gradient reduced in a bucket with "
                f"gradients that depend on it; the plan's buckets cannot be executed"
            )
        for b in range(len(self.buckets)):
            self._reduce(b)
            stages, red = self.stages[b]
            self._emit(b, red + 1, len(stages))
            if self.shards is not None:
                for k in range(r):
                    self.shards.write_back(b, k)
        self._output()
        self.new.lint()
        out = fx.GraphModule(self.gm, self.new)
        fed = [self.twins[k][p.name] for k in range(self.r) for p in self.placeholders]
        propagate_meta(out, [feed.meta(p.meta.get("val")) for feed, p in zip(self.feeds, fed)])
        return out, self.node_of, self.carrier, self.feeds

    def _ready(self, v: fx.Node) -> bool:
        """Whether ``v``'s inputs are copied, and the buckets of the gradients it reads complete."""
        return all(
            a in self.env[0] and not (a in self.bucketed and self.missing[self.bucketed[a][0]])
            for a in v.all_input_nodes
        )

    def _flush(self, waiting: list[fx.Node]) -> list[fx.Node]:
        """Copy the waiting nodes that are ready (in order, again while any was); those still waiting."""
        progress = True
        while progress and waiting:
            progress, still = False, []
            for v in waiting:
                if self._ready(v):
                    self._copy(v)
                    progress = True
                else:
                    still.append(v)
            waiting = still
        return waiting

    def _copy(self, v: fx.Node) -> bool:
        """Copy ``v`` on every replica; whether that completed a bucket."""
        for k in range(self.r):

            def arg(a: fx.Node, k: int = k) -> fx.Node:
                return self.gradient(k, a) if a in self.bucketed else self.env[k][a]

            if self.shards is not None and v in self.shards.group_of:
                made = self.shards.rewrite(v, k, arg)
            else:
                twin = self.twins[k][v.name]

                def twin_arg(a: fx.Node, arg=arg) -> fx.Node:
                    return arg(self.by_name[a.name])

                made = self.new.create_node(
                    twin.op,
                    twin.target,
                    fx.node.map_arg(twin.args, twin_arg),
                    fx.node.map_arg(twin.kwargs, twin_arg),
                    name=f"r{k}_{v.name}",
                )
                made.meta = dict(twin.meta)
            self.bind(k, v, made)
        if v in self.bucketed:
            b = self.bucketed[v][0]
            self.missing[b] -= 1
            return self.missing[b] == 0
        return False

    # ---------------------------------------------------------------- the collective
    def gradient(self, k: int, old: fx.Node) -> fx.Node:
        """Replica ``k``'s reduced value of bucket tensor ``old`` (a view of the reduced buffer)."""
        b, i = self.bucketed[old]
        self._reduce(b)
        key = (b, i, k)
        if key not in self.views:
            bucket = self.buckets[b]
            buffer = self.reduced[(b, k)]
            self.views[key] = self.call(
                bucket_view, (buffer, bucket.offsets[i], tuple(old.meta["val"].shape)), self.carrier[buffer.name]
            )
        return self.views[key]

    def _reduce(self, b: int) -> None:
        """Emit bucket ``b``'s collective up to the step its readers read, once."""
        if b in self.emitted:
            return
        self.emitted.add(b)
        _, red = self.stages[b]
        self._emit(b, 0, red + 1)
        for k in range(self.r):
            self.reduced[(b, k)] = self.call(
                operator.getitem, (self.outputs[(b, red, k)], 0), self.stage_ids[(b, red, k)]
            )

    def _emit(self, b: int, first: int, last: int) -> None:
        stages, _ = self.stages[b]
        for s in range(first, last):
            for k in range(self.r):
                node_id = self.stage_ids[(b, s, k)]
                node = self._stage(b, s, k, node_id)
                self.node_of[node_id] = node
                self.carrier[node.name] = node_id
                self.outputs[(b, s, k)] = node

    def _stage(self, b: int, s: int, k: int, node_id: str) -> fx.Node:
        """The fx node of step ``s`` of bucket ``b`` on replica ``k``: ``(buffer, *pieces it sends)``."""
        if self.collectives == "torch":
            return self._torch_stage(b, s, k, node_id)
        stages, _ = self.stages[b]
        stage, bucket, r = stages[s], self.buckets[b], self.r
        size = r * bucket.chunk
        sends = []
        for later in range(s + 1, len(stages)):
            for consumer in range(r):
                if consumer != k and any(source == s and q == k for source, q, _ in stages[later].inputs[consumer]):
                    sends.append(((later, consumer), self._taken(stages[later], consumer, k)))
        self.consumers[(b, s, k)] = [c for c, _ in sends]
        chunks = [c for _, c in sends]
        if stage.role == "pack":
            tensors = [self.env[k][x] for x in bucket.tensors]
            packed = self.call(pack_bucket, ((self.shares[k], sum(self.shares)), size, *tensors), node_id)
            return self.new.call_function(collective_step, (packed, [], [], False, bucket.chunk, chunks))
        if stage.role == "shard":
            offsets, pieces = self.shards.updated_pieces(b, k)
            like = self.env[k][bucket.tensors[0]]
            packed = self.call(pack_shard, (size, offsets, like, *pieces), node_id)
            return self.new.call_function(collective_step, (packed, [], [], False, bucket.chunk, chunks))
        own, received, taken = None, [], []
        for source, q, _ in stage.inputs[k]:
            if q == k:
                own = self.call(operator.getitem, (self.outputs[(b, source, k)], 0), self.stage_ids[(b, source, k)])
                continue
            position = self.consumers[(b, source, q)].index((s, k)) + 1
            received.append(
                self.call(operator.getitem, (self.outputs[(b, source, q)], position), self.stage_ids[(b, source, q)])
            )
            taken.append(self._taken(stage, k, q))
        if own is None:
            raise InvalidPlanError(
                f"step {node_id!r} reads no buffer of its own replica; the runtime cannot execute it"
            )
        return self.new.call_function(
            collective_step, (own, received, taken, stage.role.endswith("reduce"), bucket.chunk, chunks)
        )

    def _torch_stage(self, b: int, s: int, k: int, node_id: str) -> fx.Node:
        """Step ``s`` of bucket ``b`` on replica ``k`` where ``torch.distributed`` runs the collective:
        the first step (packing the gradients; a sharded optimizer's parameters) starts it, the step
        the readers read (or the last) waits for it, the others pass its ``(pending,)`` along."""
        stages, red = self.stages[b]
        stage, bucket, r = stages[s], self.buckets[b], self.r
        if stage.role == "pack":
            tensors = [self.env[k][x] for x in bucket.tensors]
            packed = self.call(pack_bucket, ((self.shares[k], sum(self.shares)), r * bucket.chunk, *tensors), node_id)
            return self.new.call_function(all_reduce_start, (packed,))
        if stage.role == "shard":
            offsets, pieces = self.shards.updated_pieces(b, k)
            like = self.env[k][bucket.tensors[0]]
            packed = self.call(pack_shard, (r * bucket.chunk, offsets, like, *pieces), node_id)
            owners = [self.owner(q) for q in range(r)]
            return self.new.call_function(all_gather_start, (packed, bucket.chunk, owners[k], owners))
        previous = self.outputs[(b, s - 1, k)]
        if s == red or s == len(stages) - 1:
            return self.new.call_function(collective_wait, (previous,))
        return self.new.call_function(collective_pass, (previous,))

    def _taken(self, stage, k: int, q: int) -> list[int]:
        """The chunks step ``stage`` on replica ``k`` takes from replica ``q``."""
        r, hosts = self.r, self.hosts
        if stage.role == "ring_reduce":
            return [(k - 1 - stage.step) % r]
        if stage.role == "ring_gather":
            return [(k - stage.step) % r]
        a, h, width = _host_rank(k, hosts)
        aq, hq, _ = _host_rank(q, hosts)
        chunks = {
            "within_reduce": [a * width + x for x in range(width)],
            "across_reduce": [a * width + h],
            "across_gather": [a * width + hq],
            "within_gather": [aq * width + x for x in range(width)],
        }
        if stage.role not in chunks:
            raise InvalidPlanError(f"a collective step of role {stage.role!r} is not one the runtime executes")
        return chunks[stage.role]

    def owner(self, k: int) -> int:
        """The chunk of every bucket replica ``k`` holds reduced once the reduce-scatter is done."""
        stages, red = self.stages[0]
        if stages[red].role.startswith("ring"):
            return (k + 1) % self.r
        a, h, width = _host_rank(k, self.hosts)
        return a * width + h

    # ---------------------------------------------------------------- outputs
    def _output(self) -> None:
        """The step's outputs: a 0-d loss weighted over the replicas; anything else replica 0's."""
        output = next(v for v in self.nodes if v.op == "output")
        weights = [n / sum(self.shares) for n in self.shares]

        def result(a: fx.Node) -> fx.Node:
            value = a.meta.get("val")
            if self.r == 1 or not (isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()):
                return self.env[0][a]
            loss = self.call(
                weighted_loss,
                (weights, *[self.env[k][a] for k in range(self.r)]),
                self.carrier.get(self.env[0][a].name, f"r0/{a.name}"),
            )
            loss.meta = dict(a.meta)
            return loss

        self.new.output(fx.node.map_arg(output.args[0], result))


def _host_rank(k: int, hosts: list[list[int]]) -> tuple[int, int, int]:
    """(rank of replica ``k`` in its host, its host, the number of hosts)."""
    for h, members in enumerate(hosts):
        if k in members:
            return members.index(k), h, len(hosts)
    raise InvalidPlanError(f"replica {k} is on no host of the plan's collective ({hosts})")


def check_batch_inputs(placeholders: list[fx.Node], batch: int | None, parts: int, what: str) -> None:
    """Refuse a step whose batch cannot be cut into ``parts`` (replicas or micro-batches), in one line.

    Raises
    ------
    InvalidPlanError
        The step records no batch size, a tensor input does not lead with the
        batch, or the batch has fewer samples than ``parts``.
    """
    if batch is None:
        raise InvalidPlanError(
            f"the captured step records no batch size, so its inputs cannot be cut into {what}; capture it "
            "from a model and inputs (placer.capture)"
        )
    for p in placeholders:
        value = p.meta.get("val")
        if (
            p.name.startswith("input_")
            and isinstance(value, torch.Tensor)
            and (value.dim() == 0 or int(value.shape[0]) != int(batch))
        ):
            raise InvalidPlanError(
                f"input {p.name!r} of the step has shape {tuple(value.shape)}, which does not lead with the "
                f"batch ({batch} samples): the capture could not find its batch dimension, so a plan of "
                f"{what} cannot cut it; put the batch first, or plan without {what}"
            )
    if int(batch) < parts:
        raise InvalidPlanError(f"the batch has {batch} samples, fewer than the plan's {parts} {what}")


def _replica_shares(placeholders: list[fx.Node], batch: int | None, r: int) -> list[int]:
    """Samples of each replica (the first ones one more where the batch does not divide).

    Raises InvalidPlanError where the batch cannot be cut (:func:`check_batch_inputs`).
    """
    check_batch_inputs(placeholders, batch, r, "data-parallel replicas")
    return [hi - lo for lo, hi in part_rows(int(batch), r)]


class _Sharding:
    """A sharded optimizer's part of the rewrite (ZeRO stage 1).

    Replica ``k`` updates the elements of each parameter that lie in its chunk
    of the bucket (:meth:`_Rewrite.owner`): it reads that part of the reduced
    gradient, holds that part of the state (:class:`Feed`) and writes that part
    of the parameter; the all-gather then writes every part into every replica.
    What no gradient feeds (Adam's step counters) is updated whole on every replica.
    """

    def __init__(self, rw: _Rewrite):
        self.rw = rw
        graph, by_name = rw.graph, rw.by_name
        walks, optimizer = _state_writes(graph)
        arithmetic = _optimizer_arithmetic(graph, optimizer, batch_dependent(graph))
        position = {g: (b, i) for b, grads in enumerate(rw.layout.buckets) for i, g in enumerate(grads)}
        self.shape: dict[tuple[int, int], tuple[int, ...]] = {}
        self.state_range: dict[fx.Node, list[tuple[int, int]]] = {}
        self.param_of: dict[tuple[int, int], fx.Node] = {}
        self.group_of: dict[fx.Node, tuple[int, int]] = {}
        self.parts: list[set[fx.Node]] = [set() for _ in range(rw.r)]
        self.updated: dict[tuple[int, int, int], fx.Node] = {}
        writers_of: dict[tuple[int, int], list[fx.Node]] = {}
        for key, (writers, found) in walks.items():
            if not writers or not found:
                continue
            held = [
                by_name.get(graph.ids[m]) for m in graph.colocation_groups[key].tolist() if graph.op[m] == "placeholder"
            ]
            pos = position.get(next(iter(found))) if len(found) == 1 else None
            value = held[0].meta.get("val") if len(held) == 1 and held[0] is not None else None
            shape = tuple(rw.buckets[pos[0]].tensors[pos[1]].meta["val"].shape) if pos is not None else None
            if (
                pos is None
                or not isinstance(value, torch.Tensor)
                or tuple(value.shape) != shape
                or not value.is_contiguous()
            ):
                what = held[0].name if len(held) == 1 and held[0] is not None else key
                raise InvalidPlanError(
                    f"a sharded optimizer cannot update {what!r} in parts: its update reads "
                    f"{len(found)} gradients, or a tensor of another shape or layout than its "
                    f"gradient's; plan with data_parallel instead"
                )
            self.shape[pos] = shape
            if (rw.layout.param_factor[graph.colocation_groups[key]] < 1).all():
                self.state_range[held[0]] = [self.range(pos, k) for k in range(rw.r)]
            else:
                self.param_of[pos] = held[0]
            writers_of.setdefault(pos, []).extend(by_name[graph.ids[w]] for w in writers)
        # The optimizer's arithmetic belongs to the parameter whose state writes it feeds.
        is_arithmetic = {by_name[graph.ids[i]] for i in np.flatnonzero(arithmetic).tolist() if graph.ids[i] in by_name}
        conflict: set[fx.Node] = set()
        for pos, writers in writers_of.items():
            stack = list(writers)
            for w in writers:
                self.group_of[w] = pos
            while stack:
                v = stack.pop()
                for a in v.all_input_nodes:
                    if a not in is_arithmetic or self.group_of.get(a) == pos:
                        continue
                    if a in self.group_of:
                        conflict.add(a)
                        continue
                    self.group_of[a] = pos
                    stack.append(a)
        for v in conflict:
            self.group_of.pop(v, None)

    def range(self, pos: tuple[int, int], k: int) -> tuple[int, int]:
        """Elements ``[lo, hi)`` of the parameter at bucket position ``pos`` that replica ``k`` updates."""
        b, i = pos
        bucket = self.rw.buckets[b]
        first = self.rw.owner(k) * bucket.chunk
        lo = max(bucket.offsets[i], first) - bucket.offsets[i]
        hi = min(bucket.offsets[i] + bucket.numels[i], first + bucket.chunk) - bucket.offsets[i]
        return (lo, hi) if hi > lo else (0, 0)

    def rewrite(self, v: fx.Node, k: int, arg) -> fx.Node:
        """Replica ``k``'s node for optimizer node ``v``: on its part of the parameter where ``v`` works
        element-wise on tensors of the parameter's shape."""
        rw, parts = self.rw, self.parts[k]
        pos = self.group_of[v]
        shape = self.shape[pos]
        lo, hi = self.range(pos, k)
        new = rw.new

        def whole_shape(a: fx.Node) -> bool:
            value = a.meta.get("val")
            return isinstance(value, torch.Tensor) and tuple(value.shape) == shape

        def part(a: fx.Node) -> fx.Node:
            mapped = arg(a)
            if mapped in parts or not whole_shape(a):
                return mapped
            return rw.call(shard_of, (mapped, lo, hi), rw.carrier.get(mapped.name, ""))

        name = _op_name(v)
        if v.target is torch.ops.aten.copy_.default:
            dst = arg(v.args[0])
            if dst not in parts:
                flat = new.call_function(torch.ops.aten.view.default, (dst, [-1]))
                dst = new.call_function(torch.ops.aten.slice.Tensor, (flat, 0, lo, hi))
            made = new.call_function(v.target, (dst, part(v.args[1])), dict(v.kwargs))
            if pos in self.param_of and v.args[0] is self.param_of[pos]:
                self.updated[(pos[0], pos[1], k)] = made
        elif name in VIEW_OPS or not whole_shape(v):
            inputs = [arg(a) for a in v.all_input_nodes]
            if any(x in parts for x in inputs):
                if name not in VIEW_OPS:
                    raise InvalidPlanError(
                        f"optimizer node {v.name!r} ({v.target}) reads part of a parameter "
                        f"but gives a tensor of another shape; a sharded optimizer cannot "
                        f"run it in parts"
                    )
                made = new.call_function(torch.ops.aten.alias.default, (next(x for x in inputs if x in parts),))
            else:
                made = new.create_node(v.op, v.target, fx.node.map_arg(v.args, arg), fx.node.map_arg(v.kwargs, arg))
            if not any(x in parts for x in inputs):
                made.meta = dict(v.meta)
                return made
        else:
            made = new.create_node(v.op, v.target, fx.node.map_arg(v.args, part), fx.node.map_arg(v.kwargs, part))
        parts.add(made)
        return made

    def updated_pieces(self, b: int, k: int) -> tuple[list[int], list[fx.Node]]:
        """Offsets in bucket ``b``'s buffer and the nodes of the parameter parts replica ``k`` wrote."""
        offsets, pieces = [], []
        bucket = self.rw.buckets[b]
        for i in range(len(bucket.tensors)):
            if (b, i) not in self.param_of:
                continue
            lo, hi = self.range((b, i), k)
            if hi > lo:
                if (b, i, k) not in self.updated:
                    raise InvalidPlanError(
                        f"the update of parameter {self.param_of[(b, i)].name!r} was not found "
                        f"in the captured step; a sharded optimizer cannot run it in parts"
                    )
                offsets.append(bucket.offsets[i] + lo)
                pieces.append(self.updated[(b, i, k)])
        return offsets, pieces

    def write_back(self, b: int, k: int) -> None:
        """Write the all-gathered parameters of bucket ``b`` into replica ``k``'s parameters."""
        rw = self.rw
        stages, _ = rw.stages[b]
        last = len(stages) - 1
        node_id = rw.stage_ids[(b, last, k)]
        buffer = rw.call(operator.getitem, (rw.outputs[(b, last, k)], 0), node_id)
        bucket = rw.buckets[b]
        for i in range(len(bucket.tensors)):
            p = self.param_of.get((b, i))
            if p is None:
                continue
            view = rw.call(bucket_view, (buffer, bucket.offsets[i], self.shape[(b, i)]), node_id)
            rw.call(torch.ops.aten.copy_.default, (rw.env[k][p], view), node_id)


class _MetaProp(fx.Interpreter):
    """Runs a step on ``meta`` tensors to record every node's value as ``meta["val"]``: shapes that the
    rewrite changed (a replica's rows, a shard). A node that cannot run on ``meta`` (``.item()``) keeps
    the value it was traced with."""

    def run_node(self, n: fx.Node) -> Any:
        if n.op == "call_function" and n.target in TORCH_COLLECTIVE:
            args, _ = self.fetch_args_kwargs_from_env(n)
            result = args[0] if n.target is not all_reduce_start and n.target is not all_gather_start else (args[0],)
            n.meta["val"] = result
            return result
        try:
            result = super().run_node(n)
        except Exception:  # noqa: BLE001 - no meta kernel, or a value that depends on data
            result = _portable_value(n.meta.get("val"))
        if n.op != "output":
            n.meta["val"] = result
        return result


def propagate_meta(gm: fx.GraphModule, inputs: list[Any]) -> None:
    """Record every node's value of a rewritten step as ``meta["val"]``, from its placeholders' ``inputs``
    (tensors on ``meta``, :meth:`Feed.meta`): the shapes a replica's or a micro-batch's rows give."""
    _MetaProp(gm).run(*inputs)
