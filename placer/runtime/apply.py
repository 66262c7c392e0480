"""``placer.apply(plan, model, optimizer)``: a training step of the live model, run as the plan says."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
from torch import nn

from ..capture.optim import spec_of
from ..cluster import Cluster, load_cluster
from ..errors import InvalidPlanError, OptionError
from ..plan import Plan
from .local import LocalExecutor
from .program import compile_program
from .replicas import replica_steps

__all__ = ["PlacedStep"]


def _changed(now, then) -> str:
    """What differs between two optimizer specs of one class but ``lr`` (an input of the step):
    ``momentum 0.9 (captured with 0)``, ..."""
    now_settings, then_settings = now.settings, then.settings
    return ", ".join(
        f"{key} {now_settings[key]!r} (captured with {then_settings[key]!r})"
        for key in now_settings
        if key != "lr" and now_settings[key] != then_settings[key]
    )


class PlacedStep:
    """A training step of ``model`` (and ``optimizer``) that runs as ``plan`` places it.

    Call it like the model, ``loss = step(*inputs)``: it runs forward, loss,
    backward and the optimizer update with every operation on its planned
    device, in the planned order, and leaves the new parameters, buffers and
    optimizer state in ``model`` and ``optimizer``, as ``loss.backward();
    optimizer.step()`` would (gradients are not kept: no ``zero_grad`` needed).

    The step is captured on the first call, from its inputs, and must be the
    graph the plan was made for (a plan made by :func:`placer.plan` from a
    module uses its own capture). Every call then checks that what the capture
    fixed still holds: the inputs' shapes, dtypes and non-tensor values, the
    optimizer's settings but ``lr`` and the parameters it holds, which
    parameters require grad, and every module's training/eval mode. Otherwise it
    raises :class:`~placer.errors.OptionError` saying what differs (apply the
    plan again for another optimizer setting; plan again for the rest). The
    learning rate is an input of the step, read from the optimizer at every
    call, so a ``torch.optim.lr_scheduler`` works as in eager training.

    Random operations (dropout) each draw from their own stream, seeded from a
    base seed drawn from torch's global generator on the first call:
    ``torch.manual_seed`` makes them repeatable, but they are not eager training's.

    Parameters
    ----------
    plan : Plan
    model : torch.nn.Module
        ``model(*inputs)`` returns the scalar loss.
    optimizer : torch.optim.Optimizer, optional
        SGD, Adam or AdamW with one parameter group, whose settings the step
        reproduces: ``lr``; SGD's ``momentum``, ``weight_decay``, ``nesterov``,
        ``maximize``; Adam's and AdamW's ``betas``, ``eps``, ``weight_decay``,
        ``maximize``. Refused, saying why: SGD's ``dampening`` with momentum,
        ``amsgrad``, ``foreach=True``, ``fused``, ``capturable``,
        ``differentiable``. Default: a fresh Adam with lr 1e-3, kept by the step.
    cluster : Cluster or str, optional
        Default: the cluster the plan was made for (its context, else its preset name).
    devices : sequence of str, optional
        Torch device of every plan device (see :class:`LocalExecutor`).
    profile : bool
        Time every operation (:attr:`executor` ``.op_s``).
    atomic : bool
        Write the new state only once the rest of the step has run without
        error, so that a step that raises changes nothing and can be called
        again (at the cost of up to one more copy of the state). Without it, a
        step that raises may have written part of the new state (the error says so).
    """

    def __init__(
        self,
        plan: Plan,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        cluster: Cluster | str | None = None,
        devices: Sequence[str] | None = None,
        profile: bool = False,
        atomic: bool = False,
    ):
        self.plan = plan
        self.model = model
        self.optimizer = optimizer
        self.spec = spec_of(optimizer)
        cluster = cluster if cluster is not None else plan.context.get("cluster")
        if cluster is None:
            if not plan.cluster_name:
                raise InvalidPlanError("the plan names no cluster; pass cluster=")
            cluster = plan.cluster_name
        self.cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
        self.devices = devices
        self.profile = profile
        self.atomic = atomic
        self.captured = None
        self.executor: LocalExecutor | None = None
        self._flat: list | None = None

    def __call__(self, *inputs: Any, **keywords: Any) -> torch.Tensor:
        if keywords:
            raise OptionError(
                f"a placed step takes its inputs by position, as the step was captured "
                f"(model(*inputs)); got keyword inputs {', '.join(map(repr, keywords))}"
            )
        spec = spec_of(self.optimizer)  # the settings may have changed since the last call
        if self.captured is not None and spec.fixed != self.spec.fixed:
            raise OptionError(
                f"the optimizer's settings changed since the step was captured: "
                f"{_changed(spec, self.spec)}; the step holds them as constants: apply the plan "
                f"again, placer.apply(plan, model, optimizer), for a step captured with the new settings"
            )
        if self.captured is None:
            self.spec = spec
            self._prepare(inputs)
        inputs = self.captured.checked_inputs(inputs)
        self.captured.check_modes(self.model)
        # step_inputs gives a parameter without optimizer state the fresh state of torch.optim's first
        # step: an atomic step that fails has not taken it.
        stateless = (
            []
            if self.optimizer is None or not self.atomic
            else [
                p for group in self.optimizer.param_groups for p in group["params"] if not self.optimizer.state.get(p)
            ]
        )
        try:
            if self.optimizer is not None or self._flat is None:
                self._flat = self.captured.step_inputs(self.model, inputs, self.optimizer)
            else:
                self.captured.check_trainable(self.model)
                self._flat = self.captured.with_inputs(self._flat, inputs)
            outputs = self.executor.run(self._flat)
        except BaseException:
            for p in stateless:
                self.optimizer.state.pop(p, None)
            raise
        if self.optimizer is not None:
            # What torch.optim's step does for a scheduler, whose first step otherwise warns that
            # optimizer.step() was not called.
            self.optimizer._opt_called = True
        return outputs[0]

    def _prepare(self, inputs: tuple) -> None:
        from ..capture import capture  # deferred: imports torch

        captured = self.plan.context.get("captured")
        this = self.spec.describe() if self.optimizer is not None else f"the default {self.spec.describe()}"
        if captured is not None and captured.optimizer.name != self.spec.name:
            raise OptionError(
                f"the plan was made for a training step with {captured.optimizer.torch_class.__name__}, "
                f"but the optimizer is {this}: its update is part of the placed step; plan again "
                f"with optimizer={self.spec.name!r}"
            )
        planned = captured
        if captured is not None and captured.optimizer.fixed != self.spec.fixed:
            # planned with other settings: capture this one (another graph where they add operations or
            # state, momentum or weight decay: refused below by its digest)
            captured = None
        elif captured is not None and captured.optimizer.hyper["lr"] != self.spec.hyper["lr"]:
            # the same step; its default lr (the one it runs with without an optimizer) is this one's
            captured = dataclasses.replace(captured, optimizer=self.spec)
        if captured is None:
            settings = {k: v for k, v in self.spec.settings.items() if k != "lr"}
            captured = capture(
                self.model,
                inputs,
                optimizer=self.spec.name,
                lr=self.spec.hyper["lr"],
                name=self.plan.graph_name or None,
                settings=settings,
            )
            if self.plan.graph_digest and self.plan.graph_digest != captured.graph.digest():
                if planned is not None and planned.graph.digest() == self.plan.graph_digest:
                    raise InvalidPlanError(
                        f"the plan was made for a training step with {planned.optimizer.describe()}, but the "
                        f"optimizer is {this}: {_changed(self.spec, planned.optimizer)} change the step's "
                        f"operations or state (momentum buffers, weight decay), so the plan does not fit it; "
                        f"plan again with these settings"
                    )
                raise InvalidPlanError(
                    f"the plan was made for another training step (digest {self.plan.graph_digest}) than this "
                    f"model's with these inputs and {this} (digest {captured.graph.digest()}): another model, "
                    f"batch size or optimizer needs its own plan"
                )
        program = compile_program(
            captured.gm,
            captured.graph,
            self.plan,
            self.cluster,
            carrier=captured.carrier,
            replica_steps=replica_steps(captured, self.plan),
        )
        self.executor = LocalExecutor(program, self.devices, profile=self.profile, atomic=self.atomic)
        self.captured = captured
