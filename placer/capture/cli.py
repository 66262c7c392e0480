"""``placer capture SPEC --batch N --optimizer adam --output G.json [--fake]``."""

from __future__ import annotations

import argparse

__all__ = ["add_commands", "add_optimizer_option", "cmd_capture"]


def cmd_capture(args: argparse.Namespace) -> int:
    from ..io import check_output
    from ..report.tables import working

    check_output(args.output, "graph file")     # before the capture
    with working(f"capturing one training step of {args.spec} at batch {args.batch} "
                 f"({args.optimizer}{', meta device' if args.fake else ''})..."):
        from .spec import capture_spec

        step = capture_spec(args.spec, args.batch, optimizer=args.optimizer, lr=args.lr,
                            fake=True if args.fake else None, name=args.name)
    graph = step.graph
    graph.save(args.output)
    print(f"{graph.name}: {graph.num_nodes} nodes, {graph.num_edges} edges, "
          f"{graph.flops.sum() / 1e9:.4g} GFLOP, state {graph.param_bytes.sum() / 2**20:.1f} MiB, "
          f"op outputs {graph.output_bytes.sum() / 2**20:.1f} MiB in all, "
          f"{graph.compute_s.sum() * 1e3:.3f} ms on one V100 (roofline), "
          f"captured in {step.capture_s:.1f} s -> {args.output}")
    return 0


def add_optimizer_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """Add ``--optimizer`` (default adam) to a command that captures a training step.

    Every such command (``capture``, ``profile``, ``predict``, ``plan``, ``run`` ...) takes it from here, so that
    all accept the same names, :data:`placer.capture.OPTIMIZERS` (those
    :func:`placer.capture.capture` accepts), and none takes one another refuses.
    """
    from .optim import OPTIMIZERS

    parser.add_argument("--optimizer", default="adam", choices=OPTIMIZERS, help=help or (
        "optimizer whose update ends the captured step, torch's defaults (default adam)"))


def add_commands(subparsers) -> None:
    """Add ``placer capture`` to the ``placer`` command."""
    p = subparsers.add_parser("capture", help="capture a PyTorch training step as a graph file",
                              description="Capture one training step (forward, loss, backward, optimizer "
                                          "update) of a model as a placer.graph/1 file, costed by the "
                                          "analytic model.")
    p.add_argument("spec", help="zoo:NAME[?key=value&...] or path/to/file.py:FACTORY "
                                "(FACTORY(batch_size) returns (model, inputs), model(*inputs) the loss)")
    p.add_argument("--batch", type=int, required=True, help="batch size passed to the factory")
    add_optimizer_option(p)
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--output", "-o", required=True, help="graph file to write")
    p.add_argument("--name", help="graph name (default NAME-bsBATCH-OPTIMIZER)")
    p.add_argument("--fake", action="store_true",
                   help="build the model on the meta device (no memory; default: tried first, "
                        "real tensors if the factory needs them)")
    p.set_defaults(func=cmd_capture)
