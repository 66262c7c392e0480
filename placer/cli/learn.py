"""``placer train placeto``: train a Placeto policy on the graph families, with progress and checkpoints.

Example::

    placer train placeto --family all --episodes 2000 --output policy.pt --workers 2

writes ``policy.pt`` (loadable with ``--option policy=policy.pt`` of
``placer plan --algorithm placeto``), a checkpoint ``policy.pt.ckpt`` every
``--checkpoint-every`` updates, and the learning curve ``policy.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..cluster import load_cluster
from ..errors import OptionError
from ..graph import OpGraph
from ..io import check_output
from ..learn.families import dataset

__all__ = ["add_commands", "cmd_train"]

#: Progress lines a training run writes where its output is not a terminal.
LOG_LINES = 20


def add_commands(subparsers) -> None:
    """Add ``placer train``."""
    p = subparsers.add_parser("train", help="train a learned placement policy (placeto)")
    p.add_argument("method", choices=["placeto"], help="what to train")
    p.add_argument(
        "--family",
        default=None,
        choices=["image", "rnn", "nmt", "all", "none"],
        help="graph family of the training split (default: all three, or none with --graph)",
    )
    p.add_argument(
        "--graph",
        action="append",
        default=None,
        metavar="FILE",
        help="a graph file (placer capture's) to train on too; repeatable: with --init, fine-tunes "
        "a policy to your own models",
    )
    p.add_argument("--episodes", type=int, default=400, help="rollouts in all (default 400)")
    p.add_argument("--output", "-o", required=True, help="policy file to write (e.g. policy.pt)")
    p.add_argument(
        "--cluster",
        action="append",
        default=None,
        help="cluster preset or file to train on; repeatable (default 4xV100-nvlink)",
    )
    p.add_argument("--workers", type=int, default=1, help="processes running rollouts in parallel")
    p.add_argument("--rollouts-per-update", type=int, default=4, help="rollouts whose gradients make one update")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam's initial learning rate, decayed linearly to 1/30 of it (default 3e-3)",
    )
    p.add_argument("--passes", type=int, default=None, help="visits of every node per episode (n)")
    p.add_argument("--discount", type=float, default=None, help="discount of later rewards (1.0: the paper's sum)")
    p.add_argument("--target-nodes", type=int, default=None, help="merged graph size the policy walks")
    p.add_argument("--checkpoint-every", type=int, default=25, help="updates between checkpoints (0: none)")
    p.add_argument(
        "--init",
        help="policy file to start from, with its network sizes and its settings where "
        "not given here (default: fresh weights)",
    )
    p.add_argument("--curve", help="learning-curve PNG (default: OUTPUT with .png)")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:

    from ..learn.policy import PlacetoPolicy  # deferred: imports torch
    from ..learn.train import TrainConfig, plot_curve, save_result, train  # deferred: imports torch

    if args.seed < 0:
        raise OptionError(f"--seed must be >= 0, got {args.seed}")
    init = PlacetoPolicy.load(args.init) if args.init else None
    settings = dict(
        episodes=args.episodes,
        rollouts_per_update=args.rollouts_per_update,
        workers=args.workers,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
    )
    if init is not None:  # its network's sizes, and how it walked and weighed rewards, unless given here
        trained = init.metadata.get("train_config", {})
        settings.update(
            policy=init.config.to_dict(),
            **{key: trained[key] for key in ("passes", "target_nodes", "discount") if key in trained},
        )
    if args.lr is not None:
        settings.update(lr=args.lr, lr_final=args.lr * TrainConfig.lr_final / TrainConfig.lr)
    for key in ("passes", "discount", "target_nodes"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    config = TrainConfig(**settings)
    config.check()
    inputs = [args.init, *(args.graph or [])]
    output = check_output(args.output, "policy file", inputs=inputs)  # before the training, not after it
    output.parent.mkdir(parents=True, exist_ok=True)  # its checkpoints go beside it while training
    curve_path = check_output(args.curve or output.with_suffix(".png"), "learning-curve file", inputs=inputs)
    if curve_path.resolve() == output.resolve():
        raise OptionError(f"the learning curve and the policy would both be written to {output}; pass --curve")
    if curve_path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise OptionError(f"--curve {curve_path}: the learning curve is a .png, .pdf or .svg picture")
    clusters = args.cluster or ["4xV100-nvlink"]
    for name in clusters:
        load_cluster(name)
    family = args.family or ("none" if args.graph else "all")
    graphs = [] if family == "none" else dataset(family, "train")
    graphs += [OpGraph.load(path) for path in args.graph or []]
    if not graphs:
        raise OptionError("--family none leaves no graph to train on: pass --graph FILE or another --family")
    what = " + ".join(([] if family == "none" else [family]) + ([f"{len(args.graph)} file(s)"] if args.graph else []))
    updates = max(1, config.episodes // config.rollouts_per_update)
    # What runs: whole updates (--episodes 10 at 4 a update ran 8; 2 ran 4).
    print(
        f"training placeto on {len(graphs)} graphs ({what}) x {', '.join(map(str, clusters))}: "
        f"{updates * config.rollouts_per_update} episodes in {updates} updates, {config.workers} worker(s), "
        f"seed {config.seed}"
    )
    logged = not sys.stdout.isatty()  # a log file: the bar would show only once, at the end
    with Progress(
        TextColumn("[bold]placeto"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} updates"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=logged,
    ) as bar:
        task = bar.add_task("train", total=updates, status="")

        def progress(update: int, total: int, row: dict) -> None:
            status = f"return {row['return']:+.3f}  speedup {row['speedup']:.3f}x"
            bar.update(task, completed=update, status=status)
            if logged and (update % max(1, total // LOG_LINES) == 0 or update == total):
                print(f"update {update}/{total}: {status}, {row['seconds']:.0f} s", flush=True)

        checkpoint = output.with_name(output.name + ".ckpt")
        began = time.time()
        try:
            result = train(graphs, clusters, config, policy=init, checkpoint=checkpoint, progress=progress)
        except KeyboardInterrupt:
            _tell_checkpoint(output, checkpoint, began)
            raise
    save_result(result, output, config)
    plot_curve(result.curve, curve_path, title=f"Placeto on {what} graphs ({config.episodes} episodes)")
    k = max(1, len(result.curve["return"]) // 10)
    first = sum(result.curve["return"][:k]) / k
    last = sum(result.curve["return"][-k:]) / k
    print(
        f"trained in {result.seconds:.1f} s; mean return {first:+.3f} (first tenth) -> {last:+.3f} (last tenth); "
        f"policy -> {output}, curve -> {curve_path}"
    )
    return 0


def _tell_checkpoint(output: Path, checkpoint: Path, began: float) -> None:
    """After an interrupted training: that no policy was written, and the checkpoint to go on from."""
    from ..learn.policy import PlacetoPolicy  # deferred: imports torch

    if checkpoint.is_file() and checkpoint.stat().st_mtime >= began:
        update = PlacetoPolicy.load(checkpoint).metadata["curve"]["update"][-1]
        print(
            f"placer train: no policy written to {output}; {checkpoint} holds the weights after update "
            f"{update} (go on with --init {checkpoint}: the learning rate and entropy schedules start again)",
            file=sys.stderr,
        )
    else:
        print(f"placer train: no policy written to {output}, and no checkpoint yet", file=sys.stderr)
