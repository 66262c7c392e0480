"""``placer capture SPEC --batch N --optimizer adam --output G.json [--fake]``."""

from __future__ import annotations

import argparse

from ..capture.optim import OPTIMIZERS, optimizer_spec
from ..errors import OptionError
from ..io import check_output
from ..report.tables import working
from ..show import terminal

__all__ = [
    "add_commands",
    "add_optimizer_option",
    "add_optimizer_settings",
    "optimizer_settings",
    "SETTING_FLAGS",
    "cmd_capture",
]


def cmd_capture(args: argparse.Namespace) -> int:

    check_output(args.output, "graph file", inputs=[args.spec])  # before the capture
    optimizer_settings(args)
    with working(
        f"capturing one training step of {args.spec} at batch {args.batch} "
        f"({args.optimizer}{', meta device' if args.fake else ''})..."
    ):
        from ..capture.spec import capture_spec  # deferred: imports torch

        step = capture_spec(
            args.spec,
            args.batch,
            optimizer=args.optimizer,
            lr=args.lr,
            fake=True if args.fake else None,
            name=args.name,
            settings=optimizer_settings(args),
        )
    graph = step.graph
    graph.save(args.output)
    print(
        f"{terminal(graph.name)}: {graph.num_nodes} nodes, {graph.num_edges} edges, "
        f"{graph.flops.sum() / 1e9:.4g} GFLOP, state {graph.param_bytes.sum() / 2**20:.1f} MiB, "
        f"op outputs {graph.output_bytes.sum() / 2**20:.1f} MiB in all, "
        f"{graph.compute_s.sum() * 1e3:.3f} ms on one V100 (roofline), "
        f"captured in {step.capture_s:.1f} s -> {args.output}"
    )
    return 0


def add_optimizer_option(parser: argparse.ArgumentParser, help: str | None = None, lr: bool = False) -> None:
    """Add ``--optimizer`` (default adam), and with ``lr`` ``--lr`` (default 1e-3), to a command that captures a
    training step.

    Every such command (``capture``, ``profile``, ``predict``, ``plan``, ``run`` ...) takes it from here, so that
    all accept the same names, :data:`placer.capture.OPTIMIZERS` (those
    :func:`placer.capture.capture` accepts), and none takes one another refuses.
    """

    parser.add_argument(
        "--optimizer",
        default="adam",
        choices=OPTIMIZERS,
        help=help
        or (
            "optimizer whose update ends the captured step, torch's defaults but for the settings given (default adam)"
        ),
    )
    if lr:
        parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")


#: The setting a --flag gives (its name with - for _) -> the optimizers that take it.
SETTING_FLAGS = {
    "momentum": ("sgd",),
    "weight_decay": ("sgd", "adam", "adamw"),
    "nesterov": ("sgd",),
    "betas": ("adam", "adamw"),
    "eps": ("adam", "adamw"),
}


def _betas(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers B1,B2 (0.9,0.999), got {text!r}") from None


def add_optimizer_settings(parser: argparse.ArgumentParser) -> None:
    """Add the optimizer's settings besides ``--lr`` (``--momentum``, ``--weight-decay``, ``--nesterov``,
    ``--betas``, ``--eps``) to a command that captures a training step; :func:`optimizer_settings` reads them."""
    group = parser.add_argument_group("optimizer settings (torch's defaults where not given)")
    group.add_argument("--momentum", type=float, help="SGD's momentum (a momentum_buffer per parameter)")
    group.add_argument("--weight-decay", type=float, help="weight decay (AdamW's default 0.01, else 0)")
    group.add_argument("--nesterov", action="store_true", default=None, help="SGD: Nesterov momentum")
    group.add_argument("--betas", type=_betas, metavar="B1,B2", help="Adam's and AdamW's betas (0.9,0.999)")
    group.add_argument("--eps", type=float, help="Adam's and AdamW's eps (1e-8)")


def optimizer_settings(args: argparse.Namespace) -> dict:
    """The settings :func:`add_optimizer_settings` added that were given, checked against ``--optimizer`` (and
    ``--lr`` where the command takes it) before any long work.

    Raises
    ------
    OptionError
        A flag another optimizer takes (``--momentum`` with adam) or a bad value, naming the flag.
    """

    given = {key: getattr(args, key) for key in SETTING_FLAGS if getattr(args, key, None) is not None}
    for key in given:
        takes = SETTING_FLAGS[key]
        if args.optimizer not in takes:
            raise OptionError(
                f"--{key.replace('_', '-')} is for --optimizer {' or '.join(takes)}, not {args.optimizer}"
            )
    lr = getattr(args, "lr", 1e-3)

    def refused(**settings) -> bool:
        try:
            optimizer_spec(args.optimizer, lr, **settings)
        except OptionError:
            return True
        return False

    try:
        optimizer_spec(args.optimizer, lr, **given)
    except OptionError as exc:
        if not given or refused():
            raise
        # The flags refused alone (--weight-decay -1), else those refused together (--nesterov without momentum).
        blamed = [key for key in given if refused(**{key: given[key]})] or list(given)
        raise OptionError(f"{exc} (--{'/--'.join(k.replace('_', '-') for k in blamed)})") from None
    return given


def add_commands(subparsers) -> None:
    """Add ``placer capture`` to the ``placer`` command."""
    p = subparsers.add_parser(
        "capture",
        help="capture a PyTorch training step as a graph file",
        description="Capture one training step (forward, loss, backward, optimizer "
        "update) of a model as a placer.graph/1 file, costed by the "
        "analytic model.",
    )
    p.add_argument(
        "spec",
        help="zoo:NAME[?key=value&...] or path/to/file.py:FACTORY "
        "(FACTORY(batch_size) returns (model, inputs), model(*inputs) the loss)",
    )
    p.add_argument("--batch", type=int, required=True, help="batch size passed to the factory")
    add_optimizer_option(p, lr=True)
    add_optimizer_settings(p)
    p.add_argument("--output", "-o", required=True, help="graph file to write")
    p.add_argument("--name", help="graph name (default NAME-bsBATCH-OPTIMIZER)")
    p.add_argument(
        "--fake",
        action="store_true",
        help="build the model on the meta device (no memory; default: tried first, "
        "real tensors if the factory needs them)",
    )
    p.set_defaults(func=cmd_capture)
