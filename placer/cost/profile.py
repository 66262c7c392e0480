"""Measured profiles: the seconds every node of a captured training step took on one device kind.

A profile (``placer.profile/1``) records, for one graph and one device kind, the measured
seconds of every node keyed by node id, with the graph's digest so that it is never
applied to another graph::

    {"format": "placer.profile/1", "graph": "mlp-bs8", "graph_digest": "3f2a...",
     "device_kind": "cpu", "device_name": "AMD EPYC", "torch": "2.13.0+cpu",
     "repeats": 5, "node_seconds": {"addmm": 1.2e-05, ...}}

:func:`apply_profile` writes the times into ``compute_s_by_kind[device_kind]``, which the
reference model prefers over ``compute_s / speed`` (FORMATS.md rule 1).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import FormatError, OptionError
from ..io import Field, check_format, check_number, read_json, write_json_atomic

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..graph import OpGraph

__all__ = ["Profile", "PROFILE_FORMAT", "load_profile", "apply_profile", "apply_placed_times", "device_kind_of"]

PROFILE_FORMAT = "placer.profile/1"

_KNOWN_GPUS = ("H100", "H200", "A100", "V100", "A10", "L4", "T4")


@dataclass
class Profile:
    """Measured seconds per node of one graph on one device kind."""

    graph_name: str
    graph_digest: str
    device_kind: str
    node_seconds: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None

    @property
    def total_s(self) -> float:
        return float(sum(self.node_seconds.values()))

    def check_cluster(self, cluster: "Cluster") -> None:
        """Raise :class:`OptionError` where ``cluster`` has no device of this profile's kind: no time of
        it would be used, and a plan would silently keep the analytic costs."""
        kinds = sorted({d.kind for d in cluster.devices})
        if self.device_kind not in kinds:
            raise OptionError(
                f"{self.source or 'profile'}: a profile of device kind {self.device_kind!r}, which "
                f"cluster {cluster.name!r} does not have (its kinds: {', '.join(kinds)}): no time "
                f"of it would be used"
            )

    def to_dict(self) -> dict:
        return {
            "format": PROFILE_FORMAT,
            "graph": self.graph_name,
            "graph_digest": self.graph_digest,
            "device_kind": self.device_kind,
            **self.meta,
            "node_seconds": dict(self.node_seconds),
        }

    def save(self, path: str | os.PathLike) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(cls, doc: Any, source: str | None = None) -> "Profile":
        """Read a ``placer.profile/1`` document.

        Raises
        ------
        FormatError
            Naming the file and the field or node at fault (wrong format tag, missing
            fields, times that are not finite numbers >= 0).
        """
        where = f"profile {source}" if source else "profile"
        check_format(doc, PROFILE_FORMAT, where)
        top = Field(doc, where)
        seconds = {}
        for node_id, value in top.mapping("node_seconds", required=True).items():
            seconds[node_id] = check_number(value, f"{where}: node {node_id!r}: time")
        return cls(
            graph_name=top.string("graph", default=""),
            graph_digest=top.string("graph_digest", required=True),
            device_kind=top.string("device_kind", required=True),
            node_seconds=seconds,
            meta=top.extra({"format", "graph", "graph_digest", "device_kind", "node_seconds"}),
            source=source,
        )

    def check_graph(self, graph: "OpGraph") -> None:
        """Refuse a profile made for another graph, or naming nodes the graph lacks.

        Raises
        ------
        FormatError
        """
        where = f"profile {self.source}" if self.source else "profile"
        if self.graph_digest != graph.digest():
            raise FormatError(
                f"{where}: made for graph {self.graph_name!r} (digest {self.graph_digest}), "
                f"not for graph {graph.name!r} (digest {graph.digest()})"
            )
        if self.graph_name and graph.name and self.graph_name != graph.name:
            # The digest covers operations and edges, not sizes: the same model at another batch has it too.
            raise FormatError(
                f"{where}: made for graph {self.graph_name!r}, not for graph {graph.name!r} (the same "
                f"operations at another batch or size time otherwise: profile that graph)"
            )
        unknown = [n for n in self.node_seconds if n not in graph.index]
        if unknown:
            raise FormatError(
                f"{where}: node {unknown[0]!r} is not in graph {graph.name!r}"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            )


def load_profile(path: str | os.PathLike, graph: "OpGraph | None" = None) -> Profile:
    """Read and validate a profile file; with ``graph``, also check it belongs to that graph.

    Raises
    ------
    FormatError
        Invalid JSON, an empty file, a wrong format tag, a missing field, a negative,
        infinite or NaN time, a node the graph lacks, or a profile of another graph;
        the message names the file and the node or field.
    """
    profile = Profile.from_dict(read_json(path, "profile file"), source=str(path))
    if graph is not None:
        profile.check_graph(graph)
    return profile


def apply_profile(graph: "OpGraph", profile: Profile, kind: str | None = None) -> "OpGraph":
    """A copy of ``graph`` with the measured times in ``compute_s_by_kind[kind]``.

    Parameters
    ----------
    graph : OpGraph
    profile : Profile
        Must have been made for ``graph`` (same digest).
    kind : str, optional
        Device kind to fill (default: the profile's ``device_kind``). Nodes the profile
        does not time keep their other costs.

    Returns
    -------
    OpGraph

    Raises
    ------
    FormatError
        If the profile belongs to another graph or names unknown nodes.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=1)
    >>> p = Profile(g.name, g.digest(), "cpu", {g.ids[0]: 0.25})
    >>> apply_profile(g, p).compute_s_by_kind[0]
    {'cpu': 0.25}
    """
    profile.check_graph(graph)
    kind = kind or profile.device_kind
    by_kind = [dict(d) if d else None for d in graph.compute_s_by_kind]
    for node_id, seconds in profile.node_seconds.items():
        i = graph.index[node_id]
        by_kind[i] = {**(by_kind[i] or {}), kind: float(seconds)}
    return graph.replace(compute_s_by_kind=by_kind)


def apply_placed_times(graph: "OpGraph", device_of, cluster: "Cluster", seconds: dict[str, float]) -> "OpGraph":
    """A copy of ``graph`` with each listed node's seconds as its time on the kind of device it is placed on.

    Parameters
    ----------
    graph : OpGraph
    device_of : array of int
        Device index of every node (a bound plan's ``device_of``).
    cluster : Cluster
    seconds : dict of str to float
        Node id -> seconds; ids the graph lacks are ignored, nodes not listed keep their costs.

    Returns
    -------
    OpGraph
        Same ids and edges (plans for ``graph`` stay valid for it).
    """
    by_kind: dict[str, dict[str, float]] = {}
    for node_id, s in seconds.items():
        i = graph.index.get(node_id)
        if i is not None:
            by_kind.setdefault(cluster.devices[device_of[i]].kind, {})[node_id] = float(s)
    for kind, times in by_kind.items():
        graph = apply_profile(graph, Profile(graph.name, graph.digest(), kind, times))
    return graph


def device_kind_of(device: str) -> tuple[str, str]:
    """``(kind, name)`` of a torch device string: ``"cpu"`` or a GPU kind such as ``"A100"``."""
    import torch  # deferred: imports torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionError(f"option 'device' must be 'cpu' or 'cuda:N', got {device!r}") from None
    if dev.type == "cpu":
        return "cpu", _cpu_name()
    if dev.type != "cuda":
        raise OptionError(f"option 'device' must be 'cpu' or 'cuda:N', got {device!r}")
    if not torch.cuda.is_available():
        raise OptionError(f"option 'device' is {device!r} but CUDA is not available here")
    if (dev.index or 0) >= torch.cuda.device_count():
        raise OptionError(f"option 'device' is {device!r} but this machine has {torch.cuda.device_count()} GPU(s)")
    name = torch.cuda.get_device_name(dev)
    kind = next((k for k in _KNOWN_GPUS if k in name.upper()), name)
    return kind, name


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
