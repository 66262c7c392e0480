"""The optimizers a captured training step ends with, as torch's own functional updates.

Each optimizer is applied one parameter at a time through the functional
form ``torch.optim`` itself runs (``torch.optim.adam.adam``,
``torch.optim.sgd.sgd``) with ``foreach=False``, the single-tensor path
eager PyTorch takes for CPU tensors, so a captured step reproduces
``torch.optim`` bit for bit. The learning rate is an input of the update
(:meth:`OptimizerSpec.update`), so that a scheduler may change it between
steps. Hyper-parameters are torch's defaults for the class, except ``lr``
and the :data:`SETTINGS` given.

SGD with momentum keeps a ``momentum_buffer`` per parameter. Torch's first
step sets it to a copy of the gradient, later steps to
``momentum * buf + (1 - dampening) * grad``; a captured step is one graph for
every step, so it starts the buffer at zeros and always takes the second
form, which equals the first on the first step when ``dampening`` is 0 (but
for the sign of a zero). Another ``dampening`` with momentum is therefore
refused, and so are ``amsgrad`` (another state tensor) and the settings that
change the kernels (``foreach=True``, ``fused``, ``capturable``,
``differentiable``).

torch is imported on first use, so that the command line can offer
:data:`OPTIMIZERS` as choices without loading it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import OptionError

if TYPE_CHECKING:
    import torch

__all__ = ["OPTIMIZERS", "SETTINGS", "OptimizerSpec", "optimizer_spec", "spec_of"]


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
        (``("step", "exp_avg", "exp_avg_sq")`` for Adam; ``("momentum_buffer",)`` for SGD
        with momentum; none for plain SGD).
    hyper : dict
        The class's defaults with ``lr`` and the settings given.
    """

    name: str
    torch_class: type
    state_names: tuple[str, ...]
    hyper: dict = field(default_factory=dict)
    _update: Callable[..., None] | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """``lr`` and the :data:`SETTINGS` of this optimizer, as its constructor takes them."""
        return {"lr": self.hyper["lr"], **{key: self.hyper[key] for key in SETTINGS[self.name]}}

    @property
    def fixed(self) -> dict:
        """:attr:`hyper` but ``lr``: what a captured step holds as constants (``lr`` is an input of it)."""
        return {key: value for key, value in self.hyper.items() if key != "lr"}

    def describe(self) -> str:
        """``SGD (lr 0.1, momentum 0.9)``: the class, ``lr`` and the settings other than torch's defaults."""
        defaults = _defaults(self.torch_class)
        other = [
            f"{key} {_shown(value)}" for key, value in self.settings.items() if key != "lr" and value != defaults[key]
        ]
        lr = f"lr {self.hyper['lr']:g}"
        return f"{self.torch_class.__name__} ({', '.join([lr, *other])})"

    @property
    def label(self) -> str:
        """The optimizer's part of a step's name: its name, then each setting other than torch's default
        (``sgd-momentum0.9-nesterov``, ``adam-betas0.8_0.99``). ``lr`` is left out: it changes no
        operation of the step, the other settings may (a momentum buffer, a weight decay)."""
        defaults = _defaults(self.torch_class)
        parts = [self.name]
        for key, value in self.settings.items():
            if key == "lr" or value == defaults[key]:
                continue
            if isinstance(value, bool):
                parts.append(key if value else f"no_{key}")
            elif isinstance(value, tuple):
                parts.append(key + "_".join(f"{v:g}" for v in value))
            else:
                parts.append(f"{key}{value:g}")
        return "-".join(parts)

    def eager(self, params) -> torch.optim.Optimizer:
        """The eager ``torch.optim`` optimizer this step reproduces, over ``params``."""
        return self.torch_class(params, **self.settings)

    def initial_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """Fresh state for ``param``, as ``torch.optim`` creates it on its first step (SGD's momentum
        buffer at zeros: see the module's docstring)."""
        import torch  # deferred: imports torch

        state = {}
        if "step" in self.state_names:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        for name in self.state_names:
            if name != "step":
                state[name] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    def update(self, param: torch.Tensor, grad: torch.Tensor, lr: float, state: Sequence[torch.Tensor]) -> None:
        """Update ``param`` and ``state`` (its tensors in :attr:`state_names` order) in place from ``grad``
        with learning rate ``lr`` (not :attr:`hyper`'s): in a trace, the symbolic ``.item()`` of the
        step's learning-rate input, so that the rate is an input of the step rather than a constant."""
        self._update({**self.hyper, "lr": lr}, param, grad, dict(zip(self.state_names, state)))


def _adam_update(hyper: dict, param, grad, state) -> None:
    import torch  # deferred: imports torch
    from torch.optim.adam import adam as _functional_adam  # deferred: imports torch

    beta1, beta2 = hyper["betas"]
    lr, weight_decay = hyper["lr"], hyper["weight_decay"]
    if hyper.get("decoupled_weight_decay", False) and weight_decay != 0 and param.is_complex():
        # torch's own param.mul_(1 - lr * weight_decay), first thing in its update: a trace cannot turn a
        # symbolic lr into the complex number this multiplication takes (it would read its value), but it
        # can multiply by a 0-dim float64 tensor of it, which promotes and multiplies alike.
        param.mul_(torch.scalar_tensor(1 - lr * weight_decay, dtype=torch.float64, device=param.device))
        weight_decay = 0.0
    _functional_adam(
        [param],
        [grad],
        [state["exp_avg"]],
        [state["exp_avg_sq"]],
        [],
        [state["step"]],
        foreach=False,
        capturable=False,
        differentiable=False,
        fused=None,
        has_complex=param.is_complex(),
        decoupled_weight_decay=hyper.get("decoupled_weight_decay", False),
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=lr,
        weight_decay=weight_decay,
        eps=hyper["eps"],
        maximize=hyper["maximize"],
    )


def _sgd_update(hyper: dict, param, grad, state) -> None:
    from torch.optim.sgd import sgd as _functional_sgd  # deferred: imports torch

    # The buffer is never None: torch's first step (a copy of the gradient) is momentum * 0 + grad here.
    _functional_sgd(
        [param],
        [grad],
        [state.get("momentum_buffer")],
        foreach=False,
        fused=None,
        weight_decay=hyper["weight_decay"],
        momentum=hyper["momentum"],
        lr=hyper["lr"],
        dampening=hyper["dampening"],
        nesterov=hyper["nesterov"],
        maximize=hyper["maximize"],
    )


# Name -> (the torch.optim class's name, its per-parameter state, the update).
_TABLE: dict[str, tuple[str, tuple[str, ...], Callable[..., None]]] = {
    "sgd": ("SGD", (), _sgd_update),
    "adam": ("Adam", ("step", "exp_avg", "exp_avg_sq"), _adam_update),
    "adamw": ("AdamW", ("step", "exp_avg", "exp_avg_sq"), _adam_update),
}

#: Names accepted by :func:`optimizer_spec`.
OPTIMIZERS: tuple[str, ...] = tuple(_TABLE)

#: The settings besides ``lr`` that :func:`optimizer_spec` takes, per optimizer (keyword arguments of its
#: ``torch.optim`` class).
SETTINGS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "adam": ("betas", "eps", "weight_decay", "maximize", "decoupled_weight_decay"),
    "adamw": ("betas", "eps", "weight_decay", "maximize"),
}

# Settings of a torch.optim optimizer a captured step does not reproduce -> the values it does (the
# single-tensor path; amsgrad's extra state and maximum are not captured).
_FIXED = {
    "amsgrad": (False,),
    "foreach": (None, False),
    "fused": (None, False),
    "capturable": (False,),
    "differentiable": (False,),
}

_WHY = {
    "amsgrad": "its running maximum is not captured",
    "foreach": "the multi-tensor kernels round differently from the per-parameter update captured",
    "fused": "the fused kernels round differently from the per-parameter update captured",
    "capturable": "the captured update is the one for tensors on the host's control",
    "differentiable": "the captured update is not differentiated",
}


def _defaults(torch_class: type) -> dict[str, Any]:
    import torch  # deferred: imports torch

    return dict(torch_class([torch.zeros(1)]).defaults)


def _shown(value: Any) -> str:
    return repr(tuple(value)) if isinstance(value, (tuple, list)) else f"{value!r}"


def _number(name: str, key: str, value: Any, *, low: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float in ``[low, below)`` (``[low, inf)``), else an OptionError naming ``key``."""
    plain = not isinstance(value, bool) and isinstance(value, (int, float))
    if not plain or not math.isfinite(value) or value < low or (below is not None and value >= below):
        where = f"in [{low:g}, {below:g})" if below is not None else f">= {low:g}"
        raise OptionError(f"optimizer {name!r}: {key} must be a finite number {where}, got {value!r}")
    return float(value)


def _flag(name: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"optimizer {name!r}: {key} must be True or False, got {value!r}")
    return value


def _checked(name: str, key: str, value: Any) -> Any:
    """One setting, validated and normalised (floats, a tuple of betas)."""
    if key in ("momentum", "dampening", "weight_decay", "eps"):
        return _number(name, key, value)
    if key == "betas":
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise OptionError(f"optimizer {name!r}: betas must be a pair of numbers in [0, 1), got {value!r}")
        return tuple(_number(name, f"betas[{k}]", v, below=1.0) for k, v in enumerate(value))
    return _flag(name, key, value)


def optimizer_spec(name: str, lr: float = 1e-3, **settings: Any) -> OptimizerSpec:
    """The optimizer called ``name`` with learning rate ``lr``, the ``settings`` given and torch's other defaults.

    Parameters
    ----------
    name : str
        One of :data:`OPTIMIZERS`.
    lr : float
    **settings
        Keyword arguments of the ``torch.optim`` class among :data:`SETTINGS` ``[name]``:
        ``optimizer_spec("sgd", 0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)``.

    Raises
    ------
    OptionError
        If ``name`` is not one of :data:`OPTIMIZERS`, ``lr`` is not a finite number >= 0, a setting
        is unknown or out of range (naming it), or a capture cannot reproduce it (``dampening``
        with momentum, ``amsgrad``, ``foreach``, ...; saying why).

    Examples
    --------
    >>> optimizer_spec("sgd", 0.1, momentum=0.9).state_names
    ('momentum_buffer',)
    >>> optimizer_spec("adam", betas=(0.8, 0.99)).describe()
    'Adam (lr 0.001, betas (0.8, 0.99))'
    """
    if not isinstance(name, str):
        raise OptionError(
            f"optimizer must be a name, one of {', '.join(OPTIMIZERS)} (its settings in "
            f"settings=...), not a {type(name).__module__}.{type(name).__qualname__} object"
        )
    if name.lower() not in _TABLE:
        raise OptionError(f"optimizer {name!r} is not supported; choose one of {', '.join(OPTIMIZERS)}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < float("inf"):
        # 0, as torch.optim takes it: a warm-up schedule may start there
        raise OptionError(f"lr must be a finite number >= 0, got {lr!r}")
    import torch  # deferred: imports torch

    name = name.lower()
    class_name, state_names, update = _TABLE[name]
    torch_class = getattr(torch.optim, class_name)
    hyper: dict[str, Any] = _defaults(torch_class)
    hyper["lr"] = float(lr)
    for key, value in settings.items():
        if key in _FIXED and key in hyper:
            if value not in _FIXED[key] or value is None and None not in _FIXED[key]:
                raise OptionError(
                    f"optimizer {name!r}: {key}={value!r} is not supported by capture "
                    f"({_WHY[key]}); leave it at {_FIXED[key][-1]!r}"
                )
            continue
        if key not in SETTINGS[name]:
            known = ", ".join(("lr", *SETTINGS[name]))
            raise OptionError(f"optimizer {name!r} has no setting {key!r} a captured step takes; it takes {known}")
        hyper[key] = _checked(name, key, value)
    if name == "sgd":
        if hyper["nesterov"] and (hyper["momentum"] <= 0 or hyper["dampening"] != 0):
            raise OptionError(
                f"optimizer 'sgd': nesterov=True needs momentum > 0 and dampening 0, got momentum "
                f"{hyper['momentum']:g} and dampening {hyper['dampening']:g}"
            )
        if hyper["momentum"] != 0 and hyper["dampening"] != 0:
            raise OptionError(
                f"optimizer 'sgd': dampening={hyper['dampening']:g} with momentum is not supported "
                f"by capture (torch's first step copies the gradient into the momentum buffer, "
                f"undampened, and a captured step is one graph for every step); leave dampening at 0"
            )
        if hyper["momentum"] != 0:
            state_names = ("momentum_buffer",)
    try:  # whatever else torch refuses, as it says it
        torch_class([torch.zeros(1)], **{k: hyper[k] for k in ("lr", *SETTINGS[name])})
    except (ValueError, TypeError) as exc:
        raise OptionError(f"optimizer {name!r}: {exc}") from None
    return OptimizerSpec(name, torch_class, state_names, hyper, update)


def spec_of(optimizer: torch.optim.Optimizer | None) -> OptimizerSpec:
    """The spec of a live ``torch.optim`` optimizer: its class and its one parameter group's settings.

    ``None`` gives the default Adam (lr 1e-3).

    Raises
    ------
    OptionError
        Another optimizer class, several parameter groups, or a setting a captured step does
        not reproduce (naming it and saying why).
    """
    if optimizer is None:
        return optimizer_spec("adam")
    import torch  # deferred: imports torch

    name = next((n for n in OPTIMIZERS if type(optimizer) is getattr(torch.optim, _TABLE[n][0])), None)
    if name is None:
        raise OptionError(
            f"optimizer {type(optimizer).__name__} is not supported; use one of "
            f"{', '.join(_TABLE[n][0] for n in OPTIMIZERS)}"
        )
    if len(optimizer.param_groups) != 1:
        raise OptionError(
            f"the optimizer has {len(optimizer.param_groups)} parameter groups; a placed step supports one"
        )
    group = optimizer.param_groups[0]
    lr = group["lr"]
    if isinstance(lr, torch.Tensor):
        raise OptionError(f"the optimizer's lr is a tensor ({lr!r}); a placed step takes it as a number")
    given = {key: group[key] for key in (*SETTINGS[name], *_FIXED) if key in group}
    return optimizer_spec(name, lr, **given)
