"""Run a placed training step in one process, over several devices.

Nodes are issued in the plan's per-device order, interleaved by the reference
simulator's start order; every tensor a device consumes from another arrives
by one copy per (tensor, destination device), made as soon as the tensor
exists. With CUDA, every plan device gets its own compute stream (two plan
devices may share a GPU) and every (source, destination) pair its own copy
stream; events order a copy after its producer and a consumer after its
copy, so computation and transfers overlap as in the simulator. Without
CUDA every device is the CPU and the step runs sequentially in the same
order, with the same copies.

By default the new parameters and optimizer state are written where the plan
puts their writes, as the plan's memory assumes: a step that raises part way
may have written some of them. With ``atomic`` a step is all or nothing for
the caller's tensors: those writes (:attr:`Program.deferred`) run after every
other operation (holding up to one more copy of the state until then), and a
tensor written during the step (batch norm's running statistics) is written
in a copy, copied back once the step has succeeded.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.fx as fx

from ..errors import OptionError
from .program import Program, bind_call, call_node, copy_to, draw_seed

__all__ = ["LocalExecutor", "default_devices"]


def default_devices(num_devices: int) -> list[torch.device]:
    """``cuda:j`` for plan device j where that many GPUs are present, else the CPU for every device."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= num_devices:
        return [torch.device("cuda", j) for j in range(num_devices)]
    return [torch.device("cpu")] * num_devices


def _torch_device(spec: str | torch.device) -> torch.device:
    """A device this process can run operations on: the CPU, or a CUDA device that is present."""
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise OptionError(f"devices: {spec!r} is not a torch device ({exc})") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise OptionError(f"devices: {spec!r} names a CUDA device, but this machine has {count}")
    elif device.type != "cpu":
        raise OptionError(f"devices: {spec!r}: the local executor runs on 'cpu' and 'cuda:N' devices")
    return device


def _held_bytes(env: dict, num_devices: int) -> np.ndarray:
    """Per plan device, the bytes of the distinct tensor storages that ``env``'s values there hold."""
    held = np.zeros(num_devices, dtype=np.int64)
    seen = set()
    for (_, d), value in env.items():
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if (storage.data_ptr(), storage.device) not in seen:
                    seen.add((storage.data_ptr(), storage.device))
                    held[d] += storage.nbytes()
    return held


class LocalExecutor:
    """Run a :class:`~placer.runtime.program.Program` in this process.

    Parameters
    ----------
    program : Program
    devices : sequence of str or torch.device, optional
        The torch device of every plan device (default: :func:`default_devices`).
    profile : bool
        Time every operation and transfer (CUDA events on GPUs); the figures of
        the last step are in :attr:`op_s` and :attr:`transfer_s`.
    seed : int, optional
        Base seed of the step's random operations (:func:`~placer.runtime.program.op_seed`);
        default: drawn from torch's global generator, when the step has random operations.
    atomic : bool
        Write the caller's tensors only once the rest of the step has run
        without error (see the module's docstring).
    track_memory : bool
        After every operation, add up the tensor storage each plan device holds
        (inputs, parameters, outputs and received copies, each storage once):
        :attr:`peak_bytes` is the reference model's peak memory (FORMATS.md,
        rule 6), measured. Slow: for checks and benchmarks, not training.

    Attributes
    ----------
    op_s : dict of str to float
        Seconds per graph node id, from the last profiled step.
    transfer_s : list of (Transfer, float)
        Seconds per transfer, from the last profiled step.
    peak_bytes : ndarray of int, or None
        With ``track_memory``, per plan device, the most bytes of storage the
        last step held there after any operation.

    Raises
    ------
    OptionError
        If ``devices`` does not give one device per plan device, or names one this machine lacks.

    Examples
    --------
    >>> ex = LocalExecutor(program)                     # doctest: +SKIP
    >>> outputs = ex.run(flat_inputs)                   # doctest: +SKIP
    """

    def __init__(
        self,
        program: Program,
        devices: Sequence[str | torch.device] | None = None,
        *,
        profile: bool = False,
        seed: int | None = None,
        atomic: bool = False,
        track_memory: bool = False,
    ):
        self.program = program
        self.seed = seed if seed is not None else (draw_seed() if program.random else 0)
        self.steps_run = 0
        n = program.num_devices
        self.devices = default_devices(n) if devices is None else [_torch_device(d) for d in devices]
        if len(self.devices) != n:
            raise OptionError(f"devices: {len(self.devices)} given for a plan over {n} devices")
        self.profile = profile
        self.track_memory = track_memory
        self.peak_bytes: np.ndarray | None = None
        self.deferred = program.deferred if atomic else frozenset()
        # Atomic: inputs written during the step, not after it, are written in a copy (see run).
        self.staged = (
            {
                root
                for v, roots in program.writes.items()
                if v not in self.deferred
                for root in roots
                if root.op == "placeholder"
            }
            if atomic
            else set()
        )
        self.cuda = any(d.type == "cuda" for d in self.devices)
        # What _walk looks up per node, once: its device, its inputs' keys in the step's values, what dies after it.
        self._walk_steps = [
            (v, program.device_of[v], tuple((a, (a, program.device_of[v])) for a in v.all_input_nodes), frees)
            for v, frees in zip(program.schedule, program.frees)
        ]
        # Each node's call, its arguments' positions resolved once (random nodes draw with their step's seed).
        self.calls = {
            v: bind_call(v, self.devices[program.device_of[v]]) for v in program.schedule if v not in program.random
        }
        self.op_s: dict[str, float] = {}
        self.transfer_s: list[tuple[Any, float]] = []  # (Transfer, seconds)
        if self.cuda:
            self.compute = [torch.cuda.Stream(device=d) if d.type == "cuda" else None for d in self.devices]
            self.copy_streams: dict[tuple[int, int], tuple[Any, Any]] = {}
            for x in program.transfers:
                if (x.src, x.dst) not in self.copy_streams:
                    self.copy_streams[(x.src, x.dst)] = tuple(
                        torch.cuda.Stream(device=self.devices[j]) if self.devices[j].type == "cuda" else None
                        for j in (x.src, x.dst)
                    )

    # ------------------------------------------------------------------ api
    def run(self, flat_inputs: Sequence[Any]) -> list[Any]:
        """Run one step; return the step's flat outputs.

        Inputs on their plan device are used in place, so the step's writes
        (new parameters, optimizer state) land in them; others are copied there
        and the written ones copied back once the step has succeeded. With
        ``atomic`` a step that raises writes no input.
        """
        prog = self.program
        if len(flat_inputs) != prog.num_flat:
            raise OptionError(f"the step takes {prog.num_flat} flat inputs, got {len(flat_inputs)}")
        env: dict[tuple[fx.Node, int], Any] = {}
        moved: list[tuple[Any, Any]] = []
        written = {root for roots in prog.writes.values() for root in roots}
        copied = set()  # the inputs the step works on a copy of
        for p, value in zip(prog.placeholders, prog.input_values(flat_inputs)):
            home = self.devices[prog.device_of[p]]
            if isinstance(value, torch.Tensor) and (value.device != home or p in self.staged):
                local = copy_to(value, home)
                if p in written:
                    moved.append((value, local))
                value = local
                copied.add(p)
            env[(p, prog.device_of[p])] = value
        # What is held all step, for track_memory: the inputs used in place (the caller holds them), and
        # the copies to write back.
        pinned = (
            {
                (p, prog.device_of[p]): env[(p, prog.device_of[p])]
                for p in prog.placeholders
                if p not in copied or p in written
            }
            if self.track_memory
            else {}
        )
        try:
            if self.cuda:
                for d in self.devices:
                    if d.type == "cuda":
                        torch.cuda.current_stream(d).synchronize()
                outputs = self._run_cuda(env, pinned)
            else:
                outputs = self._run_sequential(env, pinned)
        except Exception as exc:
            if not self.deferred and any(p in written and p not in copied for p in prog.placeholders):
                exc.add_note(
                    "placer: the step failed part way; the new parameters and optimizer state it wrote "
                    "before failing are in the model and optimizer already (placer.apply(..., atomic=True) "
                    "writes them only once the whole step has succeeded)"
                )
            raise
        self.steps_run += 1
        for original, local in moved:
            original.copy_(local)
        return outputs

    # ------------------------------------------------------------ internals
    def _outputs(self, env) -> list[Any]:
        prog = self.program
        return [env[(v, prog.device_of[v])] if isinstance(v, fx.Node) else v for v in prog.outputs]

    def _walk(self, env, issue, send, pinned) -> None:
        """Run ``issue(v, values)`` on every node in the plan's order, then ``send(v, out)`` its transfers;
        the deferred writes (:attr:`deferred`) last, once every other node has run (or been queued).
        ``pinned``: what the caller holds all step, counted with ``env`` by ``track_memory``."""
        prog = self.program
        for p in prog.placeholders:
            send(p, env[(p, prog.device_of[p])])
        deferred = []
        track_memory, sends = self.track_memory, prog.sends
        if track_memory:
            self.peak_bytes = np.zeros(prog.num_devices, dtype=np.int64)
        for v, d, inputs, frees in self._walk_steps:
            values = {a: env[key] for a, key in inputs}
            if v in self.deferred:
                deferred.append((v, values))
                continue
            out = issue(v, values)
            env[(v, d)] = out
            if v in sends:
                send(v, out)
            if track_memory:  # its inputs, its output and the copies just sent are all held now
                np.maximum(self.peak_bytes, _held_bytes({**pinned, **env}, prog.num_devices), out=self.peak_bytes)
            for key in frees:
                env.pop(key, None)
        for v, values in deferred:
            issue(v, values)

    def _run_sequential(self, env, pinned) -> list[Any]:
        prog = self.program
        op_s: dict[str, float] = {}
        transfer_s = []
        clock = time.perf_counter

        calls, profile = self.calls, self.profile

        def issue(v, values):
            t0 = clock() if profile else 0.0
            call = calls.get(v)
            if call is not None:
                out = call(values)
            else:
                out = call_node(v, values, self.devices[prog.device_of[v]], prog.seed_of(v, self.seed, self.steps_run))
            if profile:
                op_s[v] = clock() - t0
            return out

        def send(v, value):
            for x in prog.sends.get(v, ()):
                t0 = clock()
                env[(v, x.dst)] = copy_to(value, self.devices[x.dst], prog.compact_views)
                transfer_s.append((x, clock() - t0))

        self._walk(env, issue, send, pinned)
        if self.profile:
            self.op_s = {prog.node_id(v): s for v, s in op_s.items() if v in prog.graph_node}
            self.transfer_s = transfer_s
        return self._outputs(env)

    def _run_cuda(self, env, pinned) -> list[Any]:
        prog = self.program
        done: dict[fx.Node, torch.cuda.Event] = {}  # a value is ready on its own device
        arrived: dict[int, torch.cuda.Event] = {}  # transfer index -> copy finished
        timing: list[tuple[Any, Any, Any]] = []  # (fx node or Transfer, start, end)
        entry = {d: torch.cuda.Event() for d in {dev for dev in self.devices if dev.type == "cuda"}}
        for d, ev in entry.items():
            ev.record(torch.cuda.current_stream(d))

        def stream_of(j):
            return self.compute[j] if self.compute[j] is not None else None

        def send(v, value):
            for x in prog.sends.get(v, ()):
                env[(v, x.dst)] = self._copy_async(x, value, done.get(v), arrived, timing)

        for s in self.compute:
            if s is not None:
                s.wait_event(entry[s.device])

        def issue(v, values):
            """Queue node ``v`` on its device's stream, after the transfers it reads or overwrites."""
            d = prog.device_of[v]
            stream = stream_of(d)
            with _maybe_stream(stream):
                for a in v.all_input_nodes:
                    x = prog.recv.get((a, d))
                    if x is not None and x.index in arrived:
                        if stream is not None:
                            stream.wait_event(arrived[x.index])
                        else:  # a CPU device reads it now
                            arrived[x.index].synchronize()
                for x in prog.guard.get(v, ()):
                    if x.index in arrived and stream is not None:
                        stream.wait_event(arrived[x.index])
                if self.profile and stream is not None:
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0.record(stream)
                out = call_node(v, values, self.devices[d], self.program.seed_of(v, self.seed, self.steps_run))
                if self.profile and stream is not None:
                    t1.record(stream)
                    timing.append((v, t0, t1))
                if prog.sends.get(v) and stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    done[v] = ev
            return out

        self._walk(env, issue, send, pinned)
        for dev in entry:
            torch.cuda.synchronize(dev)
        if self.profile:
            self.op_s = {
                prog.node_id(v): t0.elapsed_time(t1) / 1e3
                for v, t0, t1 in timing
                if isinstance(v, fx.Node) and v in prog.graph_node
            }
            self.transfer_s = [(x, t0.elapsed_time(t1) / 1e3) for x, t0, t1 in timing if not isinstance(x, fx.Node)]
        return self._outputs(env)

    def _copy_async(self, x, value, ready, arrived, timing):
        """Copy ``value`` for transfer ``x`` on its pair's copy streams, after its producer's event."""
        if not isinstance(value, torch.Tensor):
            return value
        src_stream, dst_stream = self.copy_streams[(x.src, x.dst)]
        compute_dst = self.compute[x.dst]
        with _maybe_stream(src_stream), _maybe_stream(dst_stream):
            for s in (src_stream, dst_stream):
                if s is not None and ready is not None:
                    s.wait_event(ready)
            if self.profile:
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record(dst_stream or src_stream)
            out = copy_to(value, self.devices[x.dst], self.program.compact_views)
            if self.profile:
                t1.record(dst_stream or src_stream)
                timing.append((x, t0, t1))
            ev = torch.cuda.Event()
            ev.record(dst_stream or src_stream)
        arrived[x.index] = ev
        # Tell the caching allocator which streams still use these blocks.
        if value.is_cuda:
            for s in (src_stream, dst_stream):
                if s is not None and s.device == value.device:
                    value.record_stream(s)
        if out.is_cuda and compute_dst is not None:
            out.record_stream(compute_dst)
        return out


class _maybe_stream:
    """``torch.cuda.stream(s)`` when ``s`` is a stream, else nothing."""

    def __init__(self, stream):
        self.ctx = torch.cuda.stream(stream) if stream is not None else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)
