"""Execute micro-batched plans: the captured step once per micro-batch, gradients accumulated, one update.

A micro-batched plan places the graph of
:func:`~placer.transform.microbatch.microbatch_graph`: every
batch-proportional node ``x`` as ``m`` copies ``mb{k}/x`` on rows
``[lo_k, hi_k)`` of the batch, every other node (parameters, optimizer
state, the optimizer) once, and per gradient a chain of accumulation nodes
``mb{k}/g.accumulate``. :func:`microbatch_step` rewrites the captured fx
graph the same way, so that every placed node is an fx node the executors
run like any other:

* micro-batch ``k`` gets its own placeholder for each batch input, fed its
  rows (:class:`~placer.runtime.replicas.Feed`); parameters, buffers and
  optimizer state are the caller's, once;
* copy ``k`` of a node is the node of the step traced on micro-batch ``k``'s
  number of samples (its shapes), reading copy ``k`` of its batch-proportional
  inputs and the one node of the others;
* accumulation node ``k`` adds micro-batch ``k``'s gradient, scaled by its
  share of the batch ``n_k / B``, into the running sum (node 1 also scales
  micro-batch 0's), so the sum is the gradient of the global batch's mean
  loss; whatever read the gradient reads the sum; where the plan groups the
  micro-batches (``groups`` in the graph's ``microbatches``: replica groups of
  pipelines), each group's run of them is summed so, and the accumulation of
  a later group's first micro-batch adds that group's sum to the groups'
  before it;
* the loss is the micro-batches' losses weighted by their shares.

Semantics are those of gradient accumulation, which is what
``torch.distributed.pipelining``'s schedules compute: batch norm normalises
each micro-batch by its own statistics and updates its running statistics
once per micro-batch, in micro-batch order; a buffer update that does not
read the batch (batch norm's ``num_batches_tracked``) runs once per step, as
the captured step has it. The batch-norm backward of a micro-batch does not
read the running statistics (training mode ignores them), so a later
micro-batch's forward need not wait for an earlier one's backward.
"""

from __future__ import annotations

import operator
from typing import Mapping

import torch
import torch.fx as fx

from ..errors import InvalidPlanError
from ..graph import OpGraph
from .replicas import Feed, check_batch_inputs, propagate_meta, weighted_loss

__all__ = ["microbatch_step", "accumulate_gradient", "join_rows", "microbatch_rows_of"]


def _scaled(grad: torch.Tensor, n: int, total: int) -> torch.Tensor:
    """``grad * n / total``, a division where ``n`` divides ``total`` (as DDP divides by its replicas)."""
    return grad / (total // n) if total % n == 0 else grad * (n / total)


def accumulate_gradient(
    running: torch.Tensor, grad: torch.Tensor, first: tuple[int, int] | None, share: tuple[int, int]
) -> torch.Tensor:
    """The running sum of a gradient after one more micro-batch's: ``running + grad * n / B``.

    ``share = (n, B)``: the micro-batch's samples and the batch's. The first
    accumulation also scales ``running`` (micro-batch 0's gradient) by its
    share ``first``.

    Examples
    --------
    >>> accumulate_gradient(torch.tensor([2.0]), torch.tensor([4.0]), (1, 2), (1, 2)).tolist()
    [3.0]
    >>> accumulate_gradient(torch.tensor([3.0]), torch.tensor([3.0]), None, (1, 3)).tolist()
    [4.0]
    """
    base = running if first is None else _scaled(running, *first)
    return base + _scaled(grad.to(base.device), *share)


def join_rows(*parts: torch.Tensor) -> torch.Tensor:
    """A per-sample output of the step from the micro-batches' rows, in order (on the first part's device)."""
    device = parts[0].device
    return torch.cat([p.to(device) for p in parts])


def microbatch_rows_of(target: OpGraph) -> tuple[list[tuple[int, int]], int]:
    """Rows ``[lo, hi)`` of each micro-batch and the batch's samples, as the plan's graph records them."""
    info = target.extra["microbatches"]
    return [(int(lo), int(hi)) for lo, hi in info["rows"]], int(info["total"])


def microbatch_step(
    gm: fx.GraphModule,
    graph: OpGraph,
    target: OpGraph,
    carrier: dict[str, str] | None,
    steps: Mapping[int, fx.GraphModule] | None = None,
) -> tuple[fx.GraphModule, dict[str, fx.Node], dict[str, str], list[Feed]]:
    """The captured step rewritten as the micro-batched graph ``target`` lays it out.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The captured step (not modified).
    graph : OpGraph
        Its graph, which ``target`` cuts into micro-batches.
    target : OpGraph
        The plan's graph (:func:`~placer.transform.microbatch.microbatch_graph` of ``graph``).
    carrier : dict, optional
        fx node name -> graph node id, for the captured step.
    steps : dict of int to GraphModule, optional
        The step traced on each micro-batch's number of samples
        (:func:`~placer.runtime.replicas.replica_steps`).

    Returns
    -------
    (GraphModule, dict, dict, list of Feed)
        The step to run, ``target``'s node id -> its fx node, the carrier of
        the new step's fx nodes, and how each placeholder is fed from the
        captured step's flat inputs.

    Raises
    ------
    InvalidPlanError
        The batch cannot be cut (:func:`check_batch_inputs`), a micro-batch's
        traced step is missing or has other nodes, or a node that stays whole
        reads a batch-proportional value that is not a gradient the plan
        accumulates.
    """
    return _MicroRewrite(gm, graph, target, carrier or {}, steps or {}).run()


class _MicroRewrite:
    """One rewrite of a captured step into its micro-batches (see :func:`microbatch_step`)."""

    def __init__(self, gm, graph, target, carrier, steps):
        self.gm, self.graph, self.target, self.old_carrier = gm, graph, target, carrier
        self.rows, self.total = microbatch_rows_of(target)
        self.m = m = len(self.rows)
        self.groups = int((target.extra.get("microbatches") or {}).get("groups", 1))
        if self.groups < 1 or m % self.groups:
            raise InvalidPlanError(f"the plan's {m} micro-batches do not divide into its {self.groups} groups")
        self.nodes = list(gm.graph.nodes)
        self.by_name = {v.name: v for v in self.nodes}
        self.placeholders = [v for v in self.nodes if v.op == "placeholder"]
        batch = graph.extra.get("batch_size")
        check_batch_inputs(self.placeholders, batch, m, "micro-batches")
        if int(batch) != self.total:
            raise InvalidPlanError(
                f"the plan cuts a batch of {self.total} samples into micro-batches, but the step's batch "
                f"has {batch}; plan again for this batch"
            )
        # Target node ids: (original id, micro-batch) -> copy; (gradient id, output, micro-batch) -> add.
        self.copy_id: dict[tuple[str, int], str] = {}
        self.add_id: dict[tuple[str, int, int], str] = {}
        self.group_id: dict[tuple[str, int], str] = {}  # (original id, group) -> a later group's own copy
        for node_id, extra in zip(target.ids, target.node_extra):
            if "group_copy_of" in extra:
                self.group_id[(extra["group_copy_of"], int(extra["group"]))] = node_id
            elif "microbatch_of" in extra:  # a copy, or a node of its split (which split_step makes later)
                self.copy_id[(extra["microbatch_of"], int(extra["microbatch"]))] = extra.get("split_of", node_id)
            elif "accumulate" in extra:
                acc = extra["accumulate"]
                self.add_id[(acc["gradient"], int(acc["tensor"]), int(extra["microbatch"]))] = node_id
        self.per_batch = {orig for orig, _ in self.copy_id}
        names = [v.name for v in self.nodes]
        self.twins: list[dict[str, fx.Node]] = []
        for lo, hi in self.rows:
            n = hi - lo
            step = gm if n == self.total else steps.get(n)
            if step is None:
                raise InvalidPlanError(
                    f"a micro-batch of the plan takes {n} of the batch's {self.total} samples, and the step "
                    f"traced on {n} samples was not given (placer.runtime.replicas.replica_steps(captured, plan))"
                )
            twin = {v.name: v for v in step.graph.nodes}
            if list(twin) != names:
                raise InvalidPlanError(f"the step traced on {n} samples has other nodes than the captured one")
            self.twins.append(twin)
        self.new = fx.Graph()
        self.env: list[dict[fx.Node, fx.Node]] = [{} for _ in range(m)]
        self.whole: dict[fx.Node, fx.Node] = {}
        self.grouped = {orig for orig, _ in self.group_id}  # owners each group computes on its own
        self.group_env: dict[tuple[int, fx.Node], fx.Node] = {}  # (group >= 1, node) -> its copy
        self.summed: dict[fx.Node, fx.Node] = {}
        self.node_of: dict[str, fx.Node] = {}
        self.carrier: dict[str, str] = {}
        self.feeds: list[Feed] = []

    def owner(self, v: fx.Node) -> str:
        return self.old_carrier.get(v.name, v.name)

    def cut(self, v: fx.Node) -> bool:
        """Whether ``v`` runs once per micro-batch."""
        return self.owner(v) in self.per_batch

    def bind(self, v: fx.Node, made: fx.Node, k: int | None) -> None:
        owner = self.owner(v)
        node_id = owner if k is None else self.copy_id[(owner, k)]
        self.carrier[made.name] = node_id
        if owner == v.name:
            self.node_of[node_id] = made
        if k is None:
            self.whole[v] = made
        else:
            self.env[k][v] = made

    def run(self):
        for flat, p in enumerate(self.placeholders):
            if not self.cut(p):
                q = self.new.placeholder(p.name)
                q.meta = dict(p.meta)
                self.feeds.append(Feed(flat))
                self.bind(p, q, None)
                continue
            value = p.meta.get("val")
            batched = p.name.startswith("input_") and isinstance(value, torch.Tensor) and value.dim() > 0
            for k in range(self.m):
                q = self.new.placeholder(f"mb{k}_{p.name}")
                q.meta = dict(self.twins[k][p.name].meta)
                self.feeds.append(Feed(flat, rows=self.rows[k]) if batched else Feed(flat))
                self.bind(p, q, k)
        for v in self.nodes:
            if v.op in ("placeholder", "output"):
                continue
            if self.cut(v):
                for k in range(self.m):
                    self._copy(v, k)
            else:
                self._copy(v, None)
                if self.owner(v) in self.grouped:
                    for g in range(1, self.groups):
                        self._copy(v, None, g)
        self._output()
        self.new.lint()
        out = fx.GraphModule(self.gm, self.new)
        fed = [p for p in self.new.nodes if p.op == "placeholder"]
        propagate_meta(out, [feed.meta(p.meta.get("val")) for feed, p in zip(self.feeds, fed)])
        return out, self.node_of, self.carrier, self.feeds

    def _copy(self, v: fx.Node, k: int | None, group: int = 0) -> None:
        """Copy ``v`` for micro-batch ``k`` (None: once for the step, or for ``group``'s own copy)."""
        source = v if k is None else self.twins[k][v.name]
        if k is not None:
            group = k // (self.m // self.groups)

        def arg(a: fx.Node) -> fx.Node:
            a = self.by_name[a.name]
            if not self.cut(a):
                return self.group_env.get((group, a), self.whole[a])
            if k is None:
                return self._sum(a, v)
            return self.env[k][a]

        args = fx.node.map_arg(source.args, arg)
        if k is not None and _op_name(v) == "native_batch_norm_backward" and len(args) > 7 and args[7]:
            args = (*args[:3], None, None, *args[5:])  # training mode reads the saved statistics, not the running
        made = self.new.create_node(
            source.op,
            source.target,
            args,
            fx.node.map_arg(source.kwargs, arg),
            name=f"mb{k}_{v.name}" if k is not None else f"grp{group}_{v.name}" if group else v.name,
        )
        made.meta = dict(source.meta)
        if k is None and group:
            self.group_env[(group, v)] = made
            node_id = self.group_id[(self.owner(v), group)]
            self.carrier[made.name] = node_id
            if self.owner(v) == v.name:
                self.node_of[node_id] = made
            return
        self.bind(v, made, k)

    def _sum(self, a: fx.Node, reader: fx.Node) -> fx.Node:
        """The sum over the micro-batches of batch-proportional ``a`` (a gradient), for a node that stays whole."""
        if a in self.summed:
            return self.summed[a]
        owner = self.owner(a)
        if a.name == owner:
            output = 0
        elif a.target is operator.getitem and self.owner(a.args[0]) == owner:
            output = int(a.args[1])
        else:
            outputs = {t for (g, t, _) in self.add_id if g == owner}
            output = next(iter(outputs)) if len(outputs) == 1 else -1
        if self.m > 1 and (owner, output, 1) not in self.add_id:
            raise InvalidPlanError(
                f"node {reader.name!r} runs once per step but reads {a.name!r}, which runs once per micro-batch "
                f"and is not a gradient the plan accumulates; the runtime cannot execute this micro-batched plan"
            )

        def add(k: int, running: fx.Node, first: tuple | None, more: fx.Node, share: tuple) -> fx.Node:
            """Micro-batch ``k``'s accumulation node: ``running`` (scaled by ``first``) + ``more`` * share."""
            node_id = self.add_id[(owner, output, k)]
            made = self.new.call_function(accumulate_gradient, (running, more, first, share))
            made.meta = dict(a.meta)
            self.carrier[made.name] = node_id
            self.node_of.setdefault(node_id, made)
            return made

        # Each run of consecutive micro-batches (one run unless the plan groups them) sums its own gradients;
        # the runs' sums are then added in order. A sum of one micro-batch is not yet scaled by its share.
        per_run = self.m // self.groups
        total: tuple[fx.Node, tuple | None] | None = None  # (node, the share it still needs)
        for g in range(self.groups):
            start = g * per_run
            running, pending = self.env[start][a], (self._rows(start), self.total)
            for k in range(start + 1, start + per_run):
                running, pending = add(k, running, pending, self.env[k][a], (self._rows(k), self.total)), None
            if total is None:
                total = (running, pending)
            else:
                total = (add(start, total[0], total[1], running, pending or (1, 1)), None)
        self.summed[a] = total[0]
        return total[0]

    def _rows(self, k: int) -> int:
        lo, hi = self.rows[k]
        return hi - lo

    def _output(self) -> None:
        """The step's outputs: a 0-d loss weighted over the micro-batches; a per-sample tensor joined; a value
        that stays whole as it is; anything else the last micro-batch's."""
        output = next(v for v in self.nodes if v.op == "output")
        weights = [self._rows(k) / self.total for k in range(self.m)]

        def result(a: fx.Node) -> fx.Node:
            if not self.cut(a):
                return self.whole[a]
            copies = [self.env[k][a] for k in range(self.m)]
            value = a.meta.get("val")
            carried_by = self.carrier[copies[0].name]
            if isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point():
                made = self.new.call_function(weighted_loss, (weights, *copies))
            elif (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and all(
                    isinstance(c.meta.get("val"), torch.Tensor)
                    and c.meta["val"].dim() > 0
                    and int(c.meta["val"].shape[0]) == self._rows(k)
                    for k, c in enumerate(copies)
                )
            ):
                made = self.new.call_function(join_rows, tuple(copies))
            else:
                return copies[-1]
            made.meta = dict(a.meta)
            self.carrier[made.name] = carried_by
            return made

        self.new.output(fx.node.map_arg(output.args[0], result))


def _op_name(v: fx.Node) -> str | None:
    if not isinstance(v.target, torch._ops.OpOverload):
        return None
    return v.target._schema.name.split("::")[-1]
