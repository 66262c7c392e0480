"""A captured training step bound to a plan: the device, order and transfers of every fx node.

Both executors run a :class:`Program`, built once from the step's
``torch.fx.GraphModule`` (its nodes are the graph's, by name), a plan and a
cluster:

* every fx node gets a device: a graph node the plan's; a node the graph
  leaves out that of the graph node that carries it (``carrier``: the parts
  of a split operation), else of its producer; a placeholder the graph
  leaves out that of the node that writes it (state lives where it is
  updated), else of its first reader;
* nodes are issued in the plan's per-device order, interleaved by the
  reference simulator's start order, repaired to respect every fx dependency;
* one transfer per (tensor, destination device), made as soon as the tensor
  exists (FORMATS.md rule 4), so a later in-place write cannot change what
  another device receives;
* a node that writes a tensor in place (``copy_`` into new parameters and
  optimizer state, batch norm's running statistics, any ``Tensor(a!)``
  argument) shares that tensor's device and keeps its program order against
  every reader of the tensor and its views; a transfer of such a tensor is a
  snapshot (processes) or is waited for before the write (CUDA streams);
* writers that may run after the step's last operation
  (:attr:`Program.deferred`) do, so the local executor writes the caller's
  tensors only once the rest of the step has succeeded.

Operations split by OS-DPOS run as real slices, parts and a concat
(:mod:`placer.runtime.splits`); a data-parallel plan runs as a rewrite with
a copy of the step per replica (:mod:`placer.runtime.replicas`), fed as
:attr:`Program.feeds` says. Tensor constants (``get_attr`` nodes) run like
operations: each step copies the constant to where the plan puts it.

Random operations (:func:`random_nodes`) each draw from their own stream,
seeded by :func:`op_seed` from the executor's base seed, the step number and
the node's name: whatever the plan and the backend, the same base seed gives
the same draws. Eager training draws from one global stream instead, so a
step with random operations does not equal eager training bit for bit.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx

from ..capture.layout import dense_layout, dense_strides, sent_contiguous, storage_span, views_compact
from ..cluster import Cluster
from ..errors import InvalidPlanError
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import simulate_bound
from ..transform.bind import bind_plan
from .microbatches import microbatch_step
from .replicas import Feed, collective_wait, replicate_step
from .splits import split_step

__all__ = ["Program", "Transfer", "compile_program", "random_nodes", "op_seed", "draw_seed", "bind_call"]


@dataclass(frozen=True)
class Transfer:
    """One tensor (or Python scalar) sent from its producer's device to one other device."""

    index: int  # position in Program.transfers; also the message tag
    node: fx.Node  # producer
    src: int  # device index
    dst: int
    snapshot: bool  # its storage is written in place later in the step: send a copy taken now


@dataclass
class Program:
    """What both executors need to run a placed training step.

    Attributes
    ----------
    gm : torch.fx.GraphModule
    graph : OpGraph
        The placed graph (node ids are fx node names).
    cluster : Cluster
    device_of : dict of fx.Node to int
        Device index of every placeholder and call node.
    schedule : list of fx.Node
        Call nodes in issue order; each device's subsequence is its plan order.
    placeholders : list of fx.Node
        In the order of the step's flat inputs.
    transfers : list of Transfer
    sends : dict of fx.Node to list of Transfer
        Transfers that leave as soon as the node's value exists.
    recv : dict of (fx.Node, int) to Transfer
        The transfer bringing a node's value to a device.
    writes : dict of fx.Node to list of fx.Node
        For in-place nodes, the nodes whose storage they write.
    guard : dict of fx.Node to list of Transfer
        For in-place nodes, the transfers of what they write that must complete
        before they run (the local executor's CUDA streams).
    frees : list of list of (fx.Node, int)
        Per schedule position, the (node, device) values that are dead after it.
    outputs : list
        The output node's flat arguments (fx.Node or constants).
    predicted_s : float
        The reference simulator's step time for this plan.
    graph_node : dict of fx.Node to int
        The fx nodes that are graph nodes, and their graph index.
    runs_with : dict of fx.Node to fx.Node
        For a call node the graph leaves out (a ``getitem``), the graph node it
        runs with, whose cost it shares as the simulator sees it.
    random : frozenset of fx.Node
        The nodes that draw random numbers, each run with its own seed (:func:`op_seed`).
    deferred : frozenset of fx.Node
        In-place writers whose value nothing reads, that are the last node to
        touch every storage they write, and whose inputs no later node writes
        (the writes of new parameters and optimizer state): run after the step's
        last operation, they write the same. Other writers (batch norm's running
        statistics) run in their place.
    compact_views : bool
        Whether a transfer of a view with gaps (an LSTM gate, a strided slice)
        sends its elements alone, as the graph's edge bytes count them: true
        unless the step reads a tensor's strides
        (:data:`~placer.capture.layout.STRIDE_READERS`), where it sends the storage the view spans.
    """

    gm: fx.GraphModule
    graph: OpGraph
    cluster: Cluster
    device_of: dict[fx.Node, int]
    schedule: list[fx.Node]
    placeholders: list[fx.Node]
    transfers: list[Transfer]
    sends: dict[fx.Node, list[Transfer]]
    recv: dict[tuple[fx.Node, int], Transfer]
    writes: dict[fx.Node, list[fx.Node]]
    guard: dict[fx.Node, list[Transfer]]
    frees: list[list[tuple[fx.Node, int]]]
    outputs: list
    predicted_s: float
    graph_node: dict[fx.Node, int] = field(default_factory=dict)
    runs_with: dict[fx.Node, fx.Node] = field(default_factory=dict)
    random: frozenset = frozenset()
    deferred: frozenset = frozenset()
    compact_views: bool = False
    feeds: list[Feed] = field(default_factory=list)

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @property
    def num_flat(self) -> int:
        """Flat inputs the caller gives a step (the captured step's)."""
        return max((f.flat for f in self.feeds), default=-1) + 1

    def input_values(self, flat_inputs: Sequence[Any], private: bool = True) -> list[Any]:
        """The value of every placeholder, in order, from the caller's flat inputs (:class:`Feed`)."""
        return [feed.value(flat_inputs, private) for feed in self.feeds]

    def writes_caller(self, i: int) -> bool:
        """Whether what placeholder ``i`` is written with is the caller's (replica 0's, or a sharded part;
        not a batch's rows, nor another replica's copy)."""
        feed = self.feeds[i]
        return feed.primary and feed.rows is None

    def flat_state(self, written: dict[int, Any], flat_inputs: Sequence[Any]) -> dict[int, Any]:
        """The caller's flat inputs after a step, from the values of the placeholders it wrote (placeholder
        index -> value): a replica's copies are left out, a sharded optimizer's parts joined."""
        out: dict[int, Any] = {}
        for i, value in written.items():
            feed = self.feeds[i]
            if not self.writes_caller(i):
                continue
            if feed.shard is None:
                out[feed.flat] = value
                continue
            if feed.flat not in out:
                out[feed.flat] = flat_inputs[feed.flat].detach().to("cpu", copy=True)
            lo, hi = feed.shard
            out[feed.flat].view(-1)[lo:hi] = value.to("cpu")
        return out

    def seed_of(self, v: fx.Node, base: int, step: int) -> int | None:
        """The seed node ``v`` draws from in step ``step`` of a run with base seed ``base`` (:func:`op_seed`);
        None for a node that draws nothing."""
        return op_seed(base, step, v.name) if v in self.random else None

    def node_id(self, v: fx.Node) -> str | None:
        """The graph node id of fx node ``v`` (None for nodes the graph leaves out)."""
        i = self.graph_node.get(v)
        return None if i is None else self.graph.ids[i]

    def schedule_of(self, device: int) -> list[fx.Node]:
        """The call nodes device ``device`` runs, in order."""
        return [v for v in self.schedule if self.device_of[v] == device]


def compile_program(
    gm: fx.GraphModule,
    graph: OpGraph,
    plan: Plan,
    cluster: Cluster,
    *,
    carrier: dict[str, str] | None = None,
    replica_steps: dict[int, fx.GraphModule] | None = None,
    collectives: str = "nodes",
) -> Program:
    """Bind a captured step's GraphModule to a plan of its graph.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The pure functional training step; its call nodes are named by the
        ids of ``graph``'s nodes.
    graph : OpGraph
        The graph the plan was made for.
    plan : Plan
    cluster : Cluster
    carrier : dict of str to str, optional
        fx node name -> the graph node it runs with (a ``getitem`` with the op
        whose output it picks), as :class:`placer.capture.CapturedStep` gives.
        fx nodes it does not name run with their first producer.
    replica_steps : dict of int to GraphModule, optional
        For a data-parallel plan, the step traced on each replica's number of
        samples (:func:`~placer.runtime.replicas.replica_steps`).
    collectives : {"nodes", "torch"}
        How a data-parallel plan's buckets are reduced
        (:func:`~placer.runtime.replicas.replicate_step`): ``torch`` where
        replica ``k`` is all on device ``k`` and every device starts the
        buckets' collectives in one order, else ``nodes``.

    Returns
    -------
    Program

    Raises
    ------
    InvalidPlanError
        The plan is for another graph, is invalid (FORMATS.md rule 8), splits
        an operation in a way the runtime cannot execute
        (:func:`~placer.runtime.splits.split_step`), or places a node that
        writes a tensor away from it.
    """

    bound = bind_plan(plan, graph, cluster)
    target = bound.graph
    feeds = None
    replicated = "data_parallel" in target.extra and any("replica" in extra for extra in target.node_extra)
    microbatched = "microbatches" in target.extra and int(target.extra["microbatches"]["count"]) > 1
    if replicated and microbatched:
        raise InvalidPlanError(
            f"the plan replicates a step cut into {target.extra['microbatches']['count']} micro-batches; the "
            "runtime runs replicas or micro-batches, not both: plan one of them"
        )
    if collectives == "torch" and not (replicated and _replica_per_device(target, bound.device_of, cluster)):
        collectives = "nodes"
    if replicated:
        original = gm, carrier
        gm, node_of, carrier, feeds = replicate_step(gm, graph, target, carrier, replica_steps, collectives)
        gm, node_of, carrier = split_step(gm, target, carrier, node_of)
    elif microbatched:
        gm, node_of, carrier, feeds = microbatch_step(gm, graph, target, carrier, replica_steps)
        gm, node_of, carrier = split_step(gm, target, carrier, node_of)
    else:
        gm, node_of, carrier = split_step(gm, target, carrier)
    sim = simulate_bound(bound)
    nodes = list(gm.graph.nodes)
    position = {v: k for k, v in enumerate(nodes)}
    placeholders = [v for v in nodes if v.op == "placeholder"]
    # Constants (get_attr) run like operations: each step copies the constant to its device.
    calls = [v for v in nodes if v.op in ("call_function", "get_attr")]
    others = [v for v in nodes if v.op not in ("placeholder", "call_function", "get_attr", "output")]
    if others:
        raise InvalidPlanError(
            f"the captured step has a {others[0].op!r} node {others[0].name!r}; only flat aten graphs (make_fx) can run"
        )
    unknown = [node_id for node_id in target.ids if node_id not in node_of]
    if unknown:
        raise InvalidPlanError(
            f"graph node {unknown[0]!r} is not a node of the captured step "
            f"({len(unknown)} such); the plan is for another capture"
        )
    graph_node = {node_of[node_id]: i for i, node_id in enumerate(target.ids)}

    writes = {v: _written_roots(v) for v in calls}
    writes = {v: w for v, w in writes.items() if w}
    device_of: dict[fx.Node, int] = {v: int(bound.device_of[i]) for v, i in graph_node.items()}
    runs_with: dict[fx.Node, fx.Node] = {}
    for v in nodes:
        owner = carrier.get(v.name)
        if v not in device_of and owner in target.index:
            device_of[v] = int(bound.device_of[target.index[owner]])
            runs_with[v] = node_of[owner]
    _place_unplaced(calls, placeholders, writes, device_of, graph_node, sim.start_rank)
    for v, roots in writes.items():
        for root in roots:
            if root.op == "get_attr":
                raise InvalidPlanError(
                    f"node {v.name!r} writes the tensor constant {root.target!r} of the captured "
                    f"step in place; the runtime copies constants afresh every step (register "
                    f"the tensor as a buffer of the model)"
                )
            if device_of[root] != device_of[v]:
                raise InvalidPlanError(
                    f"node {v.name!r} writes {root.name!r} in place on {cluster.devices[device_of[v]].name!r}, "
                    f"but {root.name!r} lives on {cluster.devices[device_of[root]].name!r}; writers of a tensor "
                    f"must share its device (colocation)"
                )

    # A torch.distributed collective runs in its own threads: its wait is issued once nothing else is
    # ready, as DDP's optimizer runs after backward, so that the rank computes while it reduces.
    lazy = frozenset(v for v in calls if v.target is collective_wait)
    schedule = _issue_order(calls, graph_node, sim.start_rank, writes, position, lazy)
    root_of = {v: _alias_root(v) for v in placeholders + calls}
    written = {root for roots in writes.values() for root in roots}
    transfers: list[Transfer] = []
    sends: dict[fx.Node, list[Transfer]] = {}
    recv: dict[tuple[fx.Node, int], Transfer] = {}
    for v in placeholders + schedule:
        dests = sorted({device_of[u] for u in v.users if u.op in ("call_function", "get_attr")} - {device_of[v]})
        for d in dests:
            x = Transfer(len(transfers), v, device_of[v], d, root_of[v] in written)
            transfers.append(x)
            sends.setdefault(v, []).append(x)
            recv[(v, d)] = x
    guard = {w: [x for x in transfers if root_of[x.node] in roots] for w, roots in writes.items()}
    if collectives == "torch" and not _collectives_in_one_order(schedule, graph_node, target, cluster.num_devices):
        return compile_program(original[0], graph, plan, cluster, carrier=original[1], replica_steps=replica_steps)
    output = next(v for v in nodes if v.op == "output")
    outputs = list(torch.utils._pytree.tree_leaves(output.args))
    return Program(
        gm=gm,
        graph=target,
        cluster=cluster,
        device_of=device_of,
        schedule=schedule,
        placeholders=placeholders,
        transfers=transfers,
        sends=sends,
        recv=recv,
        writes=writes,
        guard=guard,
        frees=_frees(schedule, device_of, outputs),
        outputs=outputs,
        predicted_s=float(sim.makespan_s),
        graph_node=graph_node,
        runs_with=runs_with,
        random=frozenset(random_nodes(gm)),
        deferred=_deferrable(schedule, writes),
        compact_views=views_compact(calls),
        feeds=feeds if feeds is not None else [Feed(i) for i in range(len(placeholders))],
    )


def _replica_per_device(target: OpGraph, device_of, cluster: Cluster) -> bool:
    """Whether replica ``k`` of a data-parallel graph (its collective included) is all on device ``k``, and
    every device holds one."""
    replicas = int(target.extra["data_parallel"]["replicas"])
    if replicas != cluster.num_devices:
        return False
    return all(extra.get("replica", device) == device for extra, device in zip(target.node_extra, device_of.tolist()))


def _collectives_in_one_order(
    schedule: list[fx.Node], graph_node: dict[fx.Node, int], target: OpGraph, devices: int
) -> bool:
    """Whether every device starts the buckets' collectives (their first steps) in the same order, as
    ``torch.distributed``'s collectives must be called."""
    from .replicas import all_gather_start, all_reduce_start  # deferred: imports torch

    started: list[list[str]] = [[] for _ in range(devices)]
    for v in schedule:
        if v.target in (all_reduce_start, all_gather_start) and v in graph_node:
            extra = target.node_extra[graph_node[v]]
            started[extra["replica"]].append(f"{extra['allreduce']['bucket']}:{extra['allreduce']['step']}")
    return all(order == started[0] for order in started)


def _frees(schedule: list[fx.Node], device_of: dict[fx.Node, int], outputs: list) -> list[list[tuple[fx.Node, int]]]:
    """Per schedule position, the (value, device) pairs last read there (outputs are kept)."""
    last: dict[tuple[fx.Node, int], int] = {}
    for k, v in enumerate(schedule):
        last[(v, device_of[v])] = k
        for a in v.all_input_nodes:
            last[(a, device_of[v])] = k
    keep = {(v, device_of[v]) for v in outputs if isinstance(v, fx.Node)}
    frees: list[list[tuple[fx.Node, int]]] = [[] for _ in schedule]
    for key, k in last.items():
        if key not in keep:
            frees[k].append(key)
    return frees


# ------------------------------------------------------------------ helpers
def _schema(v: fx.Node):
    return getattr(v.target, "_schema", None) if isinstance(v.target, torch._ops.OpOverload) else None


def _arg_nodes(v: fx.Node, schema) -> list[tuple[Any, fx.Node]]:
    """(schema argument, fx node) for every node argument of ``v`` that the schema names."""
    out = []
    for k, a in enumerate(schema.arguments):
        value = v.args[k] if k < len(v.args) else v.kwargs.get(a.name)
        for leaf in torch.utils._pytree.tree_leaves(value):
            if isinstance(leaf, fx.Node):
                out.append((a, leaf))
    return out


def _alias_root(v: fx.Node) -> fx.Node:
    """The node whose storage ``v``'s value shares (itself unless it is a view of an input)."""
    seen = 0
    while seen < 10_000:
        schema = _schema(v)
        if schema is None or not schema.returns or schema.returns[0].alias_info is None:
            return v
        sets = schema.returns[0].alias_info.before_set
        src = next(
            (
                n
                for a, n in _arg_nodes(v, schema)
                if a.alias_info is not None and not a.alias_info.is_write and a.alias_info.before_set & sets
            ),
            None,
        )
        if src is None:
            return v
        v = src
        seen += 1
    return v


# Ops that update their running statistics (arguments 3 and 4) in training mode
# although their schema does not mark them as written.
_HIDDEN_STAT_WRITERS = {
    torch.ops.aten.native_batch_norm.default,
    torch.ops.aten.cudnn_batch_norm.default,
    torch.ops.aten.miopen_batch_norm.default,
}


def _written_roots(v: fx.Node) -> list[fx.Node]:
    """Storages that node ``v`` writes in place (schema ``Tensor(a!)`` arguments), as alias roots."""
    schema = _schema(v)
    if schema is None:
        return []
    written = [n for a, n in _arg_nodes(v, schema) if a.alias_info is not None and a.alias_info.is_write]
    if v.target in _HIDDEN_STAT_WRITERS and len(v.args) > 5 and v.args[5] is True:
        written += [n for n in v.args[3:5] if isinstance(n, fx.Node)]
    roots: list[fx.Node] = []
    for n in written:
        root = _alias_root(n)
        if root not in roots:
            roots.append(root)
    return roots


def _deferrable(schedule: list[fx.Node], writes: dict[fx.Node, list[fx.Node]]) -> frozenset:
    """The writers whose value nothing reads, that are the last node of ``schedule`` to touch (read, write
    or view) every storage they write, and whose inputs no later node writes: run after the last node
    (on the inputs they would have read, which the runtime keeps), they write the same."""
    touched: dict[fx.Node, int] = {}
    written: dict[fx.Node, int] = {}
    for k, v in enumerate(schedule):
        for a in v.all_input_nodes:
            touched[_alias_root(a)] = k
        for root in writes.get(v, ()):
            written[root] = k
    return frozenset(
        v
        for k, v in enumerate(schedule)
        if v in writes
        and not v.users
        and all(touched[root] == k for root in writes[v])
        and all(written.get(_alias_root(a), k) <= k for a in v.all_input_nodes)
    )


def _place_unplaced(calls, placeholders, writes, device_of, graph_node, start_rank) -> None:
    """Devices for the fx nodes the graph leaves out."""
    for v in calls:
        if v in device_of:
            continue
        producers = [a for a in v.all_input_nodes if a in device_of]
        if producers:
            device_of[v] = device_of[producers[0]]
    writer_of: dict[fx.Node, fx.Node] = {}
    for v, roots in writes.items():
        for root in roots:
            writer_of.setdefault(root, v)
    for p in placeholders:
        if p in device_of:
            continue
        if p in writer_of:
            device_of[p] = device_of[writer_of[p]]
            continue
        readers = [u for u in p.users if u in graph_node]
        if readers:
            first = min(readers, key=lambda u: int(start_rank[graph_node[u]]))
            device_of[p] = device_of[first]
        else:
            device_of[p] = 0
    # Call nodes whose inputs are all placeholders placed just now (or constants).
    for v in calls:
        if v not in device_of:
            producers = [a for a in v.all_input_nodes if a in device_of]
            device_of[v] = device_of[producers[0]] if producers else 0


def _issue_order(calls, graph_node, start_rank, writes, position, lazy=frozenset()) -> list[fx.Node]:
    """Call nodes in the simulator's start order, repaired to respect every fx dependency.

    A node of the graph is keyed by its start rank; a node the graph leaves out
    by the latest key of its inputs (it runs right after them). Kahn's algorithm
    with these keys as priorities gives the plan order wherever the plan is
    consistent with the fx graph, and a valid order everywhere. A ``lazy`` node
    (a wait for a collective running in other threads) is issued only when no
    other node is ready.
    """
    key: dict[fx.Node, float] = {}
    for v in calls:
        if v in graph_node:
            key[v] = float(start_rank[graph_node[v]])
        else:
            key[v] = max((key[a] for a in v.all_input_nodes if a in key), default=-1.0)
    deps: dict[fx.Node, set[fx.Node]] = {v: {a for a in v.all_input_nodes if a in key} for v in calls}
    # An in-place writer keeps its program order against every other reader of what it
    # writes (or of a view of it): earlier readers run before it, later ones after it.
    readers_of: dict[fx.Node, list[fx.Node]] = {}
    for v in calls:
        for a in v.all_input_nodes:
            readers_of.setdefault(_alias_root(a), []).append(v)
    for v, roots in writes.items():
        for root in roots:
            for r in readers_of.get(root, []):
                if r is not v:
                    (deps[v] if position[r] < position[v] else deps[r]).add(r if position[r] < position[v] else v)
    users: dict[fx.Node, list[fx.Node]] = {v: [] for v in calls}
    for v, ds in deps.items():
        for d in ds:
            users[d].append(v)
    pending = {v: len(ds) for v, ds in deps.items()}
    priority = {v: math.inf if v in lazy else key[v] for v in calls}
    heap = [(priority[v], position[v], v.name) for v in calls if pending[v] == 0]
    heapq.heapify(heap)
    by_name = {v.name: v for v in calls}
    order: list[fx.Node] = []
    while heap:
        _, _, name = heapq.heappop(heap)
        v = by_name[name]
        order.append(v)
        for u in users[v]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(heap, (priority[u], position[u], u.name))
    if len(order) != len(calls):
        stuck = [v.name for v in calls if pending[v] > 0][:4]
        raise InvalidPlanError(f"in-place writes of the captured step form a cycle with its reads near {stuck}")
    return order


# ---------------------------------------------------------------- random operations
def _is_random(v: fx.Node) -> bool:
    """Whether call node ``v`` draws random numbers (an aten op tagged ``nondeterministic_seeded``)
    that change its result: a ``bernoulli`` of probability 0 or 1, a dropout of probability 0 or out
    of training, or an attention kernel with ``dropout_p`` 0 (``scaled_dot_product_attention``'s
    default) draws nothing that matters."""
    target = v.target
    if (
        v.op != "call_function"
        or not isinstance(target, torch._ops.OpOverload)
        or torch.Tag.nondeterministic_seeded not in target.tags
    ):
        return False
    packet = target.overloadpacket
    p = _argument(v, "p")
    if packet is torch.ops.aten.bernoulli and isinstance(p, (int, float)) and p in (0, 1):
        return False
    if packet in (torch.ops.aten.native_dropout, torch.ops.aten.dropout, torch.ops.aten.alpha_dropout):
        if _argument(v, "train") is False or (isinstance(p, (int, float)) and p == 0):
            return False
    dropout_p = _argument(v, "dropout_p")
    return not (isinstance(dropout_p, (int, float)) and dropout_p == 0)


def _argument(v: fx.Node, name: str) -> Any:
    """The value of ``v``'s argument ``name`` (given by position or keyword, else its schema's default; None
    where the op has no such argument)."""
    for k, argument in enumerate(v.target._schema.arguments):
        if argument.name == name:
            if k < len(v.args) and not argument.kwarg_only:
                return v.args[k]
            return v.kwargs.get(name, argument.default_value if argument.has_default_value() else None)
    return None


def random_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes of a captured step that draw random numbers (dropout's ``bernoulli``, ``rand``, ...)."""
    return [v for v in gm.graph.nodes if _is_random(v)]


def op_seed(base: int, step: int, name: str) -> int:
    """The seed of random node ``name`` in step ``step`` (from 0) of a run with base seed ``base``.

    A hash, the same in every process (unlike Python's ``hash``): local and
    distributed runs with the same base seed draw the same numbers.
    """
    digest = hashlib.blake2b(f"{int(base)}:{int(step)}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def draw_seed() -> int:
    """A base seed drawn from torch's global generator (so ``torch.manual_seed`` makes a run repeatable)."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def _default_generator(device: torch.device) -> torch.Generator | None:
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return None


# ---------------------------------------------------------------- running nodes
def resolve(arg: Any, env: dict[fx.Node, Any]) -> Any:
    """An fx argument with every node replaced by its value in ``env``."""
    return fx.node.map_arg(arg, lambda n: env[n])


def constant_value(v: fx.Node) -> Any:
    """The value of ``get_attr`` node ``v``: the attribute of the GraphModule that owns its graph."""
    value: Any = v.graph.owning_module
    for part in str(v.target).split("."):
        value = getattr(value, part)
    return value


def call_node(v: fx.Node, env: dict[fx.Node, Any], device: torch.device, seed: int | None = None) -> Any:
    """Run call node ``v`` on its inputs in ``env``; factory ops create their tensors on ``device``.

    A ``get_attr`` node gives a copy of its constant on ``device``. With
    ``seed``, a random operation draws from ``device``'s generator seeded with
    it, which is then restored as it was.
    """
    if v.op == "get_attr":
        return copy_to(constant_value(v), device)
    args = resolve(v.args, env)
    kwargs = resolve(v.kwargs, env)
    if "device" in kwargs:
        kwargs = dict(kwargs, device=device)
    generator = None if seed is None else _default_generator(device)
    if generator is None:
        return v.target(*args, **kwargs)
    saved = generator.get_state()
    generator.manual_seed(seed)
    try:
        return v.target(*args, **kwargs)
    finally:
        generator.set_state(saved)


def _holds_node(arg: Any) -> bool:
    """Whether ``arg`` is a container with an fx node somewhere inside (``cat``'s list of tensors)."""
    if isinstance(arg, (list, tuple)):
        return any(isinstance(a, fx.Node) or _holds_node(a) for a in arg)
    if isinstance(arg, dict):
        return any(isinstance(a, fx.Node) or _holds_node(a) for a in arg.values())
    return False


def bind_call(v: fx.Node, device: torch.device) -> Callable[[Mapping[fx.Node, Any]], Any]:
    """Call node ``v`` as a function of its inputs' values: :func:`call_node` with the lookups done once.

    An executor runs thousands of operations a step from Python, and
    :func:`call_node` finds each one's arguments anew: ``fx.map_arg`` over
    its ``args`` and ``kwargs``, then ``OpOverload.__call__``, a few
    microseconds an operation that the step's own ATen work does not hide on a
    CPU. This binds, once, which positions of ``v``'s arguments are which
    inputs, and the operator's C++ entry point (``OpOverload._op``, which its
    ``__call__`` calls), so that a step pays one lookup per input.

    Contract: ``bind_call(v, device)(env) == call_node(v, env, device)`` for a
    call or ``get_attr`` node that draws no random numbers (those need their
    step's seed: call :func:`call_node`). ``env`` maps each of
    ``v.all_input_nodes`` to its value.

    Examples
    --------
    >>> g = fx.Graph(); x = g.placeholder("x"); y = g.call_function(torch.ops.aten.add.Tensor, (x, x), {"alpha": 2})
    >>> bind_call(y, torch.device("cpu"))({x: torch.tensor([1.0])}).tolist()
    [3.0]
    """
    if v.op == "get_attr":
        return lambda env: copy_to(constant_value(v), device)
    fn = v.target._op if isinstance(v.target, torch._ops.OpOverload) else v.target
    args, kwargs = list(v.args), dict(v.kwargs)
    if "device" in kwargs:
        kwargs["device"] = device
    if any(_holds_node(a) for a in args) or any(_holds_node(a) for a in kwargs.values()):
        nested_args, nested_kwargs = tuple(args), kwargs
        return lambda env: fn(
            *fx.node.map_arg(nested_args, env.__getitem__), **fx.node.map_arg(nested_kwargs, env.__getitem__)
        )
    slots = tuple((i, a) for i, a in enumerate(args) if isinstance(a, fx.Node))
    keyword_slots = tuple((name, a) for name, a in kwargs.items() if isinstance(a, fx.Node))
    if not kwargs and len(slots) == len(args):  # every argument an input: the common case
        inputs = tuple(a for _, a in slots)
        if len(inputs) == 1:
            (first,) = inputs
            return lambda env: fn(env[first])
        if len(inputs) == 2:
            first, second = inputs
            return lambda env: fn(env[first], env[second])
        return lambda env: fn(*[env[a] for a in inputs])

    def call(env: Mapping[fx.Node, Any]) -> Any:
        values = args.copy()
        for i, a in slots:
            values[i] = env[a]
        if not keyword_slots:
            return fn(*values, **kwargs)
        keywords = kwargs.copy()
        for name, a in keyword_slots:
            keywords[name] = env[a]
        return fn(*values, **keywords)

    return call


def python_scalar_kind(value: Any) -> torch.dtype | None:
    """The dtype a Python scalar travels as (0-d tensor), or None for a tensor."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, float):
        return torch.float64
    return None


def value_spec(v: fx.Node, compact: bool = False) -> tuple:
    """What a node's value looks like as it travels, from its trace metadata: ``("tensor", size, stride,
    dtype)`` or ``("scalar", dtype)``; with ``compact``, a view with gaps as its elements alone, dense in
    the order of its strides (:func:`~placer.capture.layout.dense_strides`)."""
    if "placer_spec" in v.meta:  # nodes made by split_step
        spec = v.meta["placer_spec"]
    else:
        spec = _value_spec(v)
    if spec[0] == "tensor" and sent_contiguous(spec[1], spec[2], compact):
        spec = ("tensor", spec[1], dense_strides(spec[1], spec[2]), spec[3])
    return spec


def _value_spec(v: fx.Node) -> tuple:
    val = v.meta.get("val")
    if isinstance(val, torch.Tensor):
        return ("tensor", tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()), val.dtype)
    if isinstance(val, (torch.SymBool, bool)):
        return ("scalar", torch.bool)
    if isinstance(val, (torch.SymInt, int)):
        return ("scalar", torch.int64)
    if isinstance(val, (torch.SymFloat, float)):
        return ("scalar", torch.float64)
    raise InvalidPlanError(
        f"node {v.name!r} produces a {type(val).__name__}, which cannot be sent between "
        f"devices; place it with its consumers"
    )


def copy_to(t: Any, device: torch.device, compact: bool = False) -> Any:
    """A copy of ``t`` on ``device`` with the same strides (Python scalars pass through).

    A view with gaps or repeats (a strided slice, an ``expand``) is copied as
    the storage it spans, so the copy has the same strides and values; with
    ``compact``, one with gaps is copied as its elements alone, dense in the
    order of its strides (the same values; :attr:`Program.compact_views`).
    """
    if not isinstance(t, torch.Tensor):
        return t
    if dense_layout(t.shape, t.stride()):
        return t.to(device, copy=True, non_blocking=True)
    if sent_contiguous(t.shape, t.stride(), compact):
        dense = torch.empty_strided(t.shape, dense_strides(t.shape, t.stride()), dtype=t.dtype, device=device)
        return dense.copy_(t, non_blocking=True)
    span = storage_span(t.shape, t.stride())
    raw = t.as_strided((span,), (1,), t.storage_offset()).to(device, copy=True, non_blocking=True)
    return raw.as_strided(t.shape, t.stride(), 0)


def pack(value: Any, spec: tuple, device: torch.device, snapshot: bool) -> torch.Tensor | None:
    """The 1-D buffer that carries ``value`` to another process, laid out as ``spec`` says.

    A tensor travels as the storage span of its captured (size, stride), so the
    receiver rebuilds exactly that layout (:func:`unpack`); a Python scalar as a
    0-d tensor. ``snapshot`` copies a buffer that would otherwise alias ``value``.
    None for an empty tensor (nothing to send).
    """
    if spec[0] == "scalar":
        return torch.tensor(value, dtype=spec[1], device=device)
    _, size, stride, dtype = spec
    span = storage_span(size, stride)
    if span == 0:
        return None
    if tuple(value.stride()) == stride:
        flat = value.as_strided((span,), (1,), value.storage_offset())
        return flat.clone() if snapshot else flat
    # Strides differ from the capture's: lay the values out as captured. Repeated
    # elements (stride 0) are written once, through the first index of those dimensions.
    laid = torch.empty(span, dtype=dtype, device=device)
    first = [0 if st == 0 else slice(None) for st in stride]
    one = [1 if st == 0 else n for n, st in zip(size, stride)]
    laid.as_strided(one, stride, 0).copy_(value[tuple(first)].reshape(one))
    return laid


def unpack(buf: torch.Tensor | None, spec: tuple, device: torch.device) -> Any:
    """The value :func:`pack` sent, from the received buffer."""
    if spec[0] == "scalar":
        return buf.item()
    _, size, stride, dtype = spec
    if buf is None:
        return torch.empty_strided(size, stride, dtype=dtype, device=device)
    return buf.as_strided(size, stride, 0)


def message_bytes(spec: tuple) -> int:
    """Bytes :func:`pack` sends for a value of ``spec``."""
    if spec[0] == "scalar":
        return torch.empty((), dtype=spec[1]).element_size()
    return storage_span(spec[1], spec[2]) * torch.empty((), dtype=spec[3]).element_size()


def receive_buffer(spec: tuple, device: torch.device) -> torch.Tensor | None:
    """An uninitialised buffer for what :func:`pack` sends for ``spec`` (None when nothing is sent)."""
    if spec[0] == "scalar":
        return torch.empty((), dtype=spec[1], device=device)
    span = storage_span(spec[1], spec[2])
    return None if span == 0 else torch.empty(span, dtype=spec[3], device=device)
