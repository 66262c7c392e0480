"""What several commands share: which cluster a plan file is checked on, and errors that name the plan."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ..cluster import PRESETS, load_cluster
from ..errors import OptionError, PlacerError
from ..show import terminal

__all__ = ["cluster_for_plan", "naming_plan", "add_microbatches_option", "check_microbatches_flag"]


def cluster_for_plan(plan, path: str, cluster=None, spec: str | None = None):
    """The cluster to check the plan at ``path`` on: ``cluster`` (loaded from ``--cluster spec``), else the
    one the plan names, which must have the figures the plan was made for where the plan records them."""

    if cluster is not None:
        if plan.cluster_digest and cluster.digest() != plan.cluster_digest:
            # Not an error: a plan may be simulated on other clusters on purpose.
            print(
                f"placer: note: plan {path} was made for cluster {plan.cluster_name!r}, whose figures differ "
                f"from those of --cluster {spec or terminal(cluster.name)}",
                file=sys.stderr,
            )
        return cluster
    name = plan.cluster_name
    if not name:
        raise OptionError(f"plan {path} names no cluster; pass --cluster")
    if name not in PRESETS and not Path(name).is_file():
        raise OptionError(
            f'plan {path} was made for cluster {name!r} (its "cluster" field), which is no preset '
            f"and no file; pass --cluster FILE"
        )
    cluster = load_cluster(name)
    if plan.cluster_digest and cluster.digest() != plan.cluster_digest:
        raise OptionError(
            f'plan {path} was made for cluster {name!r} (its "cluster" field) with other figures '
            f"than the {'preset' if name in PRESETS else 'file'} {name!r}; pass --cluster FILE"
        )
    return cluster


@contextlib.contextmanager
def naming_plan(path: str, plan, cluster):
    """Errors from checking the plan at ``path`` name it, and the cluster it was made for where another is used."""
    try:
        yield
    except PlacerError as exc:
        other = ""
        if plan.cluster_name and plan.cluster_name != cluster.name:
            other = f" (the plan was made for cluster {plan.cluster_name!r}, not {cluster.name!r})"
        raise type(exc)(f"{path}: {exc}{other}") from None


def add_microbatches_option(p: argparse.ArgumentParser) -> None:
    """``--microbatches M``: the step placed cut into ``M`` micro-batches (``placer plan``, ``compare``, ``tune``)."""
    p.add_argument(
        "--microbatches",
        type=int,
        metavar="M",
        help="place the step cut into M micro-batches, gradients accumulated (every algorithm pipelines)",
    )


def check_microbatches_flag(args: argparse.Namespace) -> None:
    """``--microbatches`` refused before a model is captured: below 1, or above a model spec's ``--batch``."""
    m = args.microbatches
    if m is not None and m < 1:
        raise OptionError(f"--microbatches must be >= 1, got {m}")
    if m is not None and getattr(args, "batch", None) and m > args.batch:
        raise OptionError(
            f"--microbatches {m} cuts a batch of {args.batch} samples (--batch): at most {args.batch}, one sample each"
        )
