"""Measured profiles: time every node of a captured training step on the device at hand.

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
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import FormatError, OptionError, PlacerError
from ..io import Field, check_format, check_number, read_json, write_json_atomic

if TYPE_CHECKING:
    import torch

    from ..cluster import Cluster
    from ..graph import OpGraph

__all__ = ["Profile", "PROFILE_FORMAT", "profile_module", "profile_step", "step_arguments", "load_profile",
           "apply_profile", "apply_placed_times", "device_kind_of"]

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
            raise OptionError(f"{self.source or 'profile'}: a profile of device kind {self.device_kind!r}, which "
                              f"cluster {cluster.name!r} does not have (its kinds: {', '.join(kinds)}): no time "
                              f"of it would be used")

    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, "graph": self.graph_name, "graph_digest": self.graph_digest,
                "device_kind": self.device_kind, **self.meta, "node_seconds": dict(self.node_seconds)}

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
        return cls(graph_name=top.string("graph", default=""),
                   graph_digest=top.string("graph_digest", required=True),
                   device_kind=top.string("device_kind", required=True),
                   node_seconds=seconds,
                   meta=top.extra({"format", "graph", "graph_digest", "device_kind", "node_seconds"}),
                   source=source)

    def check_graph(self, graph: "OpGraph") -> None:
        """Refuse a profile made for another graph, or naming nodes the graph lacks.

        Raises
        ------
        FormatError
        """
        where = f"profile {self.source}" if self.source else "profile"
        if self.graph_digest != graph.digest():
            raise FormatError(f"{where}: made for graph {self.graph_name!r} (digest {self.graph_digest}), "
                              f"not for graph {graph.name!r} (digest {graph.digest()})")
        if self.graph_name and graph.name and self.graph_name != graph.name:
            # The digest covers operations and edges, not sizes: the same model at another batch has it too.
            raise FormatError(f"{where}: made for graph {self.graph_name!r}, not for graph {graph.name!r} (the same "
                              f"operations at another batch or size time otherwise: profile that graph)")
        unknown = [n for n in self.node_seconds if n not in graph.index]
        if unknown:
            raise FormatError(f"{where}: node {unknown[0]!r} is not in graph {graph.name!r}"
                              + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))


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
    import torch

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


def _move(value: Any, device: "torch.device") -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, torch.device):
        return device
    return value


_LABEL = "placer::"


def profile_module(gm: "torch.fx.GraphModule", args: Sequence[Any], *, device: str = "cpu",
                   repeats: int = 5, warmup: int = 1, node_ids: "set[str] | None" = None,
                   gpu_timing: str = "kernel") -> dict[str, float]:
    """Median seconds of every ``call_function`` node of ``gm`` over ``repeats`` runs.

    The module runs node by node (an ``fx.Interpreter``). Factory ops' ``device=``
    arguments are redirected to ``device`` so that a graph traced on the CPU runs on a GPU.

    On the CPU the module runs on one torch thread (the ``cpu`` device kind is one core)
    and each node is timed by the thread's CPU time, not by the wall clock: on a shared
    machine the wall clock also counts the time the process waits to be scheduled, which
    here added 4-16 ms (whole scheduler time slices) to ops that take 10 us.

    On a GPU, ``gpu_timing="kernel"`` (the default) sums the durations of the CUDA
    kernels each node launches, read by ``torch.profiler`` (CUPTI): the time the node
    keeps the GPU busy, which is what a device runs for when its host keeps ahead of it;
    nodes that launch no kernel (views) take 0. ``"wall"`` times each node between two
    ``torch.cuda.synchronize`` calls instead, which adds the host's dispatch time
    (measured on an H100: ~20-30 us per node, several times the kernels of small ops).

    Parameters
    ----------
    gm : torch.fx.GraphModule
    args : sequence
        Positional inputs of ``gm`` (moved to ``device``).
    device : str
        ``"cpu"`` or ``"cuda:N"``.
    repeats, warmup : int
        Timed runs (the median is kept) and untimed runs before them.
    node_ids : set of str, optional
        Only these node names are reported (default: every ``call_function`` node).
    gpu_timing : {"kernel", "wall"}

    Returns
    -------
    dict
        Node name -> seconds.

    Raises
    ------
    OptionError
        Bad ``device``, ``repeats``, ``warmup`` or ``gpu_timing``.
    PlacerError
        With ``gpu_timing="kernel"``, if the profiler attributes no kernel to any node.
    """
    import torch
    import torch.fx

    if repeats < 1:
        raise OptionError(f"option 'repeats' must be >= 1, got {repeats}")
    if warmup < 0:
        raise OptionError(f"option 'warmup' must be >= 0, got {warmup}")
    if gpu_timing not in ("kernel", "wall"):
        raise OptionError(f"option 'gpu_timing' must be 'kernel' or 'wall', got {gpu_timing!r}")
    device_kind_of(device)
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    by_kernels = on_gpu and gpu_timing == "kernel"
    sync = (lambda: torch.cuda.synchronize(dev)) if on_gpu else (lambda: None)
    clock = time.perf_counter if on_gpu else time.thread_time
    samples: dict[str, list[float]] = {}

    def timed(n) -> bool:
        return n.op == "call_function" and (node_ids is None or n.name in node_ids)

    class TimingInterpreter(torch.fx.Interpreter):
        def __init__(self, module, record: bool):
            super().__init__(module)
            self.record = record

        def call_function(self, target, args, kwargs):
            if "device" in kwargs:
                kwargs = {**kwargs, "device": dev}
            return super().call_function(target, args, kwargs)

        def run_node(self, n):
            if not (self.record and timed(n)):
                return super().run_node(n)
            if by_kernels:
                with torch.profiler.record_function(_LABEL + n.name):
                    return super().run_node(n)
            sync()
            start = clock()
            result = super().run_node(n)
            sync()
            samples.setdefault(n.name, []).append(clock() - start)
            return result

    inputs = _move(list(args), dev)
    threads = torch.get_num_threads()
    try:
        if not on_gpu:
            torch.set_num_threads(1)
        with torch.no_grad():
            for _ in range(warmup):
                TimingInterpreter(gm, record=False).run(*inputs)
            sync()
            if by_kernels:
                activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=activities) as prof:
                    for _ in range(repeats):
                        TimingInterpreter(gm, record=True).run(*inputs)
                    sync()
                for event in prof.events():
                    if event.name.startswith(_LABEL):
                        samples.setdefault(event.name[len(_LABEL):], []).append(event.device_time_total / 1e6)
                if not any(t > 0 for ts in samples.values() for t in ts):
                    raise PlacerError("torch.profiler attributed no CUDA kernel to any node; "
                                      "profile with gpu_timing='wall' (--gpu-timing wall)")
            else:
                for _ in range(repeats):
                    TimingInterpreter(gm, record=True).run(*inputs)
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def _synthetic_inputs(gm: "torch.fx.GraphModule") -> list:
    """Inputs shaped like ``gm``'s placeholders: floats uniform in [0, 1) (non-negative, as
    optimizer state must be), integers and booleans zero (valid indices and labels)."""
    import torch

    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise OptionError(f"placeholder {node.name!r} of the step is not a tensor; pass the model and inputs")
        if val.dtype.is_floating_point:
            out.append(torch.rand(tuple(val.shape), dtype=val.dtype))
        else:
            out.append(torch.zeros(tuple(val.shape), dtype=val.dtype))
    return out


def step_arguments(captured: Any, model: Any = None, inputs: Any = None) -> list:
    """Arguments that run the captured step's GraphModule: copies of ``model``'s state and the batch
    ``inputs`` (``captured.step_inputs``), so that running it leaves the model as it was; without a
    model, synthetic ones shaped like its placeholders."""
    import torch

    if model is None:
        return _synthetic_inputs(captured.gm)
    with torch.no_grad():
        return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in captured.step_inputs(model, inputs)]


def profile_step(captured: Any, model: Any = None, inputs: Any = None, *, device: str = "cpu",
                 repeats: int = 5, warmup: int = 1, kind: str | None = None,
                 gpu_timing: str = "kernel") -> Profile:
    """Time every node of a captured training step on ``device``.

    Parameters
    ----------
    captured : placer.capture.CapturedStep
        Its ``.gm`` is run node by node; its ``.graph`` names the nodes (an fx node the
        graph leaves out adds its time to the node its ``carrier`` names; placeholders cost 0).
    model, inputs : optional
        The live model and a batch, fed through ``captured.step_inputs`` on copies (the
        model and its optimizer state are not changed). Without them, random tensors of
        the captured shapes and dtypes are used (the only way for a ``fake`` capture).
    device : str
        ``"cpu"`` or ``"cuda:N"``.
    repeats, warmup, gpu_timing
        See :func:`profile_module`.
    kind : str, optional
        Device kind to record (default: from the device, e.g. ``"cpu"``, ``"A100"``).

    Returns
    -------
    Profile
        Covers every node of ``captured.graph``.

    Raises
    ------
    OptionError
        Bad device or repeat counts, or a model that is not the one captured.
    """
    import torch

    graph = captured.graph
    device_kind, device_name = device_kind_of(device)
    args = step_arguments(captured, model, inputs)
    measured = profile_module(captured.gm, args, device=device, repeats=repeats, warmup=warmup,
                              gpu_timing=gpu_timing)
    seconds = dict.fromkeys(graph.ids, 0.0)
    for fx_name, t in measured.items():
        seconds[captured.carrier.get(fx_name, fx_name)] += t
    meta = {"device_name": device_name, "device": device, "torch": torch.__version__, "repeats": repeats,
            "warmup": warmup, "threads": 1 if device_kind == "cpu" else None,
            "clock": "thread cpu time" if device_kind == "cpu" else
            ("cuda kernel time" if gpu_timing == "kernel" else "wall, synchronised"), "host": platform.node(),
            "inputs": "model" if model is not None else "synthetic",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return Profile(graph.name, graph.digest(), kind or device_kind, seconds, meta)
