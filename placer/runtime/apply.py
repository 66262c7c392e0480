"""``plan.apply(model, optimizer)``: a training step of the live model, run as the plan says."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ..cluster import Cluster, load_cluster
from ..errors import InvalidPlanError, OptionError
from ..plan import Plan
from .local import LocalExecutor
from .program import compile_program

__all__ = ["PlacedStep", "optimizer_name"]


def optimizer_name(optimizer: torch.optim.Optimizer | None) -> tuple[str, float]:
    """The capture name and learning rate of a ``torch.optim`` optimizer whose settings capture reproduces.

    Raises
    ------
    OptionError
        Another optimizer class, several parameter groups, or a setting other
        than torch's default (except ``lr``).
    """
    from ..capture.optim import OPTIMIZERS, optimizer_spec

    if optimizer is None:
        return "adam", 1e-3
    if len(optimizer.param_groups) != 1:
        raise OptionError(f"the optimizer has {len(optimizer.param_groups)} parameter groups; a placed step "
                          f"supports one")
    group = optimizer.param_groups[0]
    for name in OPTIMIZERS:
        spec = optimizer_spec(name, group["lr"])
        if type(optimizer) is spec.torch_class:
            for key, value in spec.hyper.items():
                if key in group and group[key] != value:
                    raise OptionError(f"optimizer setting {key}={group[key]!r} differs from torch's default "
                                      f"{value!r}; a placed step reproduces the defaults (except lr)")
            return name, float(group["lr"])
    raise OptionError(f"optimizer {type(optimizer).__name__} is not supported; use one of "
                      f"{', '.join(optimizer_spec(n).torch_class.__name__ for n in OPTIMIZERS)}")


class PlacedStep:
    """A training step of ``model`` (and ``optimizer``) that runs as ``plan`` places it.

    Call it like the model, ``loss = step(*inputs)``: it runs forward, loss,
    backward and the optimizer update with every operation on its planned
    device, in the planned order, and leaves the new parameters, buffers and
    optimizer state in ``model`` and ``optimizer``, as ``loss.backward();
    optimizer.step()`` would (no ``zero_grad`` needed: gradients are not kept).

    The step is captured on the first call, from that call's inputs, and must
    be the graph the plan was made for (same node ids and edges).

    Parameters
    ----------
    plan : Plan
    model : torch.nn.Module
        ``model(*inputs)`` returns the scalar loss.
    optimizer : torch.optim.Optimizer, optional
        SGD, Adam or AdamW with torch's defaults except ``lr`` (default: a
        fresh Adam state with lr 1e-3, kept by the step).
    cluster : Cluster or str, optional
        Default: the cluster the plan was made for (its context, else its preset name).
    devices : sequence of str, optional
        Torch device of every plan device (see :class:`LocalExecutor`).
    profile : bool
        Time every operation (:attr:`executor` ``.op_s``).
    """

    def __init__(self, plan: Plan, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 cluster: Cluster | str | None = None, devices: Sequence[str] | None = None,
                 profile: bool = False):
        self.plan = plan
        self.model = model
        self.optimizer = optimizer
        self.optimizer_name, self.lr = optimizer_name(optimizer)
        cluster = cluster if cluster is not None else plan.context.get("cluster")
        if cluster is None:
            if not plan.cluster_name:
                raise InvalidPlanError("the plan names no cluster; pass cluster=")
            cluster = plan.cluster_name
        self.cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
        self.devices = devices
        self.profile = profile
        self.captured = None
        self.executor: LocalExecutor | None = None
        self._flat: list | None = None

    def __call__(self, *inputs: Any) -> torch.Tensor:
        if self.captured is None:
            self._prepare(inputs)
        if self.optimizer is not None or self._flat is None:
            self._flat = self.captured.step_inputs(self.model, inputs, self.optimizer)
        else:
            self._flat = self.captured.with_inputs(self._flat, inputs)
        outputs = self.executor.run(self._flat)
        return outputs[0]

    def _prepare(self, inputs: tuple) -> None:
        from ..capture import capture

        captured = self.plan.context.get("captured")
        if captured is not None and (captured.optimizer.name != self.optimizer_name
                                     or captured.optimizer.hyper.get("lr") != self.lr):
            captured = None      # planned with another optimizer: capture this one
        if captured is None:
            captured = capture(self.model, inputs, optimizer=self.optimizer_name, lr=self.lr,
                               name=self.plan.graph_name or None)
        program = compile_program(captured.gm, captured.graph, self.plan, self.cluster, carrier=captured.carrier)
        self.executor = LocalExecutor(program, self.devices, profile=self.profile)
        self.captured = captured
