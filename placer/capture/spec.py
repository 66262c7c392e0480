"""Model specs: where a model to capture comes from.

Two forms, the same in the Python API and on the command line:

* ``zoo:NAME`` or ``zoo:NAME?key=value&key=value``: a model of
  :data:`placer.capture.zoo.ZOO` with size options (``zoo:gpt2?layers=2&hidden=64``);
  values read as int, float, ``true``/``false``, else text.
* ``path/to/file.py:FACTORY``: the file is imported as a module, unchanged (its folder
  first on ``sys.path`` while it loads, as when running it), and ``FACTORY(batch_size)``
  returns ``(model, inputs)`` with ``model(*inputs)`` the scalar loss.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from ..errors import FormatError, OptionError
from ..io import note_input, shown
from .optim import optimizer_spec

__all__ = ["load_model", "capture_spec", "in_float64", "parse_spec", "spec_label"]


def parse_spec(spec: str) -> tuple[str, str, Any]:
    """``("zoo", NAME, options)`` or ``("file", PATH, FACTORY)``.

    Raises
    ------
    OptionError
        If ``spec`` has neither form, an option is malformed or an option is given twice.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise OptionError(f"model spec must be 'zoo:NAME' or 'path/to/file.py:FACTORY', got {spec!r}")
    if spec.startswith("zoo:"):
        name, _, query = spec[4:].partition("?")
        options: dict[str, Any] = {}
        given: dict[str, str] = {}  # option -> the item that set it, to name a repeated one
        for item in filter(None, query.split("&")):
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise OptionError(f"model spec {spec!r}: size option {item!r} is not KEY=VALUE")
            key = key.replace("-", "_")
            if key in given:  # which one would win is a guess: refuse rather than take one
                raise OptionError(
                    f"model spec {spec!r}: size option {key!r} is given twice ({given[key]!r} and {item!r})"
                )
            given[key] = item
            options[key] = _option_value(raw)
        return "zoo", name, options
    path, sep, factory = spec.rpartition(":")
    if not sep or not path or not factory.isidentifier():
        raise OptionError(
            f"model spec {spec!r}: expected 'zoo:NAME' or 'path/to/file.py:FACTORY' (FACTORY a Python name)"
        )
    return "file", path, factory


def spec_label(spec: str) -> str:
    """The model's part of the graph name of a step captured from ``spec`` (see
    :func:`placer.capture.step_name`): the zoo name with its size options as written
    (``gpt2?layers=2``), or the factory's name.

    Raises
    ------
    OptionError
        As :func:`parse_spec`.
    """
    kind, _, detail = parse_spec(spec)
    return spec[len("zoo:") :] if kind == "zoo" else detail


def _option_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _zoo_factory(name: str, options: dict[str, Any]) -> tuple[Callable[[int], Any], str]:
    try:
        from .zoo import ZOO
    except ImportError as exc:
        raise OptionError(f"the model zoo cannot be loaded ({exc}); use path/to/file.py:FACTORY") from exc

    if name not in ZOO:
        raise OptionError(f"unknown zoo model {name!r}; the zoo has: {', '.join(sorted(ZOO))}")
    entry = ZOO[name]
    known = dict(entry.size_options)
    unknown = sorted(set(options) - set(known))
    if unknown:
        listed = ", ".join(f"{k} (default {v!r})" for k, v in known.items()) or "none"
        raise OptionError(f"zoo model {name!r} has no size option {unknown[0]!r}; its options: {listed}")
    return (lambda batch: entry.factory(batch, **options)), f"zoo model {name!r}"


def _file_factory(path: str, factory: str) -> tuple[Callable[[int], Any], str]:
    file = Path(path)
    if not file.is_file():
        raise FormatError(f"model file {path}: no such file" if not file.exists() else f"model file {path}: not a file")
    module_name = "placer_model_" + hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    if module_spec is None or module_spec.loader is None:
        raise FormatError(f"model file {path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[module_name] = module
    note_input(file)  # an input of the command: no output of it may replace the model's source
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:  # the file's sys.exit() is not placer's exit status
        sys.modules.pop(module_name, None)
        raise FormatError(f"model file {path}: importing it exited ({_exit_call(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - any error of the user's file is reported as such
        sys.modules.pop(module_name, None)
        raise FormatError(f"model file {path}: importing it raised {type(exc).__name__}: {exc}") from exc
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    function = getattr(module, factory, None)
    if function is None or not callable(function):
        names = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module_name and not n.startswith("_")
        )
        what = "has no" if function is None else "has a non-callable"
        raise FormatError(f"model file {path} {what} factory {factory!r}; its functions: {', '.join(names) or 'none'}")
    return function, f"factory {factory!r} of {path}"


def _exit_call(exc: SystemExit) -> str:
    """The call that raised ``exc``, for a message: ``sys.exit(3)``, ``sys.exit()``, ``sys.exit('why')``."""
    return "sys.exit()" if exc.code is None else f"sys.exit({shown(exc.code)})"


def load_model(spec: str, batch: int, *, meta: bool = False) -> tuple[nn.Module, tuple]:
    """Build the model and example inputs that ``spec`` names, for batch size ``batch``.

    Parameters
    ----------
    spec : str
        ``zoo:NAME[?key=value&...]`` or ``path/to/file.py:FACTORY``.
    batch : int
        Batch size passed to the factory.
    meta : bool
        Build under ``torch.device("meta")``: parameters and inputs take no memory.

    Returns
    -------
    (torch.nn.Module, tuple)

    Raises
    ------
    OptionError
        Malformed spec, unknown zoo model (the message lists the zoo) or size option,
        batch not a positive integer.
    FormatError
        Missing file or factory, a file or factory that raises or calls sys.exit (named, with its
        error), or a factory that does not return ``(model, inputs)``.

    Examples
    --------
    >>> model, inputs = load_model("zoo:lenet", 4)   # doctest: +SKIP
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise OptionError(f"batch size must be a positive integer, got {batch!r}")
    kind, where, detail = parse_spec(spec)
    factory, label = _zoo_factory(where, detail) if kind == "zoo" else _file_factory(where, detail)
    try:
        if meta:
            with torch.device("meta"):
                result = factory(batch)
        else:
            result = factory(batch)
    except (FormatError, OptionError):
        raise
    except SystemExit as exc:  # the factory's sys.exit() is not placer's exit status
        raise FormatError(f"{label} exited ({_exit_call(exc)}) instead of returning (model, inputs)") from None
    except Exception as exc:  # noqa: BLE001 - the user's factory failed; say which and why
        raise FormatError(f"{label} raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module)):
        got = (
            type(result).__name__
            if not isinstance(result, (tuple, list))
            else f"a {type(result).__name__} of {len(result)} items"
            + (f" starting with a {type(result[0]).__name__}" if result else "")
        )
        raise FormatError(f"{label} must return (model, inputs) with model a torch.nn.Module, got {got}")
    model, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise FormatError(f"{label}: inputs must be a tuple of model arguments, got {type(inputs).__name__}")
    return model, tuple(inputs)


def capture_spec(
    spec: str,
    batch: int,
    *,
    optimizer: str = "adam",
    lr: float = 1e-3,
    fake: bool | None = None,
    name: str | None = None,
    settings: dict | None = None,
    float64: bool = False,
):
    """Capture the training step of the model ``spec`` names (see :func:`load_model`).

    Parameters
    ----------
    spec, batch
        As for :func:`load_model`.
    optimizer, lr, settings
        As for :func:`placer.capture.capture`.
    fake : bool or None
        True: build on the meta device (no memory, any size). False: build for real.
        None: try the meta device and build for real if the factory cannot run there.
    name : str, optional
        Graph name (default :func:`placer.capture.step_name`, ``NAME-bsBATCH-OPTIMIZER``
        with NAME the :func:`spec_label`: the zoo name with its size options as written, or
        the factory's name).
    float64 : bool
        Capture the model and inputs in double precision (:func:`in_float64`):
        the same operations and node ids, twice the bytes.

    Returns
    -------
    CapturedStep

    Raises
    ------
    OptionError, FormatError
        As :func:`load_model` and :func:`placer.capture.capture`.
    """
    from .trace import capture, step_name  # deferred: imports torch

    options = dict(
        optimizer=optimizer,
        lr=lr,
        settings=settings,
        name=name or step_name(spec_label(spec), batch, optimizer_spec(optimizer, lr, **(settings or {}))),
    )
    precision = in_float64 if float64 else (lambda model, inputs: (model, inputs))
    if fake is None:
        try:
            return capture(*precision(*load_model(spec, batch, meta=True)), fake=True, **options)
        except FormatError:
            pass  # the factory or the model needs real tensors: build it for real
    return capture(*precision(*load_model(spec, batch, meta=bool(fake))), fake=bool(fake), **options)


def in_float64(model: nn.Module, inputs: tuple) -> tuple[nn.Module, tuple]:
    """``model`` (in place) and its floating-point ``inputs`` in double precision; other inputs as they are.

    Training in float64 tells a fault from rounding: where a model amplifies
    float32 rounding (batch norm over a few samples drives two eager float32
    runs apart by 1e-3 within two steps), a plan whose operations add partial
    sums in another order cannot match eager float32 training to 1e-6, but
    matches eager float64 training to about 1e-13 if it computes what the step
    does.

    Examples
    --------
    >>> import torch
    >>> model, inputs = in_float64(torch.nn.Linear(2, 1), (torch.ones(3, 2), torch.arange(3)))
    >>> model.weight.dtype, inputs[0].dtype, inputs[1].dtype
    (torch.float64, torch.float64, torch.int64)
    """
    return model.double(), tuple(t.double() if torch.is_tensor(t) and t.is_floating_point() else t for t in inputs)
