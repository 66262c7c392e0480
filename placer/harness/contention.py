"""Contention: how much slower a training step runs while other processes on the machine run it too.

A profile (:func:`~placer.harness.profiling.profile_step`) times each
operation alone, on one thread's CPU clock. The ranks of a process-per-device
run on one machine share its cores, caches and memory bandwidth: two ranks
on two cores each run their operations slower than one process does, and
four ranks on two cores take turns on them. The reference model knows none
of this, so its step for such a run is the uncontended one.

:func:`measure_contention` runs the model's eager training step in one
process, then in ``n`` processes at once (one thread each, as the ranks
run), and compares the median steps by the wall clock (at least ``n`` over
the cores: processes beyond them take turns). :func:`under_contention`
scales a profile by that slowdown: every operation of every rank as if all
``n`` ranks were busy at once, which holds for data parallelism and
over-charges steps where ranks wait (a pipeline's bubbles).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

from ..cost.profile import Profile
from ..errors import OptionError, PlacerError

__all__ = ["Contention", "measure_contention", "under_contention"]

#: Seconds each process trains for, once all have started: long enough for several steps of any size
#: profiled on a CPU, short enough to measure before a run.
TRAIN_SECONDS = 3.0
#: Fewest steps each process times, whatever they take.
MIN_STEPS = 3


class Contention(NamedTuple):
    """Median eager steps of one process alone and of ``processes`` processes at once, by the wall clock, on a
    machine of ``cores`` CPU cores (0: not known)."""

    processes: int
    alone_s: float
    together_s: float
    cores: int = 0

    @property
    def slowdown(self) -> float:
        """How much longer a step takes while the other processes run theirs: ``together_s / alone_s``, and at
        least ``processes / cores``, since single-thread processes beyond the cores take turns on them (the
        two medians, taken seconds apart on a busy machine, can say less).

        Examples
        --------
        >>> Contention(4, 0.050, 0.080, cores=2).slowdown, Contention(2, 0.050, 0.060, cores=2).slowdown
        (2.0, 1.2)
        """
        measured = self.together_s / self.alone_s
        return max(measured, self.processes / self.cores) if self.cores else measured

    def to_dict(self) -> dict:
        return {**self._asdict(), "slowdown": self.slowdown}


def measure_contention(
    spec: str,
    batch: int,
    processes: int,
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    settings: dict | None = None,
    seconds: float = TRAIN_SECONDS,
    timeout_s: float = 600.0,
) -> Contention:
    """Time ``spec``'s eager training step alone, then in ``processes`` processes at once.

    Each process builds the model, trains two warm-up steps, waits until every
    process is ready, then trains for ``seconds`` (at least :data:`MIN_STEPS`
    steps) on one thread; the step is the median of every process's steps.

    Parameters
    ----------
    spec, batch
        The model (:func:`~placer.capture.spec.load_model`).
    processes : int
        The ranks that will share the machine (>= 1).
    optimizer, lr, settings
        The optimizer (:func:`~placer.capture.optim.optimizer_spec`).
    seconds : float
        How long each process trains once all are ready.
    timeout_s : float
        Most seconds a measurement may take.

    Returns
    -------
    Contention

    Raises
    ------
    OptionError
        ``processes`` < 1 or ``seconds`` <= 0.
    PlacerError
        A process failed (its error's last line) or ran past ``timeout_s``.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise OptionError(f"contention: processes must be an integer >= 1, got {processes!r}")
    if not seconds > 0:
        raise OptionError(f"contention: seconds must be > 0, got {seconds!r}")
    job = json.dumps(
        {"spec": spec, "batch": batch, "optimizer": optimizer, "lr": lr, "settings": settings or {}, "seconds": seconds}
    )
    alone = _train_at_once(job, 1, timeout_s)
    together = alone if processes == 1 else _train_at_once(job, processes, timeout_s)
    return Contention(processes, statistics.median(alone), statistics.median(together), os.cpu_count() or 0)


def under_contention(profile: Profile, contention: Contention) -> Profile:
    """``profile`` with every node's seconds (and fixed part) times ``contention.slowdown``; its meta records the
    measurement.

    Examples
    --------
    >>> p = Profile("g", "d", "cpu", {"a": 1e-3, "b": 2e-3})
    >>> scaled = under_contention(p, Contention(4, 0.010, 0.021))
    >>> [round(s * 1e3, 6) for s in scaled.node_seconds.values()], scaled.meta["contention"]["processes"]
    ([2.1, 4.2], 4)
    """
    factor = contention.slowdown
    return Profile(
        profile.graph_name,
        profile.graph_digest,
        profile.device_kind,
        {node: seconds * factor for node, seconds in profile.node_seconds.items()},
        {**profile.meta, "contention": contention.to_dict()},
        profile.source,
        {node: seconds * factor for node, seconds in profile.fixed_seconds.items()},
    )


def _train_at_once(job: str, processes: int, timeout_s: float) -> list[float]:
    """Every step each of ``processes`` processes timed, all started together (see :func:`_worker`)."""
    deadline = time.monotonic() + timeout_s
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "placer.harness.contention", job],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:  # each says "ready" once built and warmed up
            if child.stdout.readline().strip() != "ready":
                raise PlacerError(f"contention: a training process failed: {_last_line(child, deadline)}")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        steps = []
        for child in children:
            out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if child.returncode != 0:
                raise PlacerError(f"contention: a training process failed: {(err.strip().splitlines() or ['?'])[-1]}")
            steps += json.loads(out)
        return steps
    except subprocess.TimeoutExpired:
        raise PlacerError(f"contention: {processes} training processes ran past {timeout_s:g} s") from None
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _last_line(child: subprocess.Popen, deadline: float) -> str:
    try:
        _, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "no answer"
    return (err.strip().splitlines() or [f"exit status {child.returncode}"])[-1]


def _worker(job: str) -> None:
    """One process of :func:`_train_at_once`: build, warm up, say ready, wait for go, train, print the steps."""
    import torch  # deferred: imports torch

    from ..capture.optim import optimizer_spec
    from ..capture.spec import load_model

    spec = json.loads(job)
    torch.set_num_threads(1)
    model, inputs = load_model(spec["spec"], spec["batch"])
    optimizer = optimizer_spec(spec["optimizer"], spec["lr"], **spec["settings"]).eager(model.parameters())

    def step() -> float:
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(*inputs).backward()
        optimizer.step()
        return time.perf_counter() - began

    step(), step()
    print("ready", flush=True)
    sys.stdin.readline()
    steps, began = [], time.perf_counter()
    while len(steps) < MIN_STEPS or time.perf_counter() - began < spec["seconds"]:
        steps.append(step())
    print(json.dumps(steps), flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1])
