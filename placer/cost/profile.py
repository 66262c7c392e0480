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

__all__ = [
    "Profile",
    "PROFILE_FORMAT",
    "load_profile",
    "apply_profile",
    "apply_placed_times",
    "device_kind_of",
    "fixed_part",
]

PROFILE_FORMAT = "placer.profile/1"

_KNOWN_GPUS = ("H100", "H200", "A100", "V100", "A10", "L4", "T4")


@dataclass
class Profile:
    """Measured seconds per node of one graph on one device kind.

    ``fixed_seconds`` (file field ``node_fixed_seconds``, optional): of a
    node's seconds, the part that does not shrink with the rows of the batch
    it works on (:func:`fixed_part`), which a micro-batch, a replica or a
    split part of the node pays whole (:func:`~placer.transform.base.part_times`).
    """

    graph_name: str
    graph_digest: str
    device_kind: str
    node_seconds: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    fixed_seconds: dict[str, float] = field(default_factory=dict)

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
            **({"node_fixed_seconds": dict(self.fixed_seconds)} if self.fixed_seconds else {}),
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
        fixed = {}
        for node_id, value in (top.mapping("node_fixed_seconds") or {}).items():
            fixed[node_id] = check_number(value, f"{where}: node {node_id!r}: fixed time")
            if node_id not in seconds:
                raise FormatError(f"{where}: field 'node_fixed_seconds': node {node_id!r} has no time in node_seconds")
            if fixed[node_id] > seconds[node_id]:
                raise FormatError(
                    f"{where}: node {node_id!r}: fixed time {fixed[node_id]!r} is more than its time {seconds[node_id]!r}"
                )
        return cls(
            graph_name=top.string("graph", default=""),
            graph_digest=top.string("graph_digest", required=True),
            device_kind=top.string("device_kind", required=True),
            node_seconds=seconds,
            meta=top.extra({"format", "graph", "graph_digest", "device_kind", "node_seconds", "node_fixed_seconds"}),
            source=source,
            fixed_seconds=fixed,
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
        Where the profile has fixed parts, each timed node's
        ``node_extra["fixed_s"][kind]`` is its fixed part (0 where it has none);
        a node it times loses any fixed part of ``kind`` it had.

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
    >>> p.fixed_seconds = {g.ids[0]: 0.05}
    >>> apply_profile(g, p).node_extra[0]["fixed_s"]
    {'cpu': 0.05}
    """
    profile.check_graph(graph)
    kind = kind or profile.device_kind
    by_kind = [dict(d) if d else None for d in graph.compute_s_by_kind]
    extras = list(graph.node_extra)
    for node_id, seconds in profile.node_seconds.items():
        i = graph.index[node_id]
        by_kind[i] = {**(by_kind[i] or {}), kind: float(seconds)}
        fixed = {k: v for k, v in ((extras[i] or {}).get("fixed_s") or {}).items() if k != kind}
        if profile.fixed_seconds:
            fixed[kind] = float(profile.fixed_seconds.get(node_id, 0.0))
        if fixed or "fixed_s" in (extras[i] or {}):
            extras[i] = {key: v for key, v in (extras[i] or {}).items() if key != "fixed_s"}
            if fixed:
                extras[i]["fixed_s"] = fixed
    return graph.replace(compute_s_by_kind=by_kind, node_extra=extras)


def fixed_part(profile: Profile, small: Profile, batch: int, small_batch: int) -> Profile:
    """``profile`` (at ``batch`` samples) with each node's fixed part, fitted against ``small`` (at ``small_batch``).

    A node's time is taken as a fixed part plus a part proportional to the
    rows it works on: through its times at the two batches,
    ``per_sample = (t_B - t_b) / (B - b)`` and ``fixed = t_B - B * per_sample``,
    held within ``[0, t_B]`` (measurement noise can put either point off the
    line). On a CPU a small model's operations spend much of their time on
    what the batch does not scale (the call, the kernel's set-up), so a
    micro-batch of a quarter of the rows takes far more than a quarter of the
    time; a profile scaled by rows alone predicts pipelines and replicas too
    fast.

    Parameters
    ----------
    profile, small : Profile
        The same step at ``batch`` and ``small_batch`` samples, timed on one
        device kind; matched by node id (a capture names a step's nodes alike
        at every batch).
    batch, small_batch : int
        ``batch > small_batch >= 1``.

    Returns
    -------
    Profile
        ``profile`` with ``fixed_seconds`` for every node ``small`` times too.

    Raises
    ------
    OptionError
        Batches out of order, or profiles of two device kinds.
    FormatError
        ``small`` does not time the same nodes.

    Examples
    --------
    >>> big = Profile("g-bs32", "d", "cpu", {"conv": 10e-3, "add": 1e-3})
    >>> small = Profile("g-bs8", "d", "cpu", {"conv": 4e-3, "add": 1.2e-3})
    >>> {n: round(s * 1e3, 6) for n, s in fixed_part(big, small, 32, 8).fixed_seconds.items()}
    {'conv': 2.0, 'add': 1.0}
    """
    if not (isinstance(batch, int) and isinstance(small_batch, int) and batch > small_batch >= 1):
        raise OptionError(f"fixed_part: needs batch > small batch >= 1, got {batch} and {small_batch}")
    if small.device_kind != profile.device_kind:
        raise OptionError(f"fixed_part: profiles of {profile.device_kind!r} and {small.device_kind!r}, not one kind")
    missing = [n for n in profile.node_seconds if n not in small.node_seconds]
    if missing:
        raise FormatError(
            f"fixed_part: the profile at batch {small_batch} does not time node {missing[0]!r} of the one at {batch}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    fixed = {}
    for node, t_big in profile.node_seconds.items():
        per_sample = (t_big - small.node_seconds[node]) / (batch - small_batch)
        fixed[node] = min(t_big, max(0.0, t_big - batch * per_sample))
    meta = {**profile.meta, "fixed_part": {"small_batch": small_batch, "batch": batch}}
    return Profile(
        profile.graph_name,
        profile.graph_digest,
        profile.device_kind,
        dict(profile.node_seconds),
        meta,
        profile.source,
        fixed,
    )


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
