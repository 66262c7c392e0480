"""PyTorch's own data parallelism on the same ranks: the oracle and the baseline for replicated plans.

:func:`run_ddp` trains a model with ``torch.nn.parallel.DistributedDataParallel``
(DDP), optionally with ``torch.distributed.optim.ZeroRedundancyOptimizer``
(ZeRO stage 1), one process per replica, each on its rows of the batch as a
data-parallel plan cuts it. ``placer run --verify`` compares a replicated
plan's training with it, and ``bench/ddp.py`` times it beside placer's plans.

DDP averages its replicas' gradients equally, so it trains the global
batch's mean loss only where the batch divides by the replicas; placer's
replicas weigh theirs by their samples. Buffers follow DDP's default
(``broadcast_buffers``): every forward starts from rank 0's, so rank 0's
running statistics are the model's, as they are under a placer plan.
"""

from __future__ import annotations

import copy
import inspect
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# Imported here, not in the ranks: a rank forked while another thread of the launcher held the import
# lock would wait for it forever. The package scripts its functional optimizers with torch.jit, which
# torch deprecates: not the user's concern.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.distributed.optim import ZeroRedundancyOptimizer  # deferred: imports torch

from ..errors import OptionError
from ..terminate import terminate_raises
from ..transform.replicate import BUCKET_BYTES
from ..transform.split import part_rows
from .distributed import KernelChoice, launch_ranks, resolve_backend

__all__ = ["DDPResult", "run_ddp", "batch_rows"]


@dataclass
class DDPResult:
    """What a DDP run measured and trained.

    Attributes
    ----------
    step_s : list of float
        Wall time of every step, barrier to barrier.
    losses : list of float
        The global batch's loss of every step (the replicas' losses weighted by their samples).
    model_state : dict
        Rank 0's ``state_dict()`` after the last step, on the CPU.
    optimizer_state : dict
        The optimizer's ``state_dict()`` after the last step (ZeRO's consolidated on rank 0).
    """

    step_s: list[float]
    losses: list[float]
    model_state: dict
    optimizer_state: dict = field(default_factory=dict)


@dataclass
class _Job:
    model: nn.Module
    inputs: tuple
    rows: list[tuple[int, int]]
    optimizer: Any  # placer.capture.OptimizerSpec
    steps: int
    zero: bool
    bucket_bytes: int
    backend: str
    timeout_s: float
    threads: int
    batch: int
    kernel_choice: KernelChoice
    result_path: str


def batch_rows(batch: int, replicas: int) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` of each replica: the first ones one sample more where the batch does not divide,
    as a data-parallel plan cuts it.

    >>> batch_rows(5, 2)
    [(0, 3), (3, 5)]
    """

    return part_rows(batch, replicas)


def run_ddp(
    model: nn.Module,
    inputs: Sequence[Any],
    optimizer: Any,
    replicas: int,
    *,
    steps: int = 1,
    zero: bool = False,
    bucket_bytes: int = BUCKET_BYTES,
    backend: str = "auto",
    timeout_s: float = 60.0,
    threads: int = 1,
) -> DDPResult:
    """Train ``steps`` steps of ``model`` with DDP (and ZeRO) over ``replicas`` local processes.

    Parameters
    ----------
    model : torch.nn.Module
        ``model(*inputs)`` returns the scalar loss; it is not modified (each rank trains a copy).
    inputs : sequence
        The whole batch; tensors that lead with it are cut into the replicas' rows
        (:func:`batch_rows`), the rest given whole to every replica.
    optimizer : OptimizerSpec
        The optimizer and its settings (:attr:`placer.capture.CapturedStep.optimizer`),
        run on its per-parameter (not ``foreach``) path, as the captured step is.
    replicas : int
        Processes, one per replica.
    steps : int
    zero : bool
        Shard the optimizer with ``ZeroRedundancyOptimizer``.
    bucket_bytes : int
        DDP's gradient bucket size (``bucket_cap_mb``).
    backend : {"auto", "gloo", "nccl"}
    timeout_s : float
        Longest any rank may wait for another.
    threads : int
        Intra-op threads per rank.

    Returns
    -------
    DDPResult

    Raises
    ------
    OptionError
        Bad ``replicas`` or ``steps``, or a batch smaller than the replicas.
    RunError
        A rank failed, died or did not finish in time (every rank is stopped).
    """

    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise OptionError(f"replicas must be a positive integer, got {replicas!r}")
    if not isinstance(steps, int) or steps < 1:
        raise OptionError(f"steps must be a positive integer, got {steps!r}")
    inputs = tuple(inputs)
    batch = next((int(x.shape[0]) for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1), None)
    if batch is None or batch < replicas:
        raise OptionError(f"DDP over {replicas} replicas needs a batch of at least {replicas} samples, got {batch}")
    backend = resolve_backend(backend, replicas)
    method = "spawn" if backend == "nccl" else "fork"
    with terminate_raises(), tempfile.TemporaryDirectory(prefix="placer-ddp-") as tmp:
        job = _Job(
            model,
            inputs,
            batch_rows(batch, replicas),
            optimizer,
            steps,
            zero,
            bucket_bytes,
            backend,
            timeout_s,
            threads,
            batch,
            KernelChoice.here(),
            str(Path(tmp) / "result.pt"),
        )
        launch_ranks(_train, replicas, job, tmp, time.monotonic() + timeout_s * (steps + 3), timeout_s, method)
        return torch.load(job.result_path, weights_only=False)


def _train(rank: int, world: int, job: _Job, init_method: str) -> None:
    torch.set_num_threads(max(1, job.threads))
    job.kernel_choice.apply()
    device = torch.device("cuda", rank) if job.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        job.backend, init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=job.timeout_s)
    )
    try:
        model = copy.deepcopy(job.model).to(device)
        ddp = DistributedDataParallel(
            model, device_ids=[rank] if device.type == "cuda" else None, bucket_cap_mb=job.bucket_bytes / 2**20
        )
        settings = dict(job.optimizer.settings)
        if "foreach" in inspect.signature(job.optimizer.torch_class).parameters:
            settings["foreach"] = False
        if job.zero:
            optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=job.optimizer.torch_class, **settings)
        else:
            optimizer = job.optimizer.torch_class(ddp.parameters(), **settings)
        lo, hi = job.rows[rank]
        inputs = [
            x[lo:hi].to(device)
            if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == job.batch
            else (x.to(device) if isinstance(x, torch.Tensor) else x)
            for x in job.inputs
        ]
        share = (hi - lo) / job.batch
        step_s, losses = [], []
        for _ in range(job.steps):
            dist.barrier()
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = ddp(*inputs)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            step_s.append(time.perf_counter() - t0)
            weighted = (loss.detach() * share).reshape(1)
            dist.all_reduce(weighted)
            losses.append(float(weighted))
        if job.zero:
            optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            state = {name: t.detach().cpu() for name, t in model.state_dict().items()}
            torch.save(DDPResult(step_s, losses, state, _to_cpu(optimizer.state_dict())), job.result_path)
        dist.barrier()
        # DDP's reducer and ZeRO hold the process group: released while a gloo thread waits for the GIL
        # the group's teardown holds, they can hang the run. Let them go first.
        ddp = optimizer = model = None
    finally:
        dist.destroy_process_group()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
