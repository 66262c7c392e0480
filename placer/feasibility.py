"""Diagnose problems that no plan can solve, before any algorithm tries.

Each check is cheap and conservative: it raises only when no placement at
all can be valid, and its message says which node, group or device is at fault.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from .cluster import Cluster
from .errors import InfeasibleError
from .graph import OpGraph

__all__ = ["diagnose", "static_footprint"]


def static_footprint(graph: OpGraph) -> np.ndarray:
    """Bytes a node holds while it runs: parameters, its output and its workspace.

    Memory-aware heuristics budget devices with this; the reference model's
    peak (which also counts live outputs of other nodes and received copies)
    is checked afterwards by simulation.
    """
    return graph.param_bytes + graph.output_bytes + graph.temp_bytes


def diagnose(graph: OpGraph, cluster: Cluster) -> None:
    """Raise InfeasibleError if no valid plan can exist.

    Checks: a node allowed on no device of the cluster; a node, or a
    colocation group, that cannot fit any device it may use; parameters that
    exceed the cluster's total memory; a connected part of the graph whose
    parameters exceed every set of devices that can all reach each other.
    """
    allowed = graph.allowed(cluster)
    memory = cluster.memory
    nowhere = np.flatnonzero(~allowed.any(axis=1))
    if nowhere.size:
        i = nowhere[0]
        kinds = sorted({d.kind for d in cluster.devices})
        raise InfeasibleError(f"node {graph.ids[i]!r} may run only on kinds {list(graph.device_kinds[i])}, "
                              f"and cluster {cluster.name!r} has only {kinds}")
    need = static_footprint(graph)
    room = np.where(allowed, memory[None, :], 0).max(axis=1) if graph.num_nodes else np.zeros(0)
    over = np.flatnonzero(need > room)
    if over.size:
        i = over[np.argmax(need[over] - room[over])]
        raise InfeasibleError(f"node {graph.ids[i]!r} needs {need[i] / 2**30:.3f} GiB, more than any device "
                              f"it may use ({room[i] / 2**30:.3f} GiB)")
    for key, members in graph.colocation_groups.items():
        group_allowed = allowed[members].all(axis=0)
        if not group_allowed.any():
            raise InfeasibleError(f"colocation group {key!r} has no device kind allowed for all its nodes")
        group_need = graph.param_bytes[members].sum() + (graph.output_bytes[members] + graph.temp_bytes[members]).max()
        group_room = memory[group_allowed].max()
        if group_need > group_room:
            raise InfeasibleError(f"colocation group {key!r} needs at least {group_need / 2**30:.3f} GiB, more than "
                                  f"any device it may use ({group_room / 2**30:.3f} GiB)")
    total_params = int(graph.param_bytes.sum())
    if total_params > int(memory.sum()):
        raise InfeasibleError(f"the parameters alone need {total_params / 2**30:.3f} GiB, more than the cluster's "
                              f"{memory.sum() / 2**30:.3f} GiB in total")
    _check_reachability(graph, cluster)


def _check_reachability(graph: OpGraph, cluster: Cluster) -> None:
    """Refuse a graph whose connected parts cannot fit any set of mutually reachable devices.

    Transfers go over one channel, never through a third device, so the
    nodes of one weakly connected part of the graph must sit on devices that
    all have channels between each other (a clique of the reachability graph).
    """
    unreachable = cluster.unreachable_pairs()
    if not unreachable or graph.num_nodes == 0:
        return
    reach = nx.Graph()
    reach.add_nodes_from(range(cluster.num_devices))
    connected = (cluster.channel_index >= 0) & (cluster.channel_index.T >= 0)
    reach.add_edges_from(zip(*np.nonzero(np.triu(connected, 1))))
    room = max(int(cluster.memory[sorted(c)].sum()) for c in nx.find_cliques(reach))
    parts = nx.connected_components(nx.Graph(zip(graph.src.tolist(), graph.dst.tolist())))
    for part in parts:
        need = int(graph.param_bytes[sorted(part)].sum())
        if need > room:
            a, b = unreachable[0]
            raise InfeasibleError(
                f"devices {a!r} and {b!r} (and maybe others) have no channel between them; the connected part "
                f"of the graph around node {graph.ids[min(part)]!r} needs {need / 2**30:.3f} GiB of parameters, "
                f"more than any set of devices that can all reach each other ({room / 2**30:.3f} GiB)")
