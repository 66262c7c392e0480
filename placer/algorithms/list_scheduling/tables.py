"""What every list schedule of one graph on one cluster reads and none changes, built once per pair."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from ...cluster import Cluster
from ...graph import OpGraph
from ...paths import top_levels
from ...sim.bounds import fastest_durations
from ..common import placement_units, unit_allowed

__all__ = ["Links", "ScheduleTables", "schedule_tables", "unit_neighbours"]


class ScheduleTables:
    """What every schedule of one graph on one cluster reads and none changes (:func:`schedule_tables`).

    Attributes
    ----------
    dur : list of list of float
        Each node's time on each device.
    unit_of, units : placement units (:func:`~placer.algorithms.common.placement_units`)
    unit_ok : list of list of bool
        Whether each unit may use each device (its nodes' kinds).
    unit_links : list of Links, or None
        On devices not all linked, the units each unit sends to and receives
        from (:meth:`~placer.algorithms.list_scheduling.ScheduleState.narrow_neighbours`); None where every
        device sends to every other.
    device_links : (list of int, list of int), or None
        On devices not all linked, per device the bit mask of the devices it
        sends to and of those that send to it (itself included).
    params, output_bytes, temp_bytes : array of float
        Per node, its parameter, output and workspace bytes.
    unit_params : list of float
        Parameter bytes of each unit.
    grouped : list of bool
        Whether each unit is a colocation group of several nodes.
    group_members : dict
        The nodes of each such group, as a list.
    reserved_at : (list of float, list of float)
        Per node, the earliest it can start and end (its fastest time, no transfers).
    incoming : dict
        Per colocation group, the bytes of each tensor (producer, tensor) it
        reads from outside it.
    inputs : list of list of (int, int, int)
        Each node's inputs as (producer, tensor, bytes): output ``tensor`` of
        node ``producer``; edges carrying the same tensor merge at their max.
        Plain tuples: the schedulers' hottest loops unpack them.
    input_bytes : list of int
        Each node's inputs' bytes together.
    consumers : list of list of int
        Each node's consumers.
    readers : dict
        Per tensor (producer, tensor), the nodes reading it.
    fewest_bytes : dict
        Per tensor, the fewest bytes any reader's copy of it carries.
    channel_of, receivers, ch_lat, ch_inv_bw
        Channel of each device pair, the devices each channel brings data to,
        each channel's latency and inverse bandwidth.
    name_rank : list of int
        :attr:`~placer.cluster.Cluster.name_rank` (the channel queue's tie
        rule: :class:`~placer.algorithms.list_scheduling.QueueOrder`).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0, 0], [1, 1], [4, 6], [0, 0])    # one tensor, two edges
    >>> tables = schedule_tables(g, load_cluster("2xcpu"))
    >>> tables.inputs[1], tables.consumers[0], tables.readers[(0, 0)]
    ([(0, 0, 6)], [1], [1])
    """

    def __init__(self, graph: OpGraph, cluster: Cluster):
        n = graph.num_nodes
        self.dur = graph.durations(cluster).tolist()
        unit_of, self.units = placement_units(graph)
        self.unit_of: list[int] = unit_of.tolist()  # read node by node: a list's items are Python ints
        self.unit_ok: list[list[bool]] = unit_allowed(graph, cluster, self.units).tolist()
        self.params = graph.param_bytes.astype(np.float64)
        self.output_bytes = graph.output_bytes.astype(np.float64)
        self.temp_bytes = graph.temp_bytes.astype(np.float64)
        self.unit_params = np.bincount(unit_of, weights=self.params, minlength=len(self.units)).tolist()
        linked, bits = cluster.linked, 1 << np.arange(cluster.num_devices, dtype=object)
        self.unit_links = None if linked.all() else unit_neighbours(graph, unit_of, len(self.units))
        self.device_links = (
            None if linked.all() else ((linked * bits).sum(axis=1).tolist(), (linked.T * bits).sum(axis=1).tolist())
        )
        self.channel_of = cluster.channel_index.tolist()
        # The devices each channel brings data to: a booking on it changes their estimates.
        self.receivers = [
            sorted({d for row in self.channel_of for d, c in enumerate(row) if c == k})
            for k in range(len(cluster.channels))
        ]
        self.ch_lat = [c.latency_s for c in cluster.channels]
        self.ch_inv_bw = [1.0 / c.bandwidth_bytes_per_s for c in cluster.channels]
        self.name_rank = cluster.name_rank.tolist()
        u_in, t_in, b_in, v_in = _merged_inputs(graph)
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(v_in, minlength=n), out=bounds[1:])
        triples, at = list(zip(u_in.tolist(), t_in.tolist(), b_in.tolist())), bounds.tolist()
        self.inputs: list[list[tuple[int, int, int]]] = [triples[at[v] : at[v + 1]] for v in range(n)]
        summed = np.concatenate([[0], np.cumsum(b_in)])
        self.input_bytes: list[int] = (summed[bounds[1:]] - summed[bounds[:-1]]).tolist()
        # A colocation group reserves room for its members from the earliest each can start, and
        # for each tensor it receives from outside (the gradients an optimizer update bound to its
        # parameters gets may come from anywhere) from the earliest its producer can end.
        self.grouped = [len(members) > 1 for members in self.units]
        self.group_members = {unit: members.tolist() for unit, members in enumerate(self.units) if self.grouped[unit]}
        fastest = fastest_durations(graph, cluster)
        fastest = np.where(np.isfinite(fastest), fastest, 0.0)
        earliest = top_levels(graph, fastest)
        self.reserved_at = (earliest.tolist(), (earliest + fastest).tolist())
        self.incoming: dict[int, dict[tuple[int, int], int]] = {
            unit: {(u, t): b for v in members.tolist() for u, t, b in self.inputs[v] if self.unit_of[u] != unit}
            for unit, members in enumerate(self.units)
            if self.grouped[unit]
        }
        # Each node's consumers, once each, in index order.
        by_pair = np.lexsort((v_in, u_in))
        once = by_pair[_first_of_runs(u_in[by_pair], v_in[by_pair])]
        pair_u, pair_v = u_in[once], v_in[once]
        np.cumsum(np.bincount(pair_u, minlength=n), out=bounds[1:])
        consumers, at = pair_v.tolist(), bounds.tolist()
        self.consumers: list[list[int]] = [consumers[at[u] : at[u + 1]] for u in range(n)]
        # Each tensor's readers in index order, and the fewest bytes among their copies; the tensors in the
        # order of their first reader's inputs.
        by_tensor = np.lexsort((np.arange(u_in.size), t_in, u_in))
        first = _first_of_runs(u_in[by_tensor], t_in[by_tensor])
        fewest = np.minimum.reduceat(b_in[by_tensor], first) if first.size else np.zeros(0, dtype=np.int64)
        tensors = np.argsort(by_tensor[first])
        keys = list(zip(u_in[by_tensor][first][tensors].tolist(), t_in[by_tensor][first][tensors].tolist()))
        readers, at = v_in[by_tensor].tolist(), np.append(first, u_in.size).tolist()
        self.readers: dict[tuple[int, int], list[int]] = {
            key: readers[at[k] : at[k + 1]] for key, k in zip(keys, tensors.tolist())
        }
        self.fewest_bytes: dict[tuple[int, int], int] = dict(zip(keys, fewest[tensors].tolist()))


def _first_of_runs(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal ``keys`` (arrays of one length, sorted together) starts."""
    if not keys[0].size:
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(keys[0].size - 1, dtype=bool)
    for key in keys:
        changed |= key[1:] != key[:-1]
    return np.flatnonzero(np.concatenate([[True], changed]))


def _merged_inputs(graph: OpGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every node's inputs: producer, tensor, bytes and node, one entry per (node, producer, tensor).

    A tensor's edges into one node merge at their most bytes (no fewer than 0). Entries go by node, then
    in the order of each tensor's first edge into it (:attr:`~placer.graph.OpGraph.in_edges`).
    """
    _, eids = graph.in_edges
    src, dst, tensor = graph.src[eids], graph.dst[eids], graph.edge_tensor[eids]
    by_key = np.lexsort((np.arange(eids.size), tensor, src, dst))
    first = _first_of_runs(dst[by_key], src[by_key], tensor[by_key])
    if not first.size:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    most = np.maximum(np.maximum.reduceat(graph.edge_bytes[eids][by_key], first), 0)
    entry = by_key[first]  # each merged input's first edge, in in_edges order
    back = np.argsort(entry)
    return src[entry][back], tensor[entry][back], most[back], dst[entry][back]


class Links(NamedTuple):
    """The other units a unit's nodes send to and those they receive from, each once, in index order."""

    sends_to: list[int]
    receives_from: list[int]


def unit_neighbours(graph: OpGraph, unit_of: np.ndarray, count: int) -> list[Links]:
    """Per unit, the other units its nodes send to and those they receive from (:class:`Links`).

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0] * 3, [0, 1], [1, 2], [0, 0], [0, 0])
    >>> unit_neighbours(g, np.array([0, 0, 1]), 2)
    [Links(sends_to=[1], receives_from=[]), Links(sends_to=[], receives_from=[0])]
    """
    pairs = np.unique(np.stack([unit_of[graph.src], unit_of[graph.dst]], axis=1).reshape(-1, 2), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]].tolist()
    links = [Links([], []) for _ in range(count)]
    for a, b in pairs:
        links[a].sends_to.append(b)
        links[b].receives_from.append(a)
    return links


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def schedule_tables(graph: OpGraph, cluster: Cluster) -> ScheduleTables:
    """The :class:`ScheduleTables` of ``graph`` on ``cluster``, built once while both live.

    The memory retries and the refinement schedule one graph many times
    (:func:`~placer.algorithms.list_scheduling.retries.schedule_with_memory_retries`), and the tables
    cost as much as a good part of a schedule; a schedule only reads them.
    """
    per_cluster = _TABLES.setdefault(graph, weakref.WeakKeyDictionary())
    tables = per_cluster.get(cluster)
    if tables is None:
        tables = per_cluster[cluster] = ScheduleTables(graph, cluster)
    return tables
