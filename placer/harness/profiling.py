"""Profiling runs: time every node of a captured training step on the device at hand.

:func:`profile_step` runs a captured step node by node and returns a
:class:`~placer.cost.profile.Profile` (``placer.profile/1``), the measured
costs that :func:`~placer.cost.profile.apply_profile` puts into a graph.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import TYPE_CHECKING, Any, Sequence

from ..cost.profile import Profile, device_kind_of
from ..errors import OptionError, PlacerError

if TYPE_CHECKING:
    import torch

__all__ = ["profile_module", "profile_step", "profile_spec", "step_arguments"]


def _move(value: Any, device: "torch.device") -> Any:
    import torch  # deferred: imports torch

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


def profile_module(
    gm: "torch.fx.GraphModule",
    args: Sequence[Any],
    *,
    device: str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    node_ids: "set[str] | None" = None,
    gpu_timing: str = "kernel",
) -> dict[str, float]:
    """Median seconds of every ``call_function`` node of ``gm`` over ``repeats`` runs.

    The module runs node by node (an ``fx.Interpreter``). Factory ops' ``device=``
    arguments are redirected to ``device`` so that a graph traced on the CPU runs on a GPU.

    On the CPU the module runs on one torch thread (the ``cpu`` device kind is
    one core) and each node is timed by the thread's CPU time: on a shared
    machine the wall clock also counts whole scheduler time slices spent
    waiting, far longer than a small op.

    On a GPU, ``gpu_timing="kernel"`` (the default) sums the durations of the
    CUDA kernels each node launches, read by ``torch.profiler`` (CUPTI): the
    time the node keeps the GPU busy, which is what a device runs for when its
    host keeps ahead of it; nodes that launch no kernel (views) take 0.
    ``"wall"`` times each node between two ``torch.cuda.synchronize`` calls
    instead, which adds the host's dispatch time (often more than a small op's
    kernels).

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
    import torch  # deferred: imports torch
    import torch.fx  # deferred: imports torch

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
                        samples.setdefault(event.name[len(_LABEL) :], []).append(event.device_time_total / 1e6)
                if not any(t > 0 for ts in samples.values() for t in ts):
                    raise PlacerError(
                        "torch.profiler attributed no CUDA kernel to any node; "
                        "profile with gpu_timing='wall' (--gpu-timing wall)"
                    )
            else:
                for _ in range(repeats):
                    TimingInterpreter(gm, record=True).run(*inputs)
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def _synthetic_inputs(gm: "torch.fx.GraphModule") -> list:
    """Inputs shaped like ``gm``'s placeholders: floats uniform in [0, 1) (non-negative, as
    optimizer state must be), integers and booleans zero (valid indices and labels)."""
    import torch  # deferred: imports torch

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
    import torch  # deferred: imports torch

    if model is None:
        return _synthetic_inputs(captured.gm)
    with torch.no_grad():
        return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in captured.step_inputs(model, inputs)]


def profile_step(
    captured: Any,
    model: Any = None,
    inputs: Any = None,
    *,
    device: str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    kind: str | None = None,
    gpu_timing: str = "kernel",
) -> Profile:
    """Time every node of a captured training step on ``device``.

    Parameters
    ----------
    captured : placer.capture.CapturedStep
        Its ``.gm`` is run node by node; its ``.graph`` names the nodes (an fx node the
        graph leaves out adds its time to its ``carrier``; placeholders cost 0).
    model, inputs : optional
        The live model and a batch, fed through ``captured.step_inputs`` on copies
        (neither the model nor its optimizer state changes). Without them, random
        tensors of the captured shapes and dtypes (the only way for a ``fake`` capture).
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
    import torch  # deferred: imports torch

    graph = captured.graph
    device_kind, device_name = device_kind_of(device)
    args = step_arguments(captured, model, inputs)
    measured = profile_module(captured.gm, args, device=device, repeats=repeats, warmup=warmup, gpu_timing=gpu_timing)
    seconds = dict.fromkeys(graph.ids, 0.0)
    for fx_name, t in measured.items():
        seconds[captured.carrier.get(fx_name, fx_name)] += t
    meta = {
        "device_name": device_name,
        "device": device,
        "torch": torch.__version__,
        "repeats": repeats,
        "warmup": warmup,
        "threads": 1 if device_kind == "cpu" else None,
        "clock": "thread cpu time"
        if device_kind == "cpu"
        else ("cuda kernel time" if gpu_timing == "kernel" else "wall, synchronised"),
        "host": platform.node(),
        "inputs": "model" if model is not None else "synthetic",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return Profile(graph.name, graph.digest(), kind or device_kind, seconds, meta)


def profile_spec(
    spec: str,
    batch: int,
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    settings: dict | None = None,
    device: str = "cpu",
    repeats: int = 5,
    gpu_timing: str = "kernel",
) -> tuple[Any, Profile]:
    """The training step of model ``spec`` at ``batch`` samples, captured for real, and its profile.

    What ``placer profile`` and the demo time: :func:`~placer.capture.capture_spec`
    (``fake=False``, so that the step runs), then :func:`profile_step` on the
    model's own weights and a batch of its inputs.

    Returns
    -------
    (CapturedStep, Profile)
    """
    from ..capture.spec import capture_spec, load_model  # deferred: imports torch

    captured = capture_spec(spec, batch, optimizer=optimizer, lr=lr, settings=settings, fake=False)
    model, inputs = load_model(spec, batch)
    return captured, profile_step(captured, model, inputs, device=device, repeats=repeats, gpu_timing=gpu_timing)
