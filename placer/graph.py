"""The operation graph of one training step (``placer.graph/1``).

:class:`OpGraph` keeps node and edge attributes as numpy arrays so that
graphs of 100k operations stay cheap to copy, cost and simulate. Node ``i``
is identified by ``graph.ids[i]``; edges are parallel arrays ``src``,
``dst``, ``bytes`` and ``tensor``. An ``OpGraph`` is immutable by convention:
transforms build a new one.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from functools import cached_property
from typing import TYPE_CHECKING, Any, Sequence

import networkx as nx
import numpy as np

from .errors import FormatError, GraphCycleError
from .gcpause import gc_paused
from .io import MAX_INTEGER, Field, check_finite, check_format, check_number, read_json, write_json_atomic

if TYPE_CHECKING:
    import networkx as nx

    from .cluster import Cluster

__all__ = ["OpGraph", "GRAPH_FORMAT", "topological_sort", "joined_groups", "static_footprint"]

GRAPH_FORMAT = "placer.graph/1"

_NODE_FIELDS = {
    "id",
    "op",
    "compute_s",
    "output_bytes",
    "param_bytes",
    "temp_bytes",
    "layer",
    "colocation",
    "device_kinds",
    "compute_s_by_kind",
    "flops",
    "splittable",
}
_EDGE_FIELDS = {"src", "dst", "bytes", "tensor"}
#: The most seconds one node may take: sums over a graph of such nodes stay finite.
MAX_COMPUTE_S = 1e9


def _numbers(values: Any, dtype: type, what: str) -> np.ndarray:
    """``values`` as an array of ``dtype``; FormatError naming ``what`` where they are no numbers, or are
    not whole numbers below 2**62 for an integer ``dtype`` (numpy would cut 1.5 to 1 and fail on NaN)."""
    if isinstance(values, np.ndarray) and values.dtype == dtype:
        return values
    try:
        arr = np.asarray(values)
        if arr.dtype.kind in "USV":  # text ("1.5" would convert) or raw bytes
            raise TypeError
        if arr.dtype.kind not in "biuf":
            arr = arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        raise FormatError(f"{what} must be numbers, got {values!r:.80}") from None
    if np.dtype(dtype).kind == "f":
        return arr.astype(dtype)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr)) | (np.abs(arr) > MAX_INTEGER)
        if bad.any():
            raise FormatError(f"{what} must be whole numbers up to 2**62, got {arr[bad][0].item()!r}")
    elif arr.dtype.kind == "u" and arr.size and arr.max() > MAX_INTEGER:
        raise FormatError(f"{what} must be whole numbers up to 2**62, got {arr.max().item()!r}")
    return arr.astype(dtype)


def _split_entry(entry: Any) -> bool:
    """Whether ``entry`` is a ``splittable`` item: ``{"dim": name, "size": integer >= 1}``."""
    if not isinstance(entry, dict):
        return False
    size = entry.get("size")
    return (
        isinstance(entry.get("dim"), str)
        and isinstance(size, (int, np.integer))
        and not isinstance(size, bool)
        and size >= 1
    )


class OpGraph:
    """A DAG of operations with their costs.

    Parameters
    ----------
    ids : sequence of str
        Unique node ids; node ``i`` is ``ids[i]``. The order is the graph's
        listing order, which breaks ties in the reference model.
    compute_s : array-like of float
        Time of each node on a device of speed 1.0, in seconds.
    src, dst : array-like of int
        Edge endpoints as node indices.
    edge_bytes : array-like of int
        Bytes carried by each edge.
    edge_tensor : array-like of int, optional
        Which output of ``src`` each edge carries (default 0).
    output_bytes, param_bytes, temp_bytes : array-like of int, optional
        Memory per node (FORMATS.md rule 6); zero when omitted.
    flops : array-like of float, optional
        FLOPs per node; NaN where unknown.
    op, layer, colocation : sequence of (str or None), optional
    device_kinds : sequence of (tuple of str or None), optional
    compute_s_by_kind : sequence of (dict or None), optional
    splittable : sequence of (list of dict or None), optional
    node_extra, edge_extra : sequence of dict, optional
        Unknown fields kept for a faithful round trip.
    name : str
    extra : dict, optional
        Unknown top-level fields.

    Raises
    ------
    FormatError
        Duplicate ids, mismatched lengths, negative or non-finite costs,
        edges to unknown nodes.
    GraphCycleError
        If the edges contain a cycle; the message names nodes on it.
    """

    def __init__(
        self,
        ids: Sequence[str],
        compute_s,
        src,
        dst,
        edge_bytes,
        edge_tensor=None,
        *,
        output_bytes=None,
        param_bytes=None,
        temp_bytes=None,
        flops=None,
        op=None,
        layer=None,
        colocation=None,
        device_kinds=None,
        compute_s_by_kind=None,
        splittable=None,
        node_extra=None,
        edge_extra=None,
        name: str = "",
        extra: dict | None = None,
        source: str | None = None,
    ):
        where = f"graph {source}" if source else f"graph '{name}'"
        self.name = name
        self.ids: list[str] = list(ids)
        n = len(self.ids)
        bad_id = next((k for k, x in enumerate(self.ids) if not isinstance(x, str) or not x), None)
        if bad_id is not None:
            raise FormatError(f"{where}: node #{bad_id}: its id must be a non-empty string, got {self.ids[bad_id]!r}")
        self.index: dict[str, int] = {node_id: i for i, node_id in enumerate(self.ids)}
        if len(self.index) != n:
            seen: set[str] = set()
            dup = next(x for x in self.ids if x in seen or seen.add(x))
            raise FormatError(f"{where}: duplicate node id {dup!r}")

        def node_array(values, dtype, label):
            arr = np.zeros(n, dtype=dtype) if values is None else _numbers(values, dtype, f"{where}: {label}")
            if arr.shape != (n,):
                raise FormatError(f"{where}: {label} has {arr.shape} entries for {n} nodes")
            return arr

        self.compute_s = node_array(compute_s, np.float64, "compute_s")
        self.output_bytes = node_array(output_bytes, np.int64, "output_bytes")
        self.param_bytes = node_array(param_bytes, np.int64, "param_bytes")
        self.temp_bytes = node_array(temp_bytes, np.int64, "temp_bytes")
        self.flops = np.full(n, np.nan) if flops is None else node_array(flops, np.float64, "flops")
        for label, arr in (
            ("compute_s", self.compute_s),
            ("output_bytes", self.output_bytes),
            ("param_bytes", self.param_bytes),
            ("temp_bytes", self.temp_bytes),
        ):
            if arr.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0) | (arr > MAX_COMPUTE_S))
            else:
                bad = np.flatnonzero(arr < 0)
            if bad.size:
                most = f" and at most {MAX_COMPUTE_S:g}" if arr.dtype.kind == "f" else ""
                raise FormatError(
                    f"{where}: node {self.ids[bad[0]]!r}: field '{label}' must be a finite number "
                    f">= 0{most}, got {arr[bad[0]].item()!r}"
                )

        def node_list(values, label):
            if values is None:
                return [None] * n
            values = list(values)
            if len(values) != n:
                raise FormatError(f"{where}: {label} has {len(values)} entries for {n} nodes")
            return values

        self.op: list[str | None] = node_list(op, "op")
        self.layer: list[str | None] = node_list(layer, "layer")
        self.colocation: list[str | None] = node_list(colocation, "colocation")
        self.device_kinds: list[tuple[str, ...] | None] = node_list(device_kinds, "device_kinds")
        for i, kinds in enumerate(self.device_kinds):
            if kinds is not None:
                if isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
                    raise FormatError(
                        f"{where}: node {self.ids[i]!r}: field 'device_kinds' must be a list of "
                        f"kind names, got {kinds!r}"
                    )
                self.device_kinds[i] = tuple(kinds)
        self.compute_s_by_kind: list[dict[str, float] | None] = node_list(compute_s_by_kind, "compute_s_by_kind")
        self._check_times_by_kind(where)
        self.splittable: list[list[dict] | None] = node_list(splittable, "splittable")
        for i, entries in enumerate(self.splittable):
            if entries is not None and not (isinstance(entries, list) and all(map(_split_entry, entries))):
                raise FormatError(
                    f"{where}: node {self.ids[i]!r}: field 'splittable' must be a list of "
                    f"{{'dim': name, 'size': integer >= 1}}, got {entries!r}"
                )
        self.node_extra: list[dict] = [e or {} for e in node_list(node_extra, "node_extra")]

        self.src = _numbers(src, np.int64, f"{where}: edge sources").reshape(-1)
        self.dst = _numbers(dst, np.int64, f"{where}: edge destinations").reshape(-1)
        m = self.src.size
        self.edge_bytes = _numbers(edge_bytes, np.int64, f"{where}: edge bytes").reshape(-1)
        self.edge_tensor = (
            np.zeros(m, dtype=np.int64)
            if edge_tensor is None
            else _numbers(edge_tensor, np.int64, f"{where}: edge tensors").reshape(-1)
        )
        if not (self.dst.size == self.edge_bytes.size == self.edge_tensor.size == m):
            raise FormatError(f"{where}: edge arrays have different lengths")
        if m and (self.src.min() < 0 or self.dst.min() < 0 or self.src.max() >= n or self.dst.max() >= n):
            raise FormatError(f"{where}: an edge refers to a node index outside 0..{n - 1}")
        if m and (self.edge_bytes.min() < 0 or self.edge_tensor.min() < 0):
            e = int(np.flatnonzero((self.edge_bytes < 0) | (self.edge_tensor < 0))[0])
            raise FormatError(f"{where}: edge {self._edge_name(e)}: 'bytes' and 'tensor' must be >= 0")
        self.edge_extra: list[dict] = [{}] * m if edge_extra is None else [e or {} for e in edge_extra]
        if len(self.edge_extra) != m:
            raise FormatError(f"{where}: edge_extra has {len(self.edge_extra)} entries for {m} edges")
        self.extra: dict = dict(extra or {})
        self.source = source
        self._check_acyclic(where)

    def _check_times_by_kind(self, where: str) -> None:
        """Every per-kind time a finite number of seconds, 0 to :data:`MAX_COMPUTE_S` (a negative one gave
        a negative step; NaN, a simulation that never ended)."""
        tables = [times for times in self.compute_s_by_kind if times]
        if not set(map(type, tables)) <= {dict}:
            i = next(i for i, times in enumerate(self.compute_s_by_kind) if times and not isinstance(times, dict))
            raise FormatError(
                f"{where}: node {self.ids[i]!r}: field 'compute_s_by_kind' must map kinds to "
                f"seconds, got {self.compute_s_by_kind[i]!r}"
            )
        values = [seconds for times in tables for seconds in times.values()]
        # Types by set (a C loop), not a check per value: graphs of 10^5 nodes are built in hot loops.
        fine = set(map(type, values)) <= {float, int, np.float64}
        if fine:
            seconds = np.asarray(values, dtype=np.float64)
            fine = bool((np.isfinite(seconds) & (seconds >= 0) & (seconds <= MAX_COMPUTE_S)).all())
        if not fine:  # find and name the first bad one
            for i, times in enumerate(self.compute_s_by_kind):
                for kind, seconds in (times or {}).items():
                    check_number(
                        seconds,
                        f"{where}: node {self.ids[i]!r}: field 'compute_s_by_kind.{kind}'",
                        maximum=MAX_COMPUTE_S,
                    )

    # ------------------------------------------------------------------ shape
    @property
    def num_nodes(self) -> int:
        return len(self.ids)

    @property
    def num_edges(self) -> int:
        return int(self.src.size)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges})"

    def _edge_name(self, e: int) -> str:
        return f"{self.ids[self.src[e]]!r} -> {self.ids[self.dst[e]]!r}"

    # ------------------------------------------------------------ adjacency
    @cached_property
    def out_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of outgoing edges: ``(ptr, edge_ids)``; node i's edges are ``edge_ids[ptr[i]:ptr[i+1]]``."""
        return _csr(self.src, self.num_nodes)

    @cached_property
    def in_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of incoming edges, like :attr:`out_edges`."""
        return _csr(self.dst, self.num_nodes)

    def successors(self, i: int) -> np.ndarray:
        ptr, eids = self.out_edges
        return self.dst[eids[ptr[i] : ptr[i + 1]]]

    def predecessors(self, i: int) -> np.ndarray:
        ptr, eids = self.in_edges
        return self.src[eids[ptr[i] : ptr[i + 1]]]

    @cached_property
    def topological_order(self) -> np.ndarray:
        """A topological order of node indices (Kahn's algorithm, lowest index first among the ready)."""
        return self._kahn()

    def _kahn(self) -> np.ndarray:
        return topological_sort(self.num_nodes, self.src, self.dst)

    def _check_acyclic(self, where: str) -> None:
        order = self._kahn()
        if order.size == self.num_nodes:
            self.__dict__["topological_order"] = order
            return

        left = np.ones(self.num_nodes, dtype=bool)
        left[order] = False
        keep = left[self.src] & left[self.dst]
        g = nx.DiGraph()
        g.add_edges_from(zip(self.src[keep].tolist(), self.dst[keep].tolist()))
        cycle = nx.find_cycle(g)
        names = [self.ids[u] for u, _ in cycle]
        shown = " -> ".join(repr(x) for x in names[:8]) + (" -> ..." if len(names) > 8 else f" -> {names[0]!r}")
        raise GraphCycleError(f"{where}: the edges contain a cycle: {shown}")

    # ------------------------------------------------------------- costs
    def durations(self, cluster: "Cluster") -> np.ndarray:
        """Duration of every node on every device, shape ``(nodes, devices)`` (FORMATS.md rule 1)."""
        speeds = np.array([d.speed for d in cluster.devices], dtype=np.float64)
        out = self.compute_s[:, None] / speeds[None, :]
        kinds = [d.kind for d in cluster.devices]
        for i, by_kind in enumerate(self.compute_s_by_kind):
            if by_kind:
                for j, kind in enumerate(kinds):
                    if kind in by_kind:
                        out[i, j] = by_kind[kind]
        return out

    def allowed(self, cluster: "Cluster") -> np.ndarray:
        """Boolean ``(nodes, devices)``: may node i run on device j (its ``device_kinds``)."""
        n, kinds = self.num_nodes, [d.kind for d in cluster.devices]
        out = np.ones((n, len(kinds)), dtype=bool)
        for i, allowed_kinds in enumerate(self.device_kinds):
            if allowed_kinds is not None:
                out[i] = [k in allowed_kinds for k in kinds]
        return out

    @cached_property
    def colocation_groups(self) -> dict[str, np.ndarray]:
        """Colocation value -> indices of the nodes that must share a device."""
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(self.colocation):
            if key is not None:
                groups.setdefault(key, []).append(i)
        return {k: np.asarray(v, dtype=np.int64) for k, v in groups.items()}

    def digest(self) -> str:
        """A short fingerprint of the node ids and edges, to refuse plans made for another graph."""
        h = hashlib.sha256()
        h.update("\0".join(self.ids).encode())
        h.update(self.src.tobytes())
        h.update(self.dst.tobytes())
        return h.hexdigest()[:16]

    # ----------------------------------------------------------- building
    def replace(self, **changes: Any) -> "OpGraph":
        """A copy with some constructor arguments changed (e.g. ``compute_s=...``)."""
        args = dict(
            ids=self.ids,
            compute_s=self.compute_s,
            src=self.src,
            dst=self.dst,
            edge_bytes=self.edge_bytes,
            edge_tensor=self.edge_tensor,
            output_bytes=self.output_bytes,
            param_bytes=self.param_bytes,
            temp_bytes=self.temp_bytes,
            flops=self.flops,
            op=self.op,
            layer=self.layer,
            colocation=self.colocation,
            device_kinds=self.device_kinds,
            compute_s_by_kind=self.compute_s_by_kind,
            splittable=self.splittable,
            node_extra=self.node_extra,
            edge_extra=self.edge_extra,
            name=self.name,
            extra=self.extra,
        )
        args.update(changes)
        return OpGraph(**args)

    def to_networkx(self) -> "nx.MultiDiGraph":
        """The graph as a networkx MultiDiGraph over node ids (edge data: bytes, tensor)."""

        g = nx.MultiDiGraph(name=self.name)
        for i, node_id in enumerate(self.ids):
            g.add_node(node_id, compute_s=float(self.compute_s[i]))
        for s, d, b, t in zip(
            self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(), self.edge_tensor.tolist()
        ):
            g.add_edge(self.ids[s], self.ids[d], bytes=b, tensor=t)
        return g

    # ---------------------------------------------------------------- io
    @gc_paused()  # a dict per node: placer.gcpause
    def to_dict(self) -> dict:
        """The ``placer.graph/1`` document."""
        nodes = []
        for i, node_id in enumerate(self.ids):
            node: dict[str, Any] = {"id": node_id}
            if self.op[i] is not None:
                node["op"] = self.op[i]
            node["compute_s"] = float(self.compute_s[i])
            node["output_bytes"] = int(self.output_bytes[i])
            node["param_bytes"] = int(self.param_bytes[i])
            node["temp_bytes"] = int(self.temp_bytes[i])
            for key, value in (("layer", self.layer[i]), ("colocation", self.colocation[i])):
                if value is not None:
                    node[key] = value
            if self.device_kinds[i] is not None:
                node["device_kinds"] = list(self.device_kinds[i])
            if self.compute_s_by_kind[i]:
                node["compute_s_by_kind"] = dict(self.compute_s_by_kind[i])
            if not np.isnan(self.flops[i]):
                node["flops"] = float(self.flops[i])
            if self.splittable[i] is not None:
                node["splittable"] = self.splittable[i]
            node.update(self.node_extra[i])
            nodes.append(node)
        edges = []
        for e, (s, d, b, t) in enumerate(
            zip(self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(), self.edge_tensor.tolist())
        ):
            edge = {"src": self.ids[s], "dst": self.ids[d], "bytes": b, "tensor": t}
            edge.update(self.edge_extra[e])
            edges.append(edge)
        doc = {"format": GRAPH_FORMAT, "name": self.name}
        doc.update(self.extra)
        doc["nodes"] = nodes
        doc["edges"] = edges
        return doc

    @classmethod
    @gc_paused()
    def from_dict(cls, doc: Any, source: str | None = None) -> "OpGraph":
        """Build a graph from a ``placer.graph/1`` document, validating every field.

        Raises
        ------
        FormatError
            Naming the file, node or edge and the field at fault.
        GraphCycleError
            If the edges are not a DAG.
        """
        where = f"graph {source}" if source else "graph"
        check_format(doc, GRAPH_FORMAT, where)
        top = Field(doc, where)
        name = top.string("name", default="")
        nodes = top.array("nodes", required=True)
        edges = top.array("edges")
        edges = [] if edges is None else edges
        n = len(nodes)
        ids: list[str] = []
        compute = np.empty(n)
        out_b = np.empty(n, dtype=np.int64)
        par_b = np.empty(n, dtype=np.int64)
        tmp_b = np.empty(n, dtype=np.int64)
        flops = np.full(n, np.nan)
        op, layer, coloc, kinds, by_kind, split, extra = ([None] * n for _ in range(7))
        seen: set[str] = set()
        for i, raw in enumerate(nodes):
            f = Field(raw, f"{where}: node #{i}")
            node_id = f.string("id", required=True)
            if not node_id:
                raise FormatError(f"{where}: node #{i}: field 'id' must be a non-empty string")
            if node_id in seen:
                raise FormatError(f"{where}: duplicate node id {node_id!r} (node #{i})")
            seen.add(node_id)
            ids.append(node_id)
            f.where = f"{where}: node {node_id!r}"
            compute[i] = f.number("compute_s", required=True, maximum=MAX_COMPUTE_S)
            out_b[i] = f.integer("output_bytes", default=0)
            par_b[i] = f.integer("param_bytes", default=0)
            tmp_b[i] = f.integer("temp_bytes", default=0)
            fl = f.number("flops")
            if fl is not None:
                flops[i] = fl
            op[i] = f.string("op")
            layer[i] = f.string("layer")
            coloc[i] = f.string("colocation")
            dk = f.array("device_kinds")
            if dk is not None:
                if not all(isinstance(k, str) for k in dk):
                    raise FormatError(f"{f.where}: field 'device_kinds' must be a list of strings")
                kinds[i] = tuple(dk)
            bk = f.mapping("compute_s_by_kind")
            if bk is not None:
                by_kind[i] = {
                    str(k): check_number(v, f"{f.where}: field 'compute_s_by_kind.{k}'", maximum=MAX_COMPUTE_S)
                    for k, v in bk.items()
                }
            sp = f.array("splittable")
            if sp is not None:
                for k, item in enumerate(sp):
                    sf = Field(item, f"{f.where}: splittable[{k}]")
                    sf.string("dim", required=True)
                    sf.integer("size", required=True, minimum=1)
                    check_finite(item, sf.where)
                split[i] = sp
            extra[i] = f.extra(_NODE_FIELDS)
        m = len(edges)
        src = np.empty(m, dtype=np.int64)
        dst = np.empty(m, dtype=np.int64)
        eb = np.empty(m, dtype=np.int64)
        et = np.empty(m, dtype=np.int64)
        e_extra: list[dict] = []
        index = {node_id: i for i, node_id in enumerate(ids)}
        for e, raw in enumerate(edges):
            f = Field(raw, f"{where}: edge #{e}")
            s = f.string("src", required=True)
            d = f.string("dst", required=True)
            f.where = f"{where}: edge #{e} ({s!r} -> {d!r})"
            for end, label in ((s, "src"), (d, "dst")):
                if end not in index:
                    raise FormatError(f"{f.where}: field '{label}' names unknown node {end!r}")
            src[e], dst[e] = index[s], index[d]
            eb[e] = f.integer("bytes", required=True)
            et[e] = f.integer("tensor", default=0)
            e_extra.append(f.extra(_EDGE_FIELDS))
        # Each size is at most 2**62; their sums (memory, traffic) must fit int64 too.
        total = sum(float(a.sum(dtype=np.float64)) for a in (out_b, par_b, tmp_b, eb))
        if total > MAX_INTEGER:
            raise FormatError(
                f"{where}: the nodes' output_bytes, param_bytes and temp_bytes and the edges' bytes "
                f"add up to {total:.4g}, more than 2**62"
            )
        return cls(
            ids,
            compute,
            src,
            dst,
            eb,
            et,
            output_bytes=out_b,
            param_bytes=par_b,
            temp_bytes=tmp_b,
            flops=flops,
            op=op,
            layer=layer,
            colocation=coloc,
            device_kinds=kinds,
            compute_s_by_kind=by_kind,
            splittable=split,
            node_extra=extra,
            edge_extra=e_extra,
            name=name,
            extra=top.extra({"format", "name", "nodes", "edges"}),
            source=source,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "OpGraph":
        """Read a ``placer.graph/1`` file."""
        return cls.from_dict(read_json(path, "graph file"), source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write the ``placer.graph/1`` file atomically."""
        write_json_atomic(path, self.to_dict(), "graph file")


def joined_groups(n: int, *labellings: Sequence[Any], pairs: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """A group number per node: nodes that share a label in any labelling are in one group.

    Each labelling gives every node a hashable label or None (no label);
    labels of different labellings never match. ``pairs`` (two index arrays)
    joins each ``pairs[0][k]`` with ``pairs[1][k]`` too. Groups are numbered
    from 0 in the order of their lowest node.

    Examples
    --------
    >>> joined_groups(4, ["a", None, "a", None], [None, "p", "p", None]).tolist()
    [0, 0, 0, 1]
    >>> joined_groups(4, ["a", None, "a", None], pairs=(np.array([3]), np.array([1]))).tolist()
    [0, 1, 0, 1]
    """
    from scipy.sparse import coo_matrix  # deferred: imports scipy
    from scipy.sparse.csgraph import connected_components  # deferred: imports scipy

    first: dict[tuple[int, Any], int] = {}
    labelled = [
        (first.setdefault((k, label), i), i)
        for k, labels in enumerate(labellings)
        for i, label in enumerate(labels)
        if label is not None
    ]
    a, b = np.array(labelled, dtype=np.int64).reshape(-1, 2).T
    if pairs is not None:
        a = np.concatenate([a, np.asarray(pairs[0], dtype=np.int64)])
        b = np.concatenate([b, np.asarray(pairs[1], dtype=np.int64)])
    _, group = connected_components(coo_matrix((np.ones(a.size), (a, b)), shape=(n, n)), directed=False)
    return group.astype(np.int64)


def topological_sort(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Kahn's algorithm over edge arrays; shorter than ``n`` when the edges contain a cycle.

    Ready nodes are taken first-in first-out, starting from the sources in index
    order, so the result is deterministic.
    """
    indeg = np.bincount(dst, minlength=n).tolist()
    ptr, eids = _csr(src, n)
    succ = dst[eids].tolist()
    ptr = ptr.tolist()
    queue = deque(i for i in range(n) if indeg[i] == 0)
    order: list[int] = []
    append = order.append
    while queue:
        u = queue.popleft()
        append(u)
        for k in range(ptr[u], ptr[u + 1]):
            v = succ[k]
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    return np.asarray(order, dtype=np.int64)


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, order


def static_footprint(graph: OpGraph) -> np.ndarray:
    """Bytes a node holds while it runs: parameters, its output and its workspace.

    Memory-aware heuristics budget devices with this; the reference model's
    peak (which also counts live outputs of other nodes and received copies)
    is checked afterwards by simulation.
    """
    return graph.param_bytes + graph.output_bytes + graph.temp_bytes
