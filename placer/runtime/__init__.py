"""Run a plan: the captured training step executed across devices, in the plan's order.

* :func:`~placer.runtime.program.compile_program` binds a captured step's fx
  graph to a plan: the device, issue order and transfers of every node, with
  OS-DPOS's splits made real (:mod:`placer.runtime.splits`);
* :class:`~placer.runtime.local.LocalExecutor` runs it in one process (CUDA
  streams and events per device where there are GPUs, the CPU otherwise);
* :func:`~placer.runtime.distributed.run_distributed` runs it with one process
  per device over ``torch.distributed`` (gloo on CPUs, NCCL on GPUs), started
  here or by ``torchrun`` (:func:`~placer.runtime.distributed.run_under_torchrun`);
* :class:`~placer.runtime.apply.PlacedStep` is what ``placer.apply(plan, model,
  optimizer)`` returns; :mod:`placer.harness.feedback` turns measured times
  into costs (FastT's loop, ``placer tune``).
"""

from .apply import PlacedStep
from .distributed import DistributedResult, RunError, run_distributed, run_under_torchrun
from .local import LocalExecutor, default_devices
from .program import Program, Transfer, compile_program

__all__ = [
    "Program",
    "Transfer",
    "compile_program",
    "LocalExecutor",
    "default_devices",
    "run_distributed",
    "run_under_torchrun",
    "DistributedResult",
    "RunError",
    "PlacedStep",
]
