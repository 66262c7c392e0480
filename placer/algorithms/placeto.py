"""Placeto: a learned policy places a graph it has never seen in one walk over it.

The policy (:mod:`placer.learn.policy`) was trained with REINFORCE on the
graph families of :mod:`placer.learn.families` against placer's simulator
(:mod:`placer.learn.train`); a small trained policy ships with the package,
so placing is zero-shot: one greedy episode of Placeto's MDP over the graph
reduced to the policy's size, starting from the best of one device, the
expert split and METIS. With ``fine_tune_s`` (or
``fine_tune_episodes``) the policy is first trained further on the graph
being placed, the paper's "fine-tuning" setting.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..cluster import Cluster
from ..errors import FormatError, InfeasibleError, InvalidPlanError, OptionError
from ..feasibility import static_footprint
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import simulate
from .baselines import expert
from .common import linked_devices, placement_units, unit_allowed
from .registry import register
from .timebox import OPTIONAL_SHARE, TimeBox, seconds_left

__all__ = ["placeto", "SHIPPED_POLICY", "load_policy"]

#: The pre-trained policy shipped with the package (see docs/benchmarks.md, "Placeto").
SHIPPED_POLICY = Path(__file__).resolve().parent.parent / "learn" / "policy.pt"
#: What a walk over the reduced graph does with the policy's choices (the ``walk`` option).
WALKS = ("mdp", "climb")
#: Share of a time limit the walks (and fine-tuning) may take; the rest is for a memory repair and the plan.
WALK_SHARE = 0.9


@lru_cache(maxsize=4)
def _cached_policy(path: str, mtime: float):
    from ..learn.policy import PlacetoPolicy  # deferred: imports torch

    return PlacetoPolicy.load(path)


def load_policy(path: str | os.PathLike | None = None):
    """The policy in ``path`` (the shipped one when None or empty), cached while the file is unchanged.

    Raises
    ------
    OptionError
        If the file does not exist or is not a policy file.
    """
    path = Path(path) if path else SHIPPED_POLICY
    if not path.exists():
        raise OptionError(f"option policy of 'placeto': no policy file {str(path)!r}")
    try:
        return _cached_policy(str(path), path.stat().st_mtime)
    except FormatError as exc:
        raise OptionError(f"option policy of 'placeto': {exc}") from None


def _import_torch(options: dict) -> None:
    """Import the policy's and the walks' code, and torch with it, before the time limit starts: a
    process's first call would otherwise spend a short limit on the import and fail where the next call
    succeeds. For fine-tuning, also what torch.optim imports on its first optimizer (torch._dynamo,
    an import a time limit cannot cut short).
    """
    from ..learn import policy, train  # noqa: F401

    if options.get("fine_tune_s") or options.get("fine_tune_episodes"):
        import torch  # deferred: imports torch

        torch.optim.Adam([torch.zeros(1, requires_grad=True)])


@register("placeto", prepare=_import_torch)
def placeto(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    policy: str = "",
    samples: int = 0,
    fine_tune_s: float = 0.0,
    fine_tune_episodes: int = 0,
    passes: int = 0,
    target_nodes: int = 0,
    walk: str = "mdp",
) -> Plan:
    """Placeto's learned policy, zero-shot or fine-tuned on the graph (Addanki et al., NeurIPS 2019).

    The graph is reduced to ``target_nodes`` nodes (Merge-and-Colocate, then
    slabs of heights where it stops above that: :func:`placer.learn.reduce.reduce_graph`,
    so that a captured step of thousands of operations is walked at the size
    the policy was trained on); the policy then walks them in topological
    order ``passes`` times, starting from the best simulated of one device
    (where the step fits on one), the expert split and METIS, and moving each
    node to its likeliest device; every step is simulated on the original
    graph and the walk's best placement is kept (Placeto's MDP), so the plan
    is never slower than its start. A placement that does not fit in memory
    is repaired: units on an over-full device move to the allowed device with
    room that the policy liked best (failing that, the memory-aware expert split
    is used), and ``plan.extra["placeto"]`` says so.

    Parameters
    ----------
    graph, cluster
    seed : int
        Seeds fine-tuning's sampling; zero-shot placement is deterministic.
    time_limit : float, optional
        Seconds; the walks stop at :data:`WALK_SHARE` of it and keep their best placement so far.
    policy : str
        A policy file written by ``placer train placeto`` ('' = the shipped one).
    samples : int
        Walks sampled from the policy (seeded by ``seed``) besides the greedy
        one; the best placement of all is kept.
    fine_tune_s : float
        Seconds of REINFORCE on this graph (0 = zero-shot); the plan is the best
        placement of the tuned policy's walk and of the fine-tuning rollouts, if
        better than the zero-shot one. The result then depends on how many
        updates fit in the time.
    fine_tune_episodes : int
        Episodes of fine-tuning instead (deterministic for a seed); with
        ``fine_tune_s`` too, whichever ends first.
    passes : int
        Visits of every node in the walk (``n`` of the paper; 0 = as the policy was trained).
    target_nodes : int
        Size of the merged graph the policy walks (0 = as the policy was trained).
    walk : {"mdp", "climb"}
        ``"mdp"``: Placeto's walk, every move the policy picks kept (the
        walk's best placement is the plan). ``"climb"``: a local search the
        policy guides (:meth:`~placer.learn.train.PlacementMDP.climb`): each
        node tries the policy's favourite other device and the move stays
        only if the simulated step gets faster; not the paper's method, and
        ``samples`` does not apply.

    Returns
    -------
    Plan
        ``extra["placeto"]`` holds the start's name (``start``) and makespan
        (``start_makespan_s``) beside the walk's (``zero_shot_makespan_s``)
        and their ratio (``policy_gain``: the policy's own gain over its
        start), a ``note`` where the moves gained nothing, the fine-tuned
        makespan, the reduced graph's size and how it was reduced, and
        whether memory repair ran.

    Raises
    ------
    OptionError
        Bad option values or an unreadable policy file.
    InfeasibleError
        If neither the policy's placement nor its repair fits the devices' memory.

    References
    ----------
    Addanki, Bojja Venkatakrishnan, Gupta, Mao, Alizadeh, "Placeto: Learning
    Generalizable Device Placement Algorithms for Distributed Machine Learning",
    NeurIPS 2019, Section 3 (MDP, policy network), appendix A.1 (REINFORCE),
    A.6 (Merge-and-Colocate), A.7 (training and reward).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.learn.families import family_graph
    >>> plan = placeto(family_graph("nmt", 0), load_cluster("4xV100-nvlink"))
    >>> sorted(set(plan.placement.values())) <= ['gpu0', 'gpu1', 'gpu2', 'gpu3']
    True
    """
    began = time.perf_counter()
    if not (isinstance(fine_tune_s, (int, float)) and math.isfinite(fine_tune_s) and fine_tune_s >= 0):
        raise OptionError(f"option fine_tune_s of 'placeto' must be a number of seconds >= 0, got {fine_tune_s!r}")
    for name, value in (
        ("samples", samples),
        ("fine_tune_episodes", fine_tune_episodes),
        ("passes", passes),
        ("target_nodes", target_nodes),
    ):
        if value < 0:
            raise OptionError(f"option {name} of 'placeto' must be an integer >= 0, got {value!r}")
    net = load_policy(policy)
    trained = net.metadata.get("train_config", {})
    passes = passes or int(trained.get("passes", 2))
    target_nodes = target_nodes or int(trained.get("target_nodes", 24))
    # The walks stop at WALK_SHARE of the limit: a memory repair and the plan come after them.
    deadline = None if time_limit is None else began + WALK_SHARE * time_limit
    if walk not in WALKS:
        raise OptionError(f"option walk of 'placeto' must be one of {', '.join(WALKS)}, got {walk!r}")
    if graph.num_nodes == 0:
        return Plan.from_arrays(graph, cluster, np.zeros(0, dtype=np.int64))

    from ..learn.policy import one_thread  # deferred: imports torch

    with one_thread():
        mdp, best, info = _place_with_policy(
            graph,
            cluster,
            net,
            trained,
            seed,
            deadline,
            samples,
            passes,
            target_nodes,
            fine_tune_s,
            fine_tune_episodes,
            walk,
        )
    device_of = best.best_device_of
    if not best.best_fits:
        try:
            # Under a time limit the repair (a simulation per move: seconds on thousands of nodes) takes a share
            # of what is left, and the expert split the rest.
            left = seconds_left()
            repaired = None
            with TimeBox(None if left is None else OPTIONAL_SHARE * left) as box:
                repaired = _repair_memory(graph, cluster, mdp, device_of, best.best_probs.numpy())
            if repaired is None:
                raise InfeasibleError("placeto: the memory repair ran out of its share of the time limit")
            device_of = repaired
            info["memory_repair"] = (
                "the policy's placement exceeded device memory; units moved to the devices "
                "with room the policy preferred"
            )
        except (InfeasibleError, InvalidPlanError):  # no room elsewhere, a send no channel carries, or no time
            try:
                fallback = expert(graph, cluster, seed=seed)
            except InfeasibleError as exc:
                raise InfeasibleError(
                    f"placeto: the policy's placement is invalid or overflows device memory, and "
                    f"the expert split it falls back to fails too ({exc})"
                ) from None
            device_of = np.array([cluster.device_index[fallback.placement[i]] for i in graph.ids], dtype=np.int64)
            info["memory_repair"] = (
                "the policy's placement exceeded device memory (or sent between devices no "
                "channel links) and could not be repaired"
                + (" within its share of the time limit" if box.expired else "")
                + "; the expert split (memory-aware) was used instead"
            )
    return Plan.from_arrays(graph, cluster, device_of, extra={"placeto": info})


def _place_with_policy(
    graph: OpGraph,
    cluster: Cluster,
    net,
    trained: dict,
    seed: int,
    deadline: float | None,
    samples: int,
    passes: int,
    target_nodes: int,
    fine_tune_s: float,
    fine_tune_episodes: int,
    walk: str = "mdp",
):
    """The placement problem, the best episode of the walks (fine-tuned first where asked), and what to
    report of them.

    Fine-tuning is optional work: where the deadline cuts it (an update or
    the tuned policy's walk), the zero-shot walks' placement stands.
    """
    from ..learn.train import PlacementMDP, TrainConfig, train  # deferred: imports torch

    mdp = PlacementMDP(graph, cluster, target_nodes=target_nodes)
    best = _walks(mdp, net, passes, samples, seed, deadline, walk)
    info = {
        "merged_nodes": mdp.ctx.num_nodes,
        "reduction": "+".join(mdp.coarse.stages),
        "walk": walk,
        "start": mdp.start_name,
        "start_makespan_s": best.start_makespan_s,
        "zero_shot_makespan_s": best.best_makespan_s,
        "policy_gain": best.start_makespan_s / best.best_makespan_s if best.best_makespan_s > 0 else 1.0,
    }
    if not best.best_makespan_s < best.start_makespan_s:
        info["note"] = f"the policy's moves gained nothing over its start ({mdp.start_name})"
    if fine_tune_s <= 0 and fine_tune_episodes <= 0:
        return mdp, best, info
    budget = [deadline] if deadline is not None else []
    if fine_tune_s > 0:
        budget.append(time.perf_counter() + fine_tune_s)
    lr = float(trained.get("lr", 3e-3))
    config = TrainConfig(
        episodes=fine_tune_episodes or 10**9,
        rollouts_per_update=1,
        workers=1,
        passes=passes,
        target_nodes=target_nodes,
        seed=seed,
        checkpoint_every=0,
        lr=lr,
        lr_final=lr,
        discount=float(trained.get("discount", 0.9)),
        entropy=0.0,
        entropy_final=0.0,
        policy=net.config.to_dict(),
    )
    with TimeBox(None if deadline is None else deadline - time.perf_counter()) as box:
        result = train([graph], [cluster], config, policy=copy.deepcopy(net), deadline=min(budget) if budget else None)
        tuned = _walks(mdp, result.policy, passes, samples, seed, deadline, walk)
    if box.expired:
        info["fine_tune"] = "cut short by the time limit: the zero-shot placement stands"
        return mdp, best, info
    # The best of the tuned policy's walk and of every placement the fine-tuning rollouts found.
    found = [(not tuned.best_fits, tuned.best_cost, tuned.best_makespan_s, tuned.best_device_of)]
    found += list(result.best.values())
    choice = min(found, key=lambda f: f[:2])
    info.update(
        fine_tune_episodes=len(result.curve["return"]), fine_tune_s=result.seconds, fine_tuned_makespan_s=choice[2]
    )
    if choice[2] < best.start_makespan_s:
        info.pop("note", None)
    if choice[:2] < (not best.best_fits, best.best_cost):
        best = dataclasses.replace(
            best, best_fits=not choice[0], best_cost=choice[1], best_makespan_s=choice[2], best_device_of=choice[3]
        )
    return mdp, best, info


def _walks(mdp, net, passes: int, samples: int, seed: int, deadline: float | None, walk: str = "mdp"):
    """The greedy walk and ``samples`` sampled ones; the episode with the best placement (or the policy's
    local search, for ``walk="climb"``)."""
    import torch  # deferred: imports torch

    if walk == "climb":
        return mdp.climb(net, passes=passes, deadline=deadline)

    best = None
    with torch.no_grad():
        for k in range(samples + 1):
            if best is not None and deadline is not None and time.perf_counter() > deadline:
                break
            generator = None if k == 0 else torch.Generator().manual_seed(seed * 7919 + k)
            ep = mdp.episode(net, passes=passes, generator=generator, deadline=deadline)
            if best is None or (not ep.best_fits, ep.best_cost) < (not best.best_fits, best.best_cost):
                best = ep
    return best


def _repair_memory(graph: OpGraph, cluster: Cluster, mdp, device_of: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Move units off over-full devices until the placement fits, guided by simulation and the policy.

    While some device's simulated peak exceeds its memory, the unit with the
    largest static footprint on the most over-full device that fits elsewhere
    moves to the device the policy liked best among the allowed ones with
    room for it that channels link to its neighbours' devices.

    Raises
    ------
    InfeasibleError
        If no unit of an over-full device fits anywhere else.
    InvalidPlanError
        If ``device_of`` sends between devices that no channel links (no walk found a valid placement).
    """
    unit_of, units = placement_units(graph)
    allowed = unit_allowed(graph, cluster, units)
    footprint = np.bincount(unit_of, weights=static_footprint(graph), minlength=len(units))
    preference = np.array([probs[mdp.coarse.group_of[members]].sum(axis=0) for members in units])
    memory, linked = cluster.memory.astype(np.float64), cluster.linked
    out = device_of.copy()
    for _ in range(4 * len(units)):
        result = simulate(graph, cluster, out, check=False)
        over = result.peak_memory_bytes - memory
        if np.all(over <= 0):
            return out
        j = int(np.argmax(over))
        room = memory - result.peak_memory_bytes
        unit_device = out[[members[0] for members in units]]
        for u in sorted(np.flatnonzero(unit_device == j).tolist(), key=lambda u: -footprint[u]):
            out[units[u]] = -1  # (unplaced while asking where its neighbours' devices link it)
            linkable = linked_devices(graph, linked, out, units[u])
            out[units[u]] = j
            targets = np.flatnonzero(allowed[u] & (room >= footprint[u]) & (np.arange(len(memory)) != j) & linkable)
            if targets.size:
                out[units[u]] = int(targets[np.argmax(preference[u, targets])])
                break
        else:
            break
    raise InfeasibleError("placeto: the policy's placement overflows device memory and moving units did not fix it")
