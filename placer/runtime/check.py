"""Eager reference training and the comparison a placed run must pass."""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import OptionError

__all__ = [
    "exact_float32",
    "eager_optimizer",
    "train_eager",
    "train_accumulated",
    "state_difference",
    "StepTimes",
    "step_times",
    "refuse_random_ops",
]


@contextlib.contextmanager
def exact_float32():
    """Full float32 convolutions and matrix products (no TF32) inside the block, here and in ranks started there.

    Torch lets cuDNN convolutions use TF32 (a 10-bit mantissa) on Ampere and
    newer GPUs by default: two trainings whose values part in the last bit
    then drift apart by about 1e-3 within a few steps, far beyond what a
    comparison within 1e-6 can tell from a placement error.
    """
    from .distributed import float32_precision, set_float32_precision  # deferred: imports torch

    saved = float32_precision()
    set_float32_precision(("ieee", "ieee"))
    try:
        yield
    finally:
        set_float32_precision(saved)


def eager_optimizer(captured: Any, params) -> torch.optim.Optimizer:
    """The eager ``torch.optim`` optimizer a captured step reproduces, on its single-tensor path.

    On GPUs torch picks the multi-tensor (``foreach``) kernels by default, which
    round differently from the per-parameter update the step captures.
    """
    optimizer = captured.optimizer.eager(params)
    for group in optimizer.param_groups:
        if "foreach" in group:
            group["foreach"] = False
    return optimizer


def refuse_random_ops(captured: Any) -> None:
    """Refuse to verify a step that draws random numbers: it cannot equal eager training bit for bit.

    A placed step gives each random operation its own stream
    (:func:`placer.runtime.program.op_seed`), where eager training draws from
    torch's one global stream in its own order.

    Raises
    ------
    OptionError
        Naming the random operations (node and module).
    """
    from .program import random_nodes  # deferred: imports torch

    found = random_nodes(captured.gm)
    if not found:
        return
    layer = dict(zip(captured.graph.ids, captured.graph.layer))
    named = [
        f"{v.name!r} (aten.{v.target.overloadpacket.__name__}" + (f" in {layer[v.name]})" if layer.get(v.name) else ")")
        for v in found[:4]
    ]
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    raise OptionError(
        f"--verify cannot compare this step with eager training: it draws random numbers "
        f"({', '.join(named)}{more}), which a placed step draws from a stream per operation, not "
        f"from eager training's one stream; turn them off to verify (dropout probability 0), or run "
        f"without --verify"
    )


def train_eager(model: nn.Module, inputs: Sequence[Any], optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """Train ``steps`` plain eager steps (``zero_grad``, loss, ``backward``, ``step``); the losses."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*inputs)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def train_accumulated(
    model: nn.Module,
    inputs: Sequence[Any],
    optimizer: torch.optim.Optimizer,
    steps: int,
    rows: Sequence[Sequence[int]],
) -> list[float]:
    """Train ``steps`` eager steps by gradient accumulation over the micro-batches ``rows``; the losses.

    Each step runs the model on rows ``[lo, hi)`` of every input that leads
    with the batch, back-propagates that micro-batch's loss times its share of
    the batch, and updates once: what ``torch.distributed.pipelining``'s
    schedules compute, and what a micro-batched plan must equal
    (:mod:`placer.runtime.microbatches`). Batch norm normalises each
    micro-batch by its own statistics and updates its running statistics per
    micro-batch; an integer buffer (batch norm's ``num_batches_tracked``)
    advances once per step, as the placed step counts it.

    Examples
    --------
    >>> lin = nn.Linear(2, 1)
    >>> model = lambda x: lin(x).pow(2).mean()
    >>> x = torch.arange(6.0).view(3, 2)
    >>> loss = train_accumulated(model, [x], torch.optim.SGD(lin.parameters(), lr=0.0), 1, [(0, 2), (2, 3)])
    >>> round(loss[0], 5) == round(float(model(x).detach()), 5)
    True
    """
    total = rows[-1][1]
    buffers = [b for b in model.buffers() if not b.is_floating_point()] if isinstance(model, nn.Module) else []
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        counters = [b.clone() for b in buffers]
        loss = 0.0
        for lo, hi in rows:
            part = [
                x.narrow(0, lo, hi - lo) if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == total else x
                for x in inputs
            ]
            share = model(*part) * ((hi - lo) / total)
            share.backward()
            loss += float(share.detach())
        for b, before in zip(buffers, counters):
            b.copy_(before + (b - before) // len(rows))
        optimizer.step()
        losses.append(loss)
    return losses


def state_difference(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    reference: nn.Module,
    reference_optimizer: torch.optim.Optimizer | None,
    *,
    relative: bool = False,
) -> tuple[float, str, int]:
    """Largest absolute difference over parameters, buffers and optimizer state.

    With ``relative``, each tensor's largest difference is divided by its
    largest magnitude in the reference, or by 1 where that is smaller: two
    unstable steps can drive a running variance to 1e18, where the last bits
    of a correct computation are hundreds apart.

    Returns
    -------
    (float, str, int)
        The difference, the name of the tensor where it is largest, and how
        many tensors were compared. A shape mismatch, or state one side has
        and the other lacks, counts as an infinite difference; NaN where the other has NaN (the same
        infinity) counts as equal, NaN against a number as infinitely far.

    Examples
    --------
    >>> import torch
    >>> a, b = torch.nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    >>> with torch.no_grad():
    ...     _ = a.running_var.fill_(1e6), b.running_var.fill_(1e6 + 1)
    >>> state_difference(a, None, b, None)[:2]
    (1.0, 'running_var')
    >>> state_difference(a, None, b, None, relative=True)[0] < 1e-5
    True
    """
    worst, where, count = 0.0, "", 0
    pairs: list[tuple[str, Any, Any]] = []
    ours, theirs = model.state_dict(), reference.state_dict()
    pairs += [(name, ours.get(name), value) for name, value in theirs.items()]
    if reference_optimizer is not None:
        params = dict(model.named_parameters())
        for name, p in reference.named_parameters():
            state = reference_optimizer.state.get(p, {})
            mine = optimizer.state.get(params[name], {}) if optimizer is not None and name in params else {}
            # State eager training has not (an update of a parameter without a gradient) differs too.
            pairs += [(f"{name}:{key}", mine.get(key), state.get(key)) for key in {**state, **mine}]
    for name, a, b in pairs:
        count += 1
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            diff = float("inf")
        elif a.numel() == 0:
            diff = 0.0
        else:
            x, y = a.detach().double().cpu(), b.detach().double().cpu()
            gap = (x - y).abs()
            gap = torch.where((x == y) | (x.isnan() & y.isnan()), 0.0, gap)  # equal infinities, NaN and NaN
            diff = float(torch.nan_to_num(gap, nan=float("inf"), posinf=float("inf")).max())
            if relative:
                diff /= max(1.0, float(y.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).max()))
        if diff > worst or count == 1:
            worst, where = diff, name
    return worst, where, count


@dataclass
class StepTimes:
    """Measured step times, split into warm-up and the steps that count."""

    all_s: list[float]
    warmup: int

    @property
    def counted(self) -> list[float]:
        return self.all_s[self.warmup :] or self.all_s[-1:]

    @property
    def median_s(self) -> float:
        return float(statistics.median(self.counted))


def step_times(all_s: Sequence[float], warmup: int) -> StepTimes:
    """The steps after ``warmup`` (at least the last one) count."""
    return StepTimes(list(all_s), max(0, min(warmup, len(all_s) - 1)))
