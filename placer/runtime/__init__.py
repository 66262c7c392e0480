"""Run a plan: the captured training step executed across devices, in the plan's order.

* :func:`~placer.runtime.program.compile_program` binds a captured step's fx
  graph to a plan (device, order and transfers of every node);
* :class:`~placer.runtime.local.LocalExecutor` runs it in one process (CUDA
  streams and events per device where there are GPUs, the CPU otherwise);
* :func:`~placer.runtime.distributed.run_distributed` runs it with one process
  per device over ``torch.distributed`` (gloo on CPUs, NCCL on GPUs).
"""

from .local import LocalExecutor, default_devices
from .program import Program, Transfer, compile_program

__all__ = ["Program", "Transfer", "compile_program", "LocalExecutor", "default_devices"]
