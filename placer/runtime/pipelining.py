"""PyTorch's own pipeline parallelism on the same ranks: the oracle and the baseline for micro-batched plans.

:func:`run_pipelining` trains a model cut by hand into stages with
``torch.distributed.pipelining`` (one ``PipelineStage`` per process,
``ScheduleGPipe`` or ``Schedule1F1B`` over ``m`` micro-batches, gloo on
CPUs), the way a user of torch writes a pipeline: stage 0 reads the batch,
the last stage's output and the batch's targets give each micro-batch's loss,
gradients accumulate over the micro-batches and are divided by their count
(``scale_grads``), and each rank steps its own optimizer on its stage's
parameters. ``tests/test_pipeline_torch.py`` compares placer's micro-batched
plans with it, and ``bench/pipeline_measured.py`` times it beside them.

What it computes is gradient accumulation over the micro-batches
(:func:`placer.runtime.check.train_accumulated`) where the micro-batches are
equal: batch norm normalises each micro-batch by its own statistics and
updates its running statistics once per micro-batch, in micro-batch order.
Unlike a placed step, where an update that does not read the batch runs once
per step (:mod:`placer.runtime.microbatches`), every micro-batch's forward also
advances batch norm's ``num_batches_tracked``.
"""

from __future__ import annotations

import copy
import inspect
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import OptionError
from ..terminate import terminate_raises
from .distributed import KernelChoice, launch_ranks

__all__ = ["PipeliningResult", "run_pipelining", "SCHEDULES"]

#: The schedules :func:`run_pipelining` runs: placer's schedule name -> torch's class name.
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


@dataclass
class PipeliningResult:
    """What a run of ``torch.distributed.pipelining`` measured and trained.

    Attributes
    ----------
    step_s : list of float
        Wall time of every step, barrier to barrier.
    losses : list of float
        Every step's loss: the micro-batches' losses weighted by their samples.
    states : list of dict
        Each stage's ``state_dict()`` after the last step, on the CPU, in stage order.
    optimizer_states : list of dict
        Each stage's optimizer ``state_dict()`` after the last step.
    """

    step_s: list[float]
    losses: list[float]
    states: list[dict]
    optimizer_states: list[dict] = field(default_factory=list)


@dataclass
class _Job:
    stages: list[nn.Module]
    examples: list[tuple[tuple, tuple]]  # per stage: a micro-batch's inputs and outputs
    inputs: tuple
    target: Any
    loss_fn: Callable[..., torch.Tensor]
    optimizer: Any  # placer.capture.OptimizerSpec
    microbatches: int
    schedule: str
    steps: int
    timeout_s: float
    threads: int
    kernel_choice: KernelChoice
    result_dir: str


def run_pipelining(
    stages: Sequence[nn.Module],
    inputs: Sequence[Any],
    target: torch.Tensor,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    optimizer: Any,
    microbatches: int,
    *,
    schedule: str = "1f1b",
    steps: int = 1,
    timeout_s: float = 60.0,
    threads: int = 1,
) -> PipeliningResult:
    """Train ``steps`` steps of a pipeline of ``stages`` with ``torch.distributed.pipelining`` over gloo.

    Parameters
    ----------
    stages : sequence of torch.nn.Module
        Stage ``s`` runs in process ``s``: stage 0 as ``stages[0](*inputs)``, each later one on what
        the stage before it returns. They are not modified (each rank trains a copy).
    inputs : sequence
        The whole batch for stage 0; tensors are cut on their first dimension into the micro-batches
        (``torch.tensor_split``: the first ones a sample more where the batch does not divide).
    target : torch.Tensor
        The batch's targets, cut the same way.
    loss_fn : callable
        ``loss_fn(output, target)``: a micro-batch's mean loss from the last stage's output.
    optimizer : OptimizerSpec
        The optimizer and its settings (:attr:`placer.capture.CapturedStep.optimizer`), one per stage
        over its parameters, on its per-parameter (not ``foreach``) path.
    microbatches : int
        ``m``; ``1f1b`` needs at least as many as stages.
    schedule : {"gpipe", "1f1b"}
        ``ScheduleGPipe`` or ``Schedule1F1B``.
    steps : int
    timeout_s : float
        Longest any rank may wait for another.
    threads : int
        Intra-op threads per rank.

    Returns
    -------
    PipeliningResult

    Raises
    ------
    OptionError
        No stages, an unknown schedule, fewer micro-batches than ``1f1b`` needs or than samples, or
        ``steps`` not positive.
    RunError
        A rank failed, died or did not finish in time (every rank is stopped).
    """

    stages = list(stages)
    world = len(stages)
    if world < 1:
        raise OptionError("a pipeline needs at least one stage")
    if schedule not in SCHEDULES:
        raise OptionError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise OptionError(f"microbatches must be a positive integer, got {microbatches!r}")
    if schedule == "1f1b" and microbatches < world:
        raise OptionError(f"Schedule1F1B needs at least as many micro-batches as stages ({world}), got {microbatches}")
    if int(target.shape[0]) < microbatches:
        raise OptionError(
            f"{microbatches} micro-batches need a batch of at least as many samples, got {target.shape[0]}"
        )
    if int(target.shape[0]) % microbatches:
        raise OptionError(
            f"torch's stages exchange micro-batches of one shape: {microbatches} micro-batches must divide the "
            f"batch of {target.shape[0]} samples"
        )
    if not isinstance(steps, int) or steps < 1:
        raise OptionError(f"steps must be a positive integer, got {steps!r}")
    inputs = tuple(inputs)
    with terminate_raises(), tempfile.TemporaryDirectory(prefix="placer-pipelining-") as tmp:
        job = _Job(
            stages,
            _examples(stages, inputs, int(target.shape[0]) // microbatches),
            inputs,
            target,
            loss_fn,
            optimizer,
            microbatches,
            schedule,
            steps,
            timeout_s,
            threads,
            KernelChoice.here(),
            tmp,
        )
        launch_ranks(_train, world, job, tmp, time.monotonic() + timeout_s * (steps + 3), timeout_s, "fork")
        parts = [torch.load(Path(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]
        return PipeliningResult(
            parts[0]["step_s"],
            parts[-1]["losses"],
            [part["state"] for part in parts],
            [part["optimizer"] for part in parts],
        )


def _examples(stages: list[nn.Module], inputs: tuple, rows: int) -> list[tuple[tuple, tuple]]:
    """Each stage's inputs and outputs on a micro-batch of ``rows`` samples, run on copies of the stages.

    Given to the ``PipelineStage`` (static metadata), they spare it the forward it would otherwise run
    on its first call to learn the shapes: in training mode, on the first micro-batch in stage 0 and on
    uninitialised tensors in the others, it would move batch norm's running statistics once more.
    """
    x = tuple(a[:rows] if isinstance(a, torch.Tensor) and a.dim() > 0 else a for a in inputs)
    examples = []
    for stage in stages:
        out = copy.deepcopy(stage)(*x)
        # Detached, each keeps whether it needs a gradient: the stage receives and sends gradients by it.
        out = tuple(o.detach().requires_grad_(o.requires_grad) for o in (out if isinstance(out, tuple) else (out,)))
        examples.append((x, out))
        x = out
    return examples


def _train(rank: int, world: int, job: _Job, init_method: str) -> None:
    from torch.distributed import pipelining  # deferred: imports torch.distributed's pipelining

    torch.set_num_threads(max(1, job.threads))
    job.kernel_choice.apply()
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=job.timeout_s)
    )
    try:
        module = job.stages[rank]
        inputs, outputs = job.examples[rank]
        stage = pipelining.PipelineStage(
            module, rank, world, torch.device("cpu"), input_args=inputs, output_args=outputs
        )
        schedule = getattr(pipelining, SCHEDULES[job.schedule])(stage, job.microbatches, loss_fn=job.loss_fn)
        settings = dict(job.optimizer.settings)
        if "foreach" in inspect.signature(job.optimizer.torch_class).parameters:
            settings["foreach"] = False
        optimizer = job.optimizer.torch_class(module.parameters(), **settings)
        rows = [int(part.shape[0]) for part in torch.tensor_split(job.target, job.microbatches)]
        first, last = rank == 0, rank == world - 1
        step_s, losses = [], []
        for _ in range(job.steps):
            parts: list[torch.Tensor] = []
            dist.barrier()
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            extra = {"target": job.target, "losses": parts} if last else {}
            schedule.step(*(job.inputs if first else ()), return_outputs=False, **extra)
            optimizer.step()
            dist.barrier()
            step_s.append(time.perf_counter() - t0)
            if last:
                losses.append(sum(float(loss.detach()) * n for loss, n in zip(parts, rows)) / sum(rows))
        state = {name: t.detach().clone() for name, t in module.state_dict().items()}
        torch.save(
            {"step_s": step_s, "losses": losses, "state": state, "optimizer": optimizer.state_dict()},
            Path(job.result_dir, f"rank{rank}.pt"),
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()
