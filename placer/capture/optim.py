"""The optimizers a captured training step ends with, as torch's own functional updates.

Each optimizer is applied one parameter at a time through the functional form that
``torch.optim`` itself runs (``torch.optim.adam.adam``, ``torch.optim.sgd.sgd``) with
``foreach=False``: the single-tensor path eager PyTorch takes for CPU tensors, so a
captured step reproduces ``torch.optim`` bit for bit. Hyper-parameters are torch's
defaults for the class, except ``lr``.

torch is imported on first use, not with this module, so that the command line can
offer :data:`OPTIMIZERS` as the choices of ``--optimizer`` without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import OptionError

if TYPE_CHECKING:
    import torch

__all__ = ["OPTIMIZERS", "OptimizerSpec", "optimizer_spec"]


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer of the training step.

    Attributes
    ----------
    name : str
        ``"sgd"``, ``"adam"`` or ``"adamw"``.
    torch_class : type
        The ``torch.optim`` class whose eager behaviour the captured step reproduces.
    state_names : tuple of str
        Per-parameter state, in the order of ``torch.optim``'s state dict
        (``("step", "exp_avg", "exp_avg_sq")`` for Adam; none for plain SGD).
    hyper : dict
        The class's defaults with ``lr`` set.
    """

    name: str
    torch_class: type
    state_names: tuple[str, ...]
    hyper: dict = field(default_factory=dict)
    _update: Callable[..., None] | None = None

    def eager(self, params) -> torch.optim.Optimizer:
        """The eager ``torch.optim`` optimizer this step reproduces, over ``params``."""
        return self.torch_class(params, lr=self.hyper["lr"])

    def initial_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh state for ``param``, as ``torch.optim`` creates it on its first step."""
        import torch

        if not self.state_names:
            return {}
        step = torch.zeros((), dtype=torch.float32, device=param.device)
        return {"step": step,
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}

    def update(self, param: torch.Tensor, grad: torch.Tensor, state: Sequence[torch.Tensor]) -> None:
        """Update ``param`` and ``state`` (its tensors in :attr:`state_names` order) in place from ``grad``."""
        self._update(self.hyper, param, grad, dict(zip(self.state_names, state)))


def _adam_update(hyper: dict, param, grad, state) -> None:
    from torch.optim.adam import adam as _functional_adam

    beta1, beta2 = hyper["betas"]
    _functional_adam(
        [param], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
        foreach=False, capturable=False, differentiable=False, fused=None,
        has_complex=param.is_complex(),
        decoupled_weight_decay=hyper.get("decoupled_weight_decay", False),
        amsgrad=False, beta1=beta1, beta2=beta2, lr=hyper["lr"],
        weight_decay=hyper["weight_decay"], eps=hyper["eps"], maximize=hyper["maximize"])


def _sgd_update(hyper: dict, param, grad, state) -> None:
    from torch.optim.sgd import sgd as _functional_sgd

    _functional_sgd(
        [param], [grad], [None], foreach=False, fused=None,
        weight_decay=hyper["weight_decay"], momentum=0.0, lr=hyper["lr"],
        dampening=hyper["dampening"], nesterov=False, maximize=hyper["maximize"])


# Name -> (the torch.optim class's name, its per-parameter state, the update).
_TABLE: dict[str, tuple[str, tuple[str, ...], Callable[..., None]]] = {
    "sgd": ("SGD", (), _sgd_update),
    "adam": ("Adam", ("step", "exp_avg", "exp_avg_sq"), _adam_update),
    "adamw": ("AdamW", ("step", "exp_avg", "exp_avg_sq"), _adam_update),
}

#: Names accepted by :func:`optimizer_spec`.
OPTIMIZERS: tuple[str, ...] = tuple(_TABLE)

# Defaults a captured step does not reproduce (they change the state or the update path).
_UNSUPPORTED = {"amsgrad": False, "momentum": 0, "nesterov": False, "foreach": None, "fused": None,
                "capturable": False, "differentiable": False}


def optimizer_spec(name: str, lr: float = 1e-3) -> OptimizerSpec:
    """The optimizer called ``name`` with learning rate ``lr`` and torch's other defaults.

    Raises
    ------
    OptionError
        If ``name`` is not one of :data:`OPTIMIZERS` or ``lr`` is not a positive number.
    """
    if not isinstance(name, str) or name.lower() not in _TABLE:
        raise OptionError(f"optimizer {name!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or lr != lr or lr == float("inf"):
        raise OptionError(f"lr must be a positive finite number, got {lr!r}")
    import torch

    class_name, state_names, update = _TABLE[name.lower()]
    torch_class = getattr(torch.optim, class_name)
    hyper: dict[str, Any] = dict(torch_class([torch.zeros(1)], lr=float(lr)).defaults)
    for key, required in _UNSUPPORTED.items():
        if key in hyper and hyper[key] != required and hyper[key] is not None:
            raise OptionError(f"optimizer {name!r}: default {key}={hyper[key]!r} is not supported by capture")
    return OptimizerSpec(name.lower(), torch_class, state_names, hyper, update)
