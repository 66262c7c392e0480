"""Contention: how much slower a training step runs while other processes on the machine run it too.

A profile (:func:`~placer.harness.profiling.profile_step`) times each
operation alone, on one thread's CPU clock. The ranks of a process-per-device
run on one machine share its cores, caches and memory bandwidth: two ranks
on two cores each run their operations slower than one process does, and
four ranks on two cores take turns on them. The reference model knows none
of this, so its step for such a run is the uncontended one.

:func:`measure_contention` runs the model's eager training step in one
process, then in ``n`` processes at once (one thread each, as the ranks
run), in turn over a few rounds, and takes the median of the rounds' ratios
of the median steps by the wall clock (at least ``n`` over the cores:
processes beyond them take turns). A machine's speed moves over seconds; a
ratio of two measurements seconds apart moves with it, a median of adjacent
pairs much less. :func:`under_contention`
scales a profile by that slowdown: every operation of every rank as if all
``n`` ranks were busy at once, which holds for data parallelism and
over-charges steps where ranks wait (a pipeline's bubbles).
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

from ..cost.profile import Profile
from ..errors import OptionError, PlacerError

__all__ = ["Contention", "measure_contention", "under_contention"]

#: Seconds each process trains for in each measurement, once all have started: long enough for several
#: steps of any size profiled on a CPU, short enough to measure before a run.
TRAIN_SECONDS = 1.5
#: Fewest steps each process times, whatever they take.
MIN_STEPS = 3
#: Rounds of one process alone, then all at once.
ROUNDS = 3


class Contention(NamedTuple):
    """Median eager steps of one process alone and of ``processes`` processes at once, by the wall clock, on a
    machine of ``cores`` CPU cores (0: not known), and each round's ratio of the two (``ratios``, empty where
    not measured in rounds)."""

    processes: int
    alone_s: float
    together_s: float
    cores: int = 0
    ratios: tuple[float, ...] = ()

    @property
    def slowdown(self) -> float:
        """How much longer a step takes while the other processes run theirs: the median of ``ratios`` (else
        ``together_s / alone_s``), and at least ``processes / cores``, since single-thread processes beyond the
        cores take turns on them (medians taken seconds apart on a busy machine can say less).

        Examples
        --------
        >>> Contention(4, 0.050, 0.080, cores=2).slowdown, Contention(2, 0.050, 0.060, cores=2).slowdown
        (2.0, 1.2)
        >>> Contention(2, 0.050, 0.060, cores=2, ratios=(1.1, 1.4, 1.3)).slowdown
        1.3
        """
        measured = statistics.median(self.ratios) if self.ratios else self.together_s / self.alone_s
        return max(measured, self.processes / self.cores) if self.cores else measured

    def to_dict(self) -> dict:
        return {**self._asdict(), "ratios": list(self.ratios), "slowdown": self.slowdown}


def measure_contention(
    spec: str,
    batch: int,
    processes: int,
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    settings: dict | None = None,
    seconds: float = TRAIN_SECONDS,
    rounds: int = ROUNDS,
    timeout_s: float = 600.0,
) -> Contention:
    """Time ``spec``'s eager training step alone, then in ``processes`` processes at once, ``rounds`` times.

    ``processes`` processes each build the model and train two warm-up steps.
    Then, each round, the first trains alone for ``seconds`` (at least
    :data:`MIN_STEPS` steps) on one thread, then all of them at once; a
    measurement's step is the median of every process's steps. The slowdown
    is the median of the rounds' ratios.

    Parameters
    ----------
    spec, batch
        The model (:func:`~placer.capture.spec.load_model`).
    processes : int
        The ranks that will share the machine (>= 1).
    optimizer, lr, settings
        The optimizer (:func:`~placer.capture.optim.optimizer_spec`).
    seconds : float
        How long each process trains in each measurement.
    rounds : int
        Measurements alone and together, in turn (>= 1).
    timeout_s : float
        Most seconds a measurement may take.

    Returns
    -------
    Contention

    Raises
    ------
    OptionError
        ``processes`` < 1, ``seconds`` <= 0 or ``rounds`` < 1.
    PlacerError
        A process failed (its error's last line) or ran past ``timeout_s``.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise OptionError(f"contention: processes must be an integer >= 1, got {processes!r}")
    if not seconds > 0:
        raise OptionError(f"contention: seconds must be > 0, got {seconds!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise OptionError(f"contention: rounds must be an integer >= 1, got {rounds!r}")
    job = json.dumps(
        {"spec": spec, "batch": batch, "optimizer": optimizer, "lr": lr, "settings": settings or {}, "seconds": seconds}
    )
    alone, together = _train_in_rounds(job, processes, rounds, timeout_s)
    if processes == 1:
        together = alone
    ratios = tuple(statistics.median(t) / statistics.median(a) for a, t in zip(alone, together))
    return Contention(
        processes,
        statistics.median(s for steps in alone for s in steps),
        statistics.median(s for steps in together for s in steps),
        os.cpu_count() or 0,
        ratios,
    )


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


def _train_in_rounds(job: str, processes: int, rounds: int, timeout_s: float) -> tuple[list, list]:
    """Each round's steps of the first process alone and of all ``processes`` at once (none where there is one),
    from processes started once (see :func:`_worker`)."""
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

    def train(group: list[subprocess.Popen]) -> list[float]:
        for child in group:
            child.stdin.write("go\n")
            child.stdin.flush()
        steps = []
        for child in group:
            line = _line_by(child, deadline, processes)
            if not line:
                raise PlacerError(f"contention: a training process failed: {_last_line(child, deadline)}")
            steps += json.loads(line)
        return steps

    try:
        for child in children:  # each says "ready" once built and warmed up
            if _line_by(child, deadline, processes).strip() != "ready":
                raise PlacerError(f"contention: a training process failed: {_last_line(child, deadline)}")
        alone, together = [], []
        for _ in range(rounds):
            alone.append(train(children[:1]))
            if processes > 1:
                together.append(train(children))
        return alone, together
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _line_by(child: subprocess.Popen, deadline: float, processes: int) -> str:
    """The child's next line of output, or PlacerError once ``deadline`` passes."""
    ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise PlacerError(f"contention: {processes} training processes ran past their time limit")
    return child.stdout.readline()


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
    while sys.stdin.readline().strip() == "go":  # until the parent closes the pipe (or kills this process)
        steps, began = [], time.perf_counter()
        while len(steps) < MIN_STEPS or time.perf_counter() - began < spec["seconds"]:
            steps.append(step())
        print(json.dumps(steps), flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1])
