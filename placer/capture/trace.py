"""Capture one whole training step of a PyTorch model as an aten-level graph.

The step is a pure function of flat tensors::

    step(*params, *buffers, *optimizer_state, lr, *inputs) -> loss

running ``torch.func.functional_call`` of the model under
``torch.func.grad_and_value``, then torch's functional optimizer one
parameter at a time. The learning rate ``lr`` (a 0-dim float64 tensor) is an
input, not a constant, so that a scheduler may change it between steps.
``make_fx`` traces it under ``torch.func.functionalize(remove="mutations")``
with fake tensors: nothing is computed or allocated, so a model built on the
meta device of any size captures quickly. The updates of parameters, buffers
and optimizer state come out as in-place ``copy_`` nodes into the
placeholders at the end of the graph, so running the graph module on live
tensors trains the model exactly as eager PyTorch and ``torch.optim`` would.
"""

from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Sequence
from unittest.mock import patch

import torch
import torch.fx as fx
import torch.fx.config
import torch.fx.traceback as fx_traceback
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from ..cost.analytic import LR_PLACEHOLDER, annotate
from ..errors import FormatError, OptionError
from ..graph import OpGraph
from ..io import shown
from .build import build_graph
from .layout import dense_layout
from .optim import OptimizerSpec, optimizer_spec
from .updates import UpdateTemplates

__all__ = ["CapturedStep", "StepLayout", "capture", "step_name", "portable_kernels"]


@dataclass(frozen=True)
class StepLayout:
    """The order of the flat arguments of a captured step.

    ``params`` (the trainable ``model.named_parameters()``, a tied parameter once,
    under its first name), then ``buffers`` (frozen parameters, ``requires_grad=False``, and
    the trainable ones the loss does not depend on, ``unreached``, then
    ``model.named_buffers()``: inputs the optimizer does not update), then for each name of
    ``state_names`` one tensor per parameter (state-major: all ``step``, then all
    ``exp_avg``, ...), then the learning rate (a 0-dim float64 tensor, at :attr:`lr_offset`: the step
    reads it and never writes it), then the tensors among the example ``inputs`` in order
    (``input_slots`` gives their positions; the other inputs are constants of the step).
    """

    params: tuple[str, ...]
    buffers: tuple[str, ...]
    state_names: tuple[str, ...]
    input_slots: tuple[int, ...]
    num_inputs: int
    unreached: tuple[str, ...] = ()

    @property
    def num_flat(self) -> int:
        return self.input_offset + len(self.input_slots)

    def state_offset(self, state_name: str) -> int:
        k = self.state_names.index(state_name)
        return len(self.params) + len(self.buffers) + k * len(self.params)

    @property
    def lr_offset(self) -> int:
        """The position of the learning rate, after the optimizer state."""
        return len(self.params) * (1 + len(self.state_names)) + len(self.buffers)

    @property
    def input_offset(self) -> int:
        return self.lr_offset + 1


@dataclass
class CapturedStep:
    """One captured training step: its graph, its executable fx module, and its layout.

    Attributes
    ----------
    graph : OpGraph
        Node ids are the names of :attr:`gm`'s fx nodes, every one but the output
        (:mod:`placer.capture.build`).
    gm : torch.fx.GraphModule
        The pure step. Call ``gm(*flat)`` with ``flat = step.step_inputs(model, inputs,
        optimizer)``: it returns the loss (a 0-d tensor) and updates every parameter,
        buffer and optimizer-state tensor of ``flat`` in place (the ``copy_`` nodes at the
        end, and ``native_batch_norm`` on running statistics). Nothing else is returned.
    layout : StepLayout
        The order of the flat arguments (placeholders named ``p_*``, ``b_*``,
        ``s_<state>_*``, ``lr``, ``input_<k>``).
    optimizer : OptimizerSpec
        The optimizer and its hyper-parameters (torch's defaults, with ``lr`` and the settings given;
        ``lr`` is only the default of the step's learning-rate input).
    carrier : dict
        fx node name -> graph node id that carries it (itself, for a captured step; a
        split operation's parts carry theirs); a runtime runs a node where its carrier is placed.
    batch_size : int or None
        The leading dimension of the first tensor input.
    capture_s : float
        Wall-clock seconds the capture took.
    fake : bool
        True when the model was not read for values (meta or fake capture); such a step
        has a valid graph but cannot be fed from the model.
    constants : dict
        Input position -> the non-tensor input baked into the step.
    source : tuple or None
        ``(model, inputs)`` the step was captured from, for :meth:`example_args` (a real
        capture's) and :meth:`at_batch`.
    modes : dict
        Module name (``""`` for the model) -> whether it was in training mode at
        capture: the step is traced in those modes (dropout on or off, batch
        norm's batch or running statistics).
    """

    graph: OpGraph
    gm: fx.GraphModule
    layout: StepLayout
    optimizer: OptimizerSpec
    carrier: dict[str, str]
    batch_size: int | None
    capture_s: float
    fake: bool
    constants: dict[int, Any] = field(default_factory=dict)
    source: tuple[nn.Module, tuple] | None = field(default=None, repr=False)
    modes: dict[str, bool] = field(default_factory=dict, repr=False)
    _replica_modules: dict[int, fx.GraphModule] = field(default_factory=dict, repr=False, compare=False)

    # ----------------------------------------------------------------- execution
    def step_inputs(
        self, model: nn.Module, inputs: Sequence[Any], optimizer: torch.optim.Optimizer | None = None
    ) -> list[torch.Tensor]:
        """The flat arguments of :attr:`gm`, sharing storage with ``model`` and ``optimizer``.

        Parameters are passed as ``p.detach()``, buffers as themselves, optimizer
        state as the tensors in ``optimizer.state[p]`` (created as ``torch.optim``
        does on its first step when missing) and the learning rate as a new 0-dim
        float64 tensor of the parameter group's current ``lr``, so ``gm(*flat)``
        trains ``model`` and ``optimizer`` in place. Without ``optimizer``, fresh
        state is created and the learning rate is :attr:`optimizer`'s; pass the
        returned list to ``gm`` again for the next step (its inputs replaced by
        :meth:`with_inputs`).

        Raises
        ------
        OptionError
            If the model's parameters or buffers are not those captured (:meth:`check_trainable`
            included), the optimizer is of another class or has several parameter groups with
            other settings, or its ``lr`` is not a number.
        """
        self.check_trainable(model, optimizer)
        tensors = self._live_tensors(model)
        params = dict(model.named_parameters())
        flat: list[torch.Tensor] = [tensors[n] for n in (*self.layout.params, *self.layout.buffers)]
        states = [self._state_of(params[n], optimizer) for n in self.layout.params]
        for state_name in self.layout.state_names:
            flat += [s[state_name] for s in states]
        flat.append(torch.tensor(self._lr_of(optimizer), dtype=torch.float64))
        return self.with_inputs(flat, inputs)

    def _lr_of(self, optimizer: torch.optim.Optimizer | None) -> float:
        """The learning rate of this step: ``optimizer``'s as it is now, else the capture's."""
        if optimizer is None:
            return self.optimizer.hyper["lr"]
        lr = optimizer.param_groups[0]["lr"]
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            raise OptionError(f"the optimizer's lr is {lr!r}; a captured step takes it as a Python number")
        return float(lr)

    def _live_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        tensors = {name: p.detach() for name, p in model.named_parameters()}
        tensors.update(model.named_buffers())
        missing = [n for n in (*self.layout.params, *self.layout.buffers) if n not in tensors]
        if missing:
            raise OptionError(f"the model has no parameter or buffer {missing[0]!r} of the captured step")
        meta = [n for n in (*self.layout.params, *self.layout.buffers) if tensors[n].is_meta]
        if meta:
            raise OptionError(f"the model's {meta[0]!r} is on the meta device: build it for real to run the step")
        return tensors

    def with_inputs(self, flat: list[torch.Tensor], inputs: Sequence[Any]) -> list[torch.Tensor]:
        """``flat`` with its input tensors replaced by those of ``inputs`` (a new batch)."""
        inputs = _as_tuple(inputs)
        if len(inputs) != self.layout.num_inputs:
            raise OptionError(f"the step was captured with {self.layout.num_inputs} inputs, got {len(inputs)}")
        return list(flat[: self.layout.input_offset]) + [inputs[k] for k in self.layout.input_slots]

    @cached_property
    def _input_specs(self) -> list:
        """The traced value of every input of the step (a fake tensor, or a constant's value)."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"][self.layout.input_offset :]
        return [n.meta.get("val") for n in placeholders]

    def checked_inputs(self, inputs: Any) -> tuple:
        """``inputs`` if they are what the step was captured for, else an :class:`OptionError` saying what differs.

        The captured step bakes in every input's shape and dtype (``x.shape[0]``
        in the model becomes a number) and every non-tensor input's value: a
        call with another batch size or another setting would run silently
        wrong, or fail half-way. A tensor whose strides alone differ is copied
        into the captured layout.
        """
        inputs = _as_tuple(inputs)
        if len(inputs) != self.layout.num_inputs:
            raise OptionError(f"the step was captured with {self.layout.num_inputs} inputs, got {len(inputs)}")
        specs = self._input_specs
        out = list(inputs)
        replan = "; the captured step holds it fixed: plan (capture) again for these inputs"
        for slot, val in zip(self.layout.input_slots, specs):
            x = inputs[slot]
            if not isinstance(val, torch.Tensor):
                continue
            want = f"a {val.dtype} tensor of shape {tuple(val.shape)}"
            if not isinstance(x, torch.Tensor):
                raise OptionError(f"input {slot}: the step was captured with {want}, got a {type(x).__name__}{replan}")
            if tuple(x.shape) != tuple(val.shape) or x.dtype != val.dtype:
                raise OptionError(
                    f"input {slot}: the step was captured with {want}, got a {x.dtype} tensor of "
                    f"shape {tuple(x.shape)}{replan}"
                )
            if not _same_strides(x.shape, x.stride(), val.stride()) and dense_layout(val.shape, val.stride()):
                laid = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=x.dtype, device=x.device)
                out[slot] = laid.copy_(x)
        for slot, value in self.constants.items():
            if not _same_value(inputs[slot], value):
                got = _short(inputs[slot])
                if _holds_tensors(value):
                    got = (
                        ("other values" if got == _short(value) else got)
                        + "; tensors inside a list, tuple or dict argument are constants of the captured step: "
                        "pass each tensor as an argument of its own"
                    )
                else:
                    got += replan
                raise OptionError(f"input {slot}: the step was captured with {_short(value)} there, got {got}")
        return tuple(out)

    def check_modes(self, model: nn.Module) -> None:
        """Raise :class:`OptionError` if a module of ``model`` is not in the training/eval mode of the capture."""
        for name, module in model.named_modules():
            captured = self.modes.get(name)
            if captured is not None and module.training != captured:
                mode, was = ("training", "eval") if module.training else ("eval", "training")
                what = f"module {name!r}" if name else "the model"
                raise OptionError(
                    f"{what} is in {mode} mode, but the step was captured in {was} mode (dropout and "
                    f"batch norm run as captured): call .{'eval' if captured is False else 'train'}() "
                    f"on it again, or plan (capture) again in {mode} mode"
                )

    def check_trainable(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Raise :class:`OptionError` unless the step updates what eager training of ``model`` with
        ``optimizer`` would: the parameters that require grad are the captured step's (one frozen or
        unfrozen since needs a new capture), and ``optimizer`` holds every one it updates (eager
        ``optimizer.step()`` leaves the others as they are)."""
        trained = set(self.layout.params) | set(self.layout.unreached)
        known = trained | set(self.layout.buffers)
        again = "; plan (capture) again for the model as it is now"
        params = dict(model.named_parameters())
        for name, p in params.items():
            if name not in known:
                raise OptionError(f"the model's parameter {name!r} is not one of the captured step's{again}")
            if p.requires_grad != (name in trained):
                now, was = ("requires", "was frozen") if p.requires_grad else ("does not require", "was trained")
                raise OptionError(
                    f"parameter {name!r} {now} grad now, but it {was} when the step was "
                    f"captured, which holds that fixed{again}"
                )
        if optimizer is None:
            return
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [n for n in self.layout.params if id(params[n]) not in held]
        if missing:
            others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise OptionError(
                f"the optimizer does not hold parameter {missing[0]!r}{others}, which requires grad: "
                f"eager training would leave it as it is, but the placed step updates every "
                f"parameter that requires grad; freeze those not to train "
                f"(requires_grad_(False)) and plan again, or give the optimizer all of them"
            )

    def _state_of(self, param: torch.Tensor, optimizer: torch.optim.Optimizer | None) -> dict[str, torch.Tensor]:
        if optimizer is None:
            return self.optimizer.initial_state(param.detach())
        if type(optimizer) is not self.optimizer.torch_class:
            raise OptionError(
                f"the step was captured for {self.optimizer.torch_class.__name__}, got a {type(optimizer).__name__}"
            )
        state = optimizer.state[param]
        if any(state.get(name) is None for name in self.layout.state_names):
            # torch.optim's first step (or momentum set since eager steps without it): fresh state where none is
            fresh = self.optimizer.initial_state(param.detach())
            state.update({name: fresh[name] for name in self.layout.state_names if state.get(name) is None})
        return state

    def at_batch(self, rows: int) -> fx.GraphModule:
        """The step traced again on the first ``rows`` samples of its batch: a data-parallel replica's or a
        micro-batch's step.

        The captured module holds every shape as a constant (``x.view(6, 400)``),
        so a replica working on fewer rows needs a module of its own. It has
        the same nodes under the same names as :attr:`gm`; traced once per size.

        Raises
        ------
        OptionError
            The step holds no model to trace (it was built from a graph file),
            ``rows`` is not between 1 and the batch size, or the model traced on
            fewer rows has other operations than on the whole batch.
        """
        if (
            self.batch_size is None
            or isinstance(rows, bool)
            or not isinstance(rows, int)
            or not 1 <= rows <= self.batch_size
        ):
            raise OptionError(f"rows must be between 1 and the batch's {self.batch_size} samples, got {rows!r}")
        if rows == self.batch_size:
            return self.gm
        if rows in self._replica_modules:
            return self._replica_modules[rows]
        if self.source is None:
            raise OptionError(
                "the step holds no model to trace again on part of its batch; capture it from the "
                "model (placer.capture)"
            )
        model, inputs = self.source
        sliced = tuple(
            x[:rows] if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == self.batch_size else x
            for x in inputs
        )
        gm, _ = _traced_step(model, self.layout, self.optimizer, sliced)
        names, again = [v.name for v in self.gm.graph.nodes], [v.name for v in gm.graph.nodes]
        if names != again:
            where = next((a for a, b in zip(names, again) if a != b), f"{len(names)} against {len(again)} nodes")
            raise OptionError(
                f"the model traced on {rows} of its {self.batch_size} samples has other operations "
                f"than on all of them (first difference: {where}); a data-parallel replica or a micro-batch "
                f"of {rows} samples cannot run the captured step's nodes: plan fewer replicas or micro-batches"
            )
        self._replica_modules[rows] = gm
        return gm

    def example_args(self, seed: int = 0) -> list[torch.Tensor]:
        """Flat arguments to run :attr:`gm` on, without touching any live model.

        Copies of the captured model's tensors and inputs, with fresh optimizer state and
        the captured learning rate, for a real capture; for a fake one, CPU tensors of the
        captured shapes: the captured learning rate, normal values
        for parameters and floating inputs, zeros for buffers, optimizer state and
        integer inputs (valid indices and labels).
        """
        if self.source is not None and not self.fake:
            model, inputs = self.source
            flat = self.step_inputs(model, inputs)
            return [t.detach().clone() for t in flat]
        generator = torch.Generator().manual_seed(seed)
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        args = []
        for k, node in enumerate(placeholders):
            val = node.meta["val"]
            if k == self.layout.lr_offset:
                args.append(torch.tensor(self.optimizer.hyper["lr"], dtype=val.dtype))
                continue
            is_param_or_input = k < len(self.layout.params) or k >= self.layout.input_offset
            if is_param_or_input and val.is_floating_point():
                args.append(torch.randn(tuple(val.shape), dtype=val.dtype, generator=generator))
            else:
                args.append(torch.zeros(tuple(val.shape), dtype=val.dtype))
        return args

    def write_back(
        self, flat: Sequence[torch.Tensor], model: nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        """Copy parameters, buffers and optimizer state from ``flat`` into ``model`` / ``optimizer``.

        For a runtime that ran :attr:`gm` on copies (other devices): after it, the live
        model and optimizer hold the same values as if ``gm`` had run on
        :meth:`step_inputs` directly. Tensors that already share storage are skipped.
        """
        tensors = self._live_tensors(model)
        params = dict(model.named_parameters())
        targets: list[torch.Tensor | None] = [tensors[n] for n in (*self.layout.params, *self.layout.buffers)]
        if self.layout.state_names:
            states = [
                self._state_of(params[n], optimizer) if optimizer is not None else None for n in self.layout.params
            ]
            for state_name in self.layout.state_names:
                targets += [s[state_name] if s is not None else None for s in states]
        with torch.no_grad():
            for live, new in zip(targets, flat):
                if live is not None and live.data_ptr() != new.data_ptr():
                    live.copy_(new)

    def run(
        self, model: nn.Module, inputs: Sequence[Any], optimizer: torch.optim.Optimizer | None = None
    ) -> torch.Tensor:
        """One training step of ``model`` (and ``optimizer``'s state) through :attr:`gm`; the loss."""
        return self.gm(*self.step_inputs(model, inputs, optimizer))


def _same_strides(size: Sequence[int], a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two strides lay out a tensor of ``size`` alike (dimensions of size 1 do not count)."""
    return all(n <= 1 or x == y for n, x, y in zip(size, a, b))


def _same_value(a: Any, b: Any) -> bool:
    """Whether a non-tensor input equals its captured value (same type; tensors inside compared by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    try:
        return bool(a == b) or (a != a and b != b)  # NaN equals NaN here
    except Exception:  # noqa: BLE001 - values that cannot be compared are not the same
        return a is b


def _holds_tensors(value: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in torch.utils._pytree.tree_leaves(value))


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if _holds_tensors(value):
        return f"a {type(value).__name__} of tensors"
    return shown(value)


def _as_tuple(inputs: Any) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, list):
        return tuple(inputs)
    if not isinstance(inputs, tuple):
        raise OptionError(f"inputs must be a tensor or a tuple of model arguments, got {type(inputs).__name__}")
    return inputs


def _tag_backward(loss: torch.Tensor) -> None:
    """Make the ops of each autograd node's backward carry that node's sequence number.

    The forward op that created the autograd node carries the same number
    (``meta["seq_nr"]``), so a backward op can be given its forward op's module.
    """
    stack, seen = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        node.register_prehook(partial(_enter_backward, node._sequence_nr()))
        node.register_hook(_leave_backward)
        stack.extend(fn for fn, _ in node.next_functions)


def _enter_backward(seq_nr: int, grad_outputs: Any) -> None:
    fx_traceback.set_grad_fn_seq_nr(seq_nr)


def _leave_backward(grad_inputs: Any, grad_outputs: Any) -> None:
    fx_traceback.reset_grad_fn_seq_nr()


def _layout(
    model: nn.Module, opt: OptimizerSpec, inputs: tuple, slots: tuple[int, ...], unreached: tuple[str, ...]
) -> StepLayout:
    """The flat arguments of ``model``'s step, the parameters in ``unreached`` among the buffers."""
    params = [n for n, p in model.named_parameters() if p.requires_grad and n not in unreached]
    buffers = [n for n, p in model.named_parameters() if not p.requires_grad or n in unreached]
    buffers += [n for n, _ in model.named_buffers()]
    return StepLayout(tuple(params), tuple(buffers), opt.state_names, slots, len(inputs), unreached)


def _traced_step(
    model: nn.Module, layout: StepLayout, opt: OptimizerSpec, inputs: tuple
) -> tuple[fx.GraphModule, tuple[str, ...]]:
    """:func:`_trace_step` over fake tensors like ``model``'s and ``inputs``'; a tracing failure as a
    :class:`FormatError` naming the model's line."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    fake_mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True, allow_non_fake_inputs=True)
    with fake_mode:
        flat = [_fake_like(tensors[n]) for n in (*layout.params, *layout.buffers)]
        states = [opt.initial_state(p) for p in flat[: len(layout.params)]]
        for state_name in opt.state_names:
            flat += [s[state_name] for s in states]
        flat.append(torch.empty((), dtype=torch.float64))
        flat += [_fake_like(inputs[k]) for k in layout.input_slots]
    try:
        # Stack traces of every op cost much of the trace and are not used (torch 2.11 has no such
        # switch: ``create`` lets it record them there).
        with (
            fx_traceback.preserve_node_meta(),
            patch.object(torch.fx.config, "do_not_emit_stack_traces", True, create=True),
            portable_kernels(),
        ):
            return _trace_step(model, layout, opt, inputs, flat, states, fake_mode)
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - any tracing failure is reported as the model's
        message = str(exc).splitlines()[0] if str(exc) else ""
        # The hints' phrases are looked for in the message and in the files the failure went through.
        said = " ".join([str(exc), *(frame.filename for frame in traceback.extract_tb(exc.__traceback__))])
        hint = next((f" ({hint})" for phrase, hint in _TRACE_HINTS if phrase in said), "")
        raise FormatError(
            f"cannot capture the training step of {type(model).__name__}: "
            f"{type(exc).__name__} at {_user_frame(exc)}: {message}{hint}"
        ) from exc


def _step_function(model: nn.Module, layout: StepLayout, inputs: tuple, update):
    """The training step as a function of the flat tensors; ``update(param, grad, lr, state)``
    updates one parameter (``lr``: the step's learning rate, read as a number; ``state``: its optimizer
    state, in ``layout.state_names`` order)."""
    n_p, n_b = len(layout.params), len(layout.buffers)

    def step(*flat):
        params, buffers = list(flat[:n_p]), list(flat[n_p : n_p + n_b])
        state = {name: flat[layout.state_offset(name) : layout.state_offset(name) + n_p] for name in layout.state_names}
        args = list(inputs)
        for k, slot in enumerate(layout.input_slots):
            args[slot] = flat[layout.input_offset + k]

        def loss_of(ps, bs):
            tensors = {**dict(zip(layout.params, ps)), **dict(zip(layout.buffers, bs))}
            loss = torch.func.functional_call(model, tensors, tuple(args), tie_weights=True, strict=False)
            _write_reassigned(model, tensors, dict(zip(layout.buffers, bs)))
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
                what = (
                    f"a tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}"
                    if isinstance(loss, torch.Tensor)
                    else f"a {type(loss).__name__}"
                )
                raise FormatError(f"model(*inputs) must return the scalar floating-point loss, got {what}")
            if not loss.requires_grad:
                # Every gradient would be zero and the step a forward pass with no backward: surely a mistake.
                some = ", ".join(layout.params[:3]) + (", ..." if len(layout.params) > 3 else "")
                raise FormatError(
                    f"cannot capture the training step of {type(model).__name__}: its loss has no "
                    f"gradient, it depends on none of the trainable parameters ({some}); is it "
                    f"computed under torch.no_grad(), detached, or from the inputs alone?"
                )
            _tag_backward(loss)
            return loss

        grads, loss = torch.func.grad_and_value(loss_of)(params, buffers)
        with torch.no_grad():
            lr = flat[layout.lr_offset].item()  # once, for every parameter's update
            for k, (p, g) in enumerate(zip(params, grads)):
                with fx_traceback.annotate({"param": layout.params[k]}):
                    update(p, g, lr, [state[name][k] for name in layout.state_names])
        return loss

    return step


def _write_reassigned(model: nn.Module, tensors: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
    """Copy into each of ``buffers`` the tensor the forward pass assigned in its place (``self.count =
    self.count + 1``), which ``functional_call`` hands back in ``tensors``: eager training keeps the
    new value, as the step then does (in place, as it keeps running statistics)."""
    for name, buffer in buffers.items():
        new = tensors[name]
        if new is buffer:
            continue
        if not isinstance(new, torch.Tensor) or new.shape != buffer.shape or new.dtype != buffer.dtype:
            what = (
                f"a {new.dtype} tensor of shape {tuple(new.shape)}"
                if isinstance(new, torch.Tensor)
                else f"a {type(new).__name__}"
            )
            raise FormatError(
                f"cannot capture the training step of {type(model).__name__}: its forward "
                f"assigns {what} to buffer {name!r}, a {buffer.dtype} tensor of shape "
                f"{tuple(buffer.shape)}; a captured step updates a buffer in place, keeping "
                f"its shape and dtype"
            )
        with torch.no_grad():
            buffer.copy_(new)


def _trace_step(
    model: nn.Module,
    layout: StepLayout,
    opt: OptimizerSpec,
    inputs: tuple,
    flat: list,
    states: list[dict],
    fake_mode: FakeTensorMode,
    *,
    per_parameter: bool = True,
) -> tuple[fx.GraphModule, tuple[str, ...]]:
    """``make_fx``'s trace of the step over the fake tensors ``flat`` (``states``: each parameter's
    optimizer state), its placeholders named after the layout, and the parameters the loss does not
    depend on (:func:`_unreached_params`).

    With ``per_parameter``, each parameter's update is a copy of its kind's, traced once
    (:mod:`placer.capture.updates`); without, it is traced for every parameter, which gives the
    same graph more slowly (what the tests compare the copies with).
    """
    if per_parameter:
        templates = UpdateTemplates(opt)
        for param, state in zip(flat, states):
            templates.add(param, [state[name] for name in opt.state_names])
    update = templates.stand_in if per_parameter else opt.update
    step = torch.func.functionalize(_step_function(model, layout, inputs, update), remove="mutations")

    def traced(*args):
        return step(*args)

    traced._orig_mod = model  # lets make_fx record each op's module path (nn_module_stack)
    gm = make_fx(traced, tracing_mode="fake", record_module_stack=True)(*flat)
    if per_parameter:
        lr = [n for n in gm.graph.nodes if n.op == "placeholder"][layout.lr_offset]
        (lr_read,) = lr.users  # the step's one .item() of it
        templates.expand(gm.graph, fake_mode, lr_read)
    _name_placeholders(gm.graph, layout)
    gm.recompile()
    return gm, _unreached_params(gm.graph, layout)


def _unreached_params(graph: fx.Graph, layout: StepLayout) -> tuple[str, ...]:
    """The parameters of ``layout`` whose gradient in ``graph`` is ``zeros_like`` of the parameter, read by
    its update alone: what ``torch.func.grad`` gives a parameter the loss does not depend on, where eager
    autograd leaves ``grad`` None and ``torch.optim`` skips the parameter."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    unreached = []
    for name, param in zip(layout.params, placeholders):
        for node in param.users:
            if (
                node.target is torch.ops.aten.zeros_like.default
                and node.users
                and all((user.meta.get("custom") or {}).get("param") == name for user in node.users)
            ):
                unreached.append(name)
                break
    return tuple(unreached)


def step_name(label: str, batch: int | None, optimizer: "str | OptimizerSpec") -> str:
    """The name of a captured training step's graph: ``LABEL-bsBATCH-OPTIMIZER`` (``resnet50-bs64-adam``,
    ``resnet50-bs64-sgd-momentum0.9``: an :class:`~placer.capture.optim.OptimizerSpec`'s
    :attr:`~placer.capture.optim.OptimizerSpec.label`, its settings other than torch's defaults).

    Whatever captures or predicts a step (:func:`capture`, :func:`placer.capture.capture_spec`,
    ``placer profile``, ``placer predict``) names its graph here, so that the same model,
    batch and optimizer get the same name everywhere: a profile is matched to its graph by
    name (the digest does not see sizes), and the runtime reads the batch from ``-bsN-``.
    """
    optimizer = optimizer if isinstance(optimizer, str) else optimizer.label
    return f"{label}-bs{batch}-{optimizer.lower()}"


def capture(
    model: nn.Module,
    inputs: Any,
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    name: str | None = None,
    fake: bool = False,
    settings: dict[str, Any] | None = None,
) -> CapturedStep:
    """Capture one training step (forward, loss, backward, optimizer update) of ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        ``model(*inputs)`` returns the scalar loss. Parameters may live on the meta
        device (``with torch.device("meta"): model = ...``): then nothing is allocated.
    inputs : tensor or tuple
        Example arguments of ``model``; the tensors among them become inputs of the step
        (the batch size is the leading dimension of the first), the rest constants.
    optimizer : {"adam", "sgd", "adamw"}
        The ``torch.optim`` optimizer whose update ends the step.
    lr : float
        The default of the step's learning-rate input (:meth:`CapturedStep.step_inputs`
        reads the optimizer's at every step).
    name : str, optional
        Graph name (default: :func:`step_name` of the model's class name, batch size and
        optimizer).
    fake : bool
        Do not read the model's values; automatic when its parameters are on the meta
        device. Tracing always uses fake tensors, so this only marks the step as not
        executable from the model (:meth:`CapturedStep.example_args` then makes up values).
    settings : dict, optional
        The optimizer's other settings (``{"momentum": 0.9}``), as
        :func:`placer.capture.optimizer_spec` takes them.

    Returns
    -------
    CapturedStep
        Its ``graph`` is costed by :func:`placer.cost.analytic.annotate`.

    Raises
    ------
    OptionError
        Unknown optimizer, bad ``lr`` or setting, ``model`` not a module or bad ``inputs``.
    FormatError
        If ``model(*inputs)`` does not return a scalar floating-point loss, the loss
        depends on no trainable parameter, or the step cannot be traced (the message
        says why).

    Notes
    -----
    Frozen parameters (``requires_grad=False``) are inputs of the step, not
    updated; so are trainable parameters the loss does not depend on, which eager
    ``torch.optim`` skips. Models that branch on tensor values cannot be traced
    with fake tensors (the error names the line). oneDNN is off while tracing, so
    CPU-only fused kernels do not replace portable aten ops.

    Examples
    --------
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    >>> class WithLoss(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.net = model
    ...     def forward(self, x, y):
    ...         return torch.nn.functional.mse_loss(self.net(x), y)
    >>> step = capture(WithLoss(), (torch.randn(8, 4), torch.randn(8, 2)), optimizer="sgd")
    >>> step.graph.num_nodes > 10
    True

    References
    ----------
    PyTorch ``torch.func`` (functional_call, grad_and_value, functionalize) and
    ``torch.fx.experimental.proxy_tensor.make_fx``.
    """
    started = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise OptionError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _as_tuple(inputs)
    opt = optimizer_spec(optimizer, lr, **(settings or {}))
    if not any(
        p.requires_grad for p in model.parameters()
    ):  # a training step would compute no gradient and update nothing
        count = sum(1 for _ in model.parameters())
        why = f"its {count} parameters all have requires_grad=False" if count else "it has no parameters"
        raise FormatError(
            f"cannot capture the training step of {type(model).__name__}: it has no trainable parameter ({why})"
        )
    fake = bool(fake) or any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    slots = tuple(k for k, x in enumerate(inputs) if isinstance(x, torch.Tensor))
    batch = next((int(inputs[k].shape[0]) for k in slots if inputs[k].dim() >= 1), None)
    name = name or step_name(type(model).__name__, batch, opt)
    layout = _layout(model, opt, inputs, slots, ())
    gm, unreached = _traced_step(model, layout, opt, inputs)
    if unreached:  # rare: trainable parameters the loss does not reach, traced again as buffers
        layout = _layout(model, opt, inputs, slots, unreached)
        gm, _ = _traced_step(model, layout, opt, inputs)
    layers = _layers(gm, layout, model)
    resident = [n.name for n in gm.graph.nodes if n.op == "placeholder"][: layout.input_offset]
    batch_inputs = [f"input_{k}" for k in slots if inputs[k].dim() >= 1 and inputs[k].shape[0] == batch]
    graph, carrier = build_graph(
        gm, name=name, layers=layers, resident=resident, batch=batch, batch_inputs=batch_inputs
    )

    graph = annotate(graph)
    constants = {k: x for k, x in enumerate(inputs) if k not in slots}
    modes = {name: module.training for name, module in model.named_modules()}
    return CapturedStep(
        graph, gm, layout, opt, carrier, batch, time.perf_counter() - started, fake, constants, (model, inputs), modes
    )


@contextmanager
def portable_kernels():
    """Trace (or count) with oneDNN off, so that CPU-only fused kernels such as
    ``mkldnn_rnn_layer`` do not replace the portable aten ops (an LSTM's matmuls and cell
    functions) that other devices run and ``flop_registry`` counts."""
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


# Frames inside these parts of torch are the tracer's, not the model's.
_TRACER_PARTS = tuple(
    f"{os.sep}torch{os.sep}{part}"
    for part in (
        "fx",
        "_subclasses",
        "_functorch",
        "_dynamo",
        "utils",
        "_ops.py",
        "_prims",
        "_refs",
        "_decomp",
        "overrides.py",
        "_tensor.py",
        "__init__.py",
        "_compile.py",
        "_library",
    )
)


_CHECKPOINTING = (
    "activation checkpointing (torch.utils.checkpoint) cannot be captured: call the module directly; "
    "the plan decides where each activation is held"
)
#: What a tracing failure's message says (or a file it went through) -> what the model does that capture cannot
#: follow, and what to do. Checkpointing fails as "saved tensor hooks" under torch 2.13, as "NYI: Functionalize
#: rule for custom_function_call" under 2.11, inside torch/utils/checkpoint.py either way.
_TRACE_HINTS = (
    (
        "data-dependent",
        "the model branches on tensor values or reads one as a Python number: if, .item(), "
        "float(), int(), which a trace with fake tensors cannot follow",
    ),
    (
        "mutate a captured Tensor",
        "the model writes in place into one of its inputs (x /= 255, x.clamp_()), which "
        "the captured step takes as given: write x = x / 255 instead",
    ),
    ("saved tensor hooks", _CHECKPOINTING),
    (f"{os.sep}utils{os.sep}checkpoint.py", _CHECKPOINTING),
)
_TORCH_DIR = os.path.dirname(torch.__file__)


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` that is the model's code, not the tracer's; where
    that is inside torch (a module of ``torch.nn``), the model's own line that called it, then torch's."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not any(part in frame.filename for part in _TRACER_PARTS) and not frame.filename.endswith("trace.py")
    ]
    if not frames:
        return "?"
    inner = frames[-1]
    own = [frame for frame in frames if not frame.filename.startswith(_TORCH_DIR + os.sep)]
    if not own or own[-1] is inner:
        return f"{inner.filename}:{inner.lineno}"
    torch_file = os.path.relpath(inner.filename, os.path.dirname(_TORCH_DIR))
    return f"{own[-1].filename}:{own[-1].lineno} (in {torch_file}:{inner.lineno})"


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor like ``t`` (on the CPU when ``t`` is on the meta device)."""
    device = torch.device("cpu") if t.is_meta else t.device
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _name_placeholders(graph: fx.Graph, layout: StepLayout) -> None:
    names = [f"p_{_safe(n)}" for n in layout.params] + [f"b_{_safe(n)}" for n in layout.buffers]
    for state_name in layout.state_names:
        names += [f"s_{state_name}_{_safe(n)}" for n in layout.params]
    names += [LR_PLACEHOLDER] + [f"input_{k}" for k in layout.input_slots]
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, wanted in zip(placeholders, names):
        node._rename(wanted)
        node.target = node.name


def _owner(path: str) -> str | None:
    module = path.rpartition(".")[0]
    return module or None


def _layers(gm: fx.GraphModule, layout: StepLayout, model: nn.Module) -> dict[str, str | None]:
    """fx node name -> the module path it came from.

    Forward ops: the innermost module of ``nn_module_stack``; backward ops: the module
    of the forward op with the same autograd sequence number; optimizer ops and state
    placeholders: the module owning the parameter; write-backs: that of what they write.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    param_of: list[str | None] = list(layout.params) + list(layout.buffers)
    for _ in layout.state_names:
        param_of += list(layout.params)
    layers: dict[str, str | None] = {}
    for node, path in zip(placeholders, param_of):
        layers[node.name] = _owner(path)
    forward_by_seq: dict[Any, str | None] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack")
        custom = node.meta.get("custom") or {}
        if "param" in custom:
            layers[node.name] = _owner(custom["param"])
        elif stack:
            fqn = list(stack.values())[-1][0]
            layers[node.name] = fqn or None
            forward_by_seq.setdefault(node.meta.get("seq_nr"), fqn or None)
        elif node.meta.get("seq_nr") in forward_by_seq:
            layers[node.name] = forward_by_seq[node.meta["seq_nr"]]
        elif node.target is torch.ops.aten.copy_.default and isinstance(node.args[0], fx.Node):
            layers[node.name] = layers.get(node.args[0].name)
    return layers
