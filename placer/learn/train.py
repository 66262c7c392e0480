"""Placeto's MDP and its REINFORCE training against placer's reference simulator.

The MDP (Addanki et al., Placeto, NeurIPS 2019, Section 3 and appendix A):
the graph is first reduced to the policy's size (Merge-and-Colocate, A.6,
then slabs of heights where it stops above it: :mod:`placer.learn.reduce`);
an episode starts from a strong placement (the best simulated of one
device, the expert split and METIS; the paper starts from a trivial one)
and visits the coarse nodes in topological order ``passes`` times
(``n|V|`` steps, A.7 "MDP"), each step moving one node (with the nodes
colocated with it) to the device the policy samples. After every step the
original graph, placed by expanding the coarse placement, is simulated by
:func:`placer.sim.simulate`; the memory-penalised cost is

    R(p) = makespan(p) / makespan(p_0) + c * sum_d ReLU(peak_d / M_d - 1)

(A.7 "Reward", with the makespan measured in units of the starting
placement's so that graphs of any size weigh alike, and the excess memory as
a fraction of each device's), and the intermediate reward of step ``t`` is
the improvement ``R(p_{t-1}) - R(p_t)`` (A.4).

Training is REINFORCE (A.1, equation 1) with a separate moving-average
baseline per step of the episode: the mean return at step ``t`` of the last
``k`` episodes on the same graph (A.7 "Baselines"), an entropy bonus decaying
linearly, Adam with a linearly decaying learning rate, and the gradients of
several rollouts summed per update; rollouts run in worker processes when
``workers > 1`` (A.7 "Workers"), with results identical to a serial run.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..cluster import Cluster, load_cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError
from ..graph import OpGraph
from ..io import write_atomic
from ..sim.simulator import simulate
from .policy import GraphContext, PlacetoPolicy, PolicyConfig, one_thread
from .reduce import reduce_graph

#: Where an episode may start (:class:`PlacementMDP`).
STARTS = ("best", "round_robin")

__all__ = ["PlacementMDP", "Episode", "TrainConfig", "TrainResult", "train", "save_result", "plot_curve"]


@dataclass
class Episode:
    """One walk over the graph.

    Attributes
    ----------
    log_probs, entropies : list of Tensor
        Of the action taken and of the distribution, per step.
    rewards : ndarray
        ``R(p_{t-1}) - R(p_t)`` per step.
    best_device_of : ndarray of int
        Device of every original node in the best placement seen (lowest R,
        placements that fit memory first), the starting one included.
    best_cost, start_cost, final_cost : float
    best_makespan_s, start_makespan_s : float
    best_fits : bool
    best_probs : Tensor (N, D)
        The policy's distribution for each coarse node at its last visit (for memory repair).
    """

    log_probs: list
    entropies: list
    rewards: np.ndarray
    best_device_of: np.ndarray
    best_cost: float
    start_cost: float
    final_cost: float
    best_makespan_s: float
    start_makespan_s: float
    best_fits: bool
    best_probs: torch.Tensor


class PlacementMDP:
    """Placeto's MDP for one graph on one cluster.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    target_nodes : int
        Size of the coarse graph the policy walks (:func:`~placer.learn.reduce.reduce_graph`).
    memory_penalty : float
        ``c`` of the memory-penalised reward.
    start : {"best", "round_robin"}
        Where every episode starts: the best simulated of one device, the
        expert split and METIS, or the coarse nodes dealt round robin.

    Attributes
    ----------
    start_name : str
        The starting placement's name.
    start_device_of : ndarray of int
        The starting placement of every original node.
    start : LongTensor
        Its coarse view (:meth:`coarse_view`).
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        *,
        target_nodes: int = 24,
        memory_penalty: float = 2.0,
        start: str = "best",
    ):
        if start not in STARTS:
            raise OptionError(f"option start must be one of {', '.join(STARTS)}, got {start!r}")
        self.graph = graph
        self.cluster = cluster
        self.memory_penalty = memory_penalty
        self.coarse = reduce_graph(graph, target_nodes, cluster=cluster)
        coarse = self.coarse.graph
        self.ctx = GraphContext(coarse, cluster)
        n = coarse.num_nodes
        self.tie = [np.array([v]) for v in range(n)]
        for members in coarse.colocation_groups.values():
            for v in members.tolist():
                self.tie[v] = members
        group_of = self.coarse.group_of
        allowed = np.ones((n, cluster.num_devices), dtype=bool)
        np.logical_and.at(allowed, group_of, graph.allowed(cluster))
        self.allowed = torch.as_tensor(np.array([allowed[t].all(axis=0) for t in self.tie]).reshape(n, -1))
        # Original nodes each coarse node (with those tied to it) moves.
        order = np.argsort(group_of, kind="stable")
        bounds = np.searchsorted(group_of[order], np.arange(n + 1))
        own = [order[bounds[v] : bounds[v + 1]] for v in range(n)]
        self.moves = [np.concatenate([own[u] for u in t.tolist()]) for t in self.tie]
        self._weight = np.maximum(graph.compute_s, 0.0) + 1e-12  # what the coarse view's majority counts
        self.order = coarse.topological_order.tolist()
        self.memory = cluster.memory.astype(np.float64)
        self._reference = None
        self.start_s = self.finish_s = torch.zeros(n)  # the last valid placement's times (none yet)
        self.start_name, self.start_device_of = self._start(start)
        self.start = self.coarse_view(self.start_device_of)
        reference = self.cost_of(self.start_device_of)[1]
        self._reference = reference if math.isfinite(reference) else None

    def _start(self, how: str) -> tuple[str, np.ndarray]:
        """The starting placement of every original node, and its name.

        ``"best"``: the best simulated of one device (where the step fits on
        one), the expert split and METIS, fitting placements first; round
        robin where none of them can be built. The walk keeps its best
        placement, so it ends no slower than this start.
        """
        if how == "best":
            from ..algorithms.baselines import expert, metis, single  # deferred: the registry imports placer.learn

            found = []
            for name, algorithm in (("single", single), ("expert", expert), ("metis", metis)):
                try:
                    plan = algorithm(self.graph, self.cluster)
                except (InfeasibleError, InvalidPlanError):
                    continue
                index = self.cluster.device_index
                device_of = np.array([index[plan.placement[i]] for i in self.graph.ids], dtype=np.int64)
                _, span, fits, _ = self.cost_of(device_of)
                if math.isfinite(span):
                    found.append(((not fits, span), name, device_of))
            if found:
                _, name, device_of = min(found, key=lambda f: f[0])
                return name, device_of
        device_of = self.coarse.expand(self._round_robin().numpy())
        if self.cost_of(device_of)[1] == math.inf:
            # Round robin sends between devices no channel connects: start from each node's first device.
            first = torch.as_tensor(self.allowed.to(torch.int8).argmax(dim=1), dtype=torch.int64)
            return "first allowed device", self.coarse.expand(first.numpy())
        return "round robin", device_of

    def coarse_view(self, device_of: np.ndarray) -> torch.Tensor:
        """The device of each coarse node: where most of its members' compute time runs."""
        n, d = self.ctx.num_nodes, self.ctx.num_devices
        load = np.zeros((n, d))
        np.add.at(load, (self.coarse.group_of, device_of), self._weight)
        return torch.as_tensor(load.argmax(axis=1), dtype=torch.int64)

    def _round_robin(self) -> torch.Tensor:
        """Coarse nodes dealt to their allowed devices in turn, in topological order (``start="round_robin"``)."""
        n, d = self.ctx.num_nodes, self.ctx.num_devices
        start = torch.full((n,), -1, dtype=torch.int64)
        allowed = self.allowed.numpy()
        turn = 0
        for v in self.order:
            if start[v] >= 0:
                continue
            for k in range(d):
                j = (turn + k) % d
                if allowed[v, j]:
                    break
            start[self.tie[v]] = j
            turn = j + 1
        return start

    def cost(self, coarse_placement: torch.Tensor) -> tuple[float, float, bool, np.ndarray]:
        """``(R, makespan_s, fits, device_of)`` of a coarse placement, simulated on the original graph."""
        return self.cost_of(self.coarse.expand(coarse_placement.numpy()))

    def cost_of(self, device_of: np.ndarray) -> tuple[float, float, bool, np.ndarray]:
        """``(R, makespan_s, fits, device_of)`` of a placement of the original graph, simulated.

        Also keeps the coarse nodes' simulated start and finish in ``self.start_s`` and ``self.finish_s``.
        """
        try:
            result = simulate(self.graph, self.cluster, device_of, check=False)
        except InvalidPlanError:  # a transfer between devices no channel connects
            return math.inf, math.inf, False, device_of
        span = result.makespan_s
        m = self.ctx.num_nodes
        start = np.full(m, np.inf)
        np.minimum.at(start, self.coarse.group_of, result.start)
        start[np.isinf(start)] = 0.0  # a coarse node whose members all follow another's device
        finish = np.zeros(m)
        np.maximum.at(finish, self.coarse.group_of, result.finish)
        self.start_s = torch.as_tensor(start, dtype=torch.float32)
        self.finish_s = torch.as_tensor(finish, dtype=torch.float32)
        over = np.maximum(result.peak_memory_bytes / self.memory - 1.0, 0.0).sum()
        ref = self._reference or span or 1.0
        return span / ref + self.memory_penalty * float(over), span, bool(over == 0), device_of

    def episode(
        self,
        policy: PlacetoPolicy,
        *,
        passes: int = 2,
        generator: torch.Generator | None = None,
        deadline: float | None = None,
    ) -> Episode:
        """Walk the graph ``passes`` times; sample actions with ``generator``, or take the likeliest without one.

        Stops early (keeping what it has) when ``time.perf_counter()`` passes ``deadline``.
        """
        placement = self.start.clone()
        cost, span, fits, device_of = self.cost_of(self.start_device_of.copy())
        start_cost, start_span = cost, span
        best = (not fits, cost, span, fits, device_of)
        log_probs, entropies, rewards = [], [], []
        probs = torch.zeros(self.ctx.num_nodes, self.ctx.num_devices)
        for _ in range(passes):
            if deadline is not None and time.perf_counter() > deadline:
                break
            visited = torch.zeros(self.ctx.num_nodes)
            for v in self.order:
                if deadline is not None and time.perf_counter() > deadline:
                    break
                logp = policy(self.ctx, placement, v, visited, self.allowed[v], self.start_s, self.finish_s, span)
                p = logp.exp()
                if generator is None:
                    action = int(torch.argmax(logp))
                else:
                    action = int(torch.multinomial(p.detach(), 1, generator=generator))
                probs[v] = p.detach()
                log_probs.append(logp[action])
                entropies.append(-(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum())
                visited[v] = 1.0
                if int(placement[v]) != action:
                    placement[self.tie[v]] = action
                    device_of = device_of.copy()
                    device_of[self.moves[v]] = action
                    new_cost, span, fits, device_of = self.cost_of(device_of)
                    if new_cost == math.inf:
                        new_cost = cost + 1.0
                    rewards.append(cost - new_cost)
                    cost = new_cost
                    candidate = (not fits, cost, span, fits, device_of)
                    if candidate[:2] < best[:2]:
                        best = candidate
                else:
                    rewards.append(0.0)
        return Episode(
            log_probs,
            entropies,
            np.asarray(rewards, dtype=np.float64),
            best[4],
            best[1],
            start_cost,
            cost,
            best[2],
            start_span,
            best[3],
            probs,
        )

    def climb(self, policy: PlacetoPolicy, *, passes: int = 1, deadline: float | None = None) -> Episode:
        """A local search the policy guides: each coarse node, in topological order, tries the device the
        policy likes best after its current one, and the move stays only if the simulated cost falls.

        Not Placeto's MDP (whose walk keeps every move and learns from the
        rewards); it uses the trained policy as a ranking of moves, and ends no
        worse than its start. Stops early (keeping what it has) when
        ``time.perf_counter()`` passes ``deadline``.
        """
        placement = self.start.clone()
        cost, span, fits, device_of = self.cost_of(self.start_device_of.copy())
        start_cost, start_span = cost, span
        probs = torch.zeros(self.ctx.num_nodes, self.ctx.num_devices)
        with torch.no_grad():
            for _ in range(passes):
                visited = torch.zeros(self.ctx.num_nodes)
                for v in self.order:
                    if deadline is not None and time.perf_counter() > deadline:
                        break
                    logp = policy(self.ctx, placement, v, visited, self.allowed[v], self.start_s, self.finish_s, span)
                    probs[v] = logp.exp()
                    visited[v] = 1.0
                    ranked = torch.argsort(logp, descending=True).tolist()
                    other = [a for a in ranked if a != int(placement[v]) and bool(self.allowed[v, a])]
                    if not other:
                        continue
                    trial = device_of.copy()
                    trial[self.moves[v]] = other[0]
                    found = self.cost_of(trial)
                    if (not found[2], found[0]) < (not fits, cost):
                        cost, span, fits, device_of = found
                        placement[self.tie[v]] = other[0]
                    else:
                        self.cost_of(device_of)  # the kept placement's times, for the next node's features
        return Episode([], [], np.zeros(0), device_of, cost, start_cost, cost, span, start_span, fits, probs)


# ------------------------------------------------------------------ training
@dataclass
class TrainConfig:
    """Settings of a training run (saved with the policy).

    Attributes
    ----------
    episodes : int
        Rollouts in all (each on one graph); ``episodes // rollouts_per_update`` updates.
    rollouts_per_update : int
        Rollouts whose gradients are summed per update (one per worker in the paper).
    workers : int
        Processes running the rollouts of an update (1: in this process).
    passes : int
        ``n``: visits of every node per episode.
    target_nodes : int
        Coarse graph size (:func:`~placer.learn.reduce.reduce_graph`).
    lr, lr_final : float
        Adam's learning rate, decayed linearly to ``lr_final``.
    entropy, entropy_final : float
        Entropy bonus, decayed linearly.
    memory_penalty : float
        ``c`` of the reward.
    baseline_window : int
        ``k``: episodes in the moving-average baseline.
    discount : float
        Weight of a reward ``s`` steps later in a step's return (``discount ** s``);
        1.0 is the paper's undiscounted sum, less shortens the horizon and the variance.
    normalize_advantages : bool
        Divide each rollout's advantages by their standard deviation.
    start : {"best", "round_robin"}
        Where episodes start (:class:`PlacementMDP`).
    checkpoint_every : int
        Updates between checkpoints (0: none).
    seed : int
    """

    episodes: int = 400
    rollouts_per_update: int = 4
    workers: int = 1
    passes: int = 2
    target_nodes: int = 24
    lr: float = 3e-3
    lr_final: float = 1e-4
    entropy: float = 0.02
    entropy_final: float = 0.001
    memory_penalty: float = 2.0
    baseline_window: int = 10
    discount: float = 0.9
    normalize_advantages: bool = False
    start: str = "best"
    checkpoint_every: int = 25
    seed: int = 0
    policy: dict = field(default_factory=lambda: PolicyConfig().to_dict())

    def check(self) -> None:
        for name in ("episodes", "rollouts_per_update", "workers", "passes", "target_nodes", "baseline_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"option {name} must be an integer >= 1, got {value!r}")
        if self.start not in STARTS:
            raise OptionError(f"option start must be one of {', '.join(STARTS)}, got {self.start!r}")
        if not 0 < self.discount <= 1:
            raise OptionError(f"option discount must be in (0, 1], got {self.discount!r}")
        for name in ("lr", "lr_final", "entropy", "entropy_final", "memory_penalty"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise OptionError(f"option {name} must be a number >= 0, got {value!r}")
        if not self.lr > 0:  # 0 would not hold the weights: the rate rises linearly to lr_final
            raise OptionError(f"option lr must be > 0, got {self.lr!r}")
        if (
            isinstance(self.checkpoint_every, bool)
            or not isinstance(self.checkpoint_every, int)
            or self.checkpoint_every < 0
        ):  # -1 checkpointed after every update
            raise OptionError(f"option checkpoint_every must be an integer >= 0, got {self.checkpoint_every!r}")


@dataclass
class TrainResult:
    """A trained policy and its learning curve.

    Attributes
    ----------
    policy : PlacetoPolicy
    curve : dict of lists
        Per update: ``update``, ``episodes``, ``return`` (mean episode return:
        the improvement of R over the episode), ``speedup`` (mean starting
        makespan over the episode's best), ``seconds`` since the start.
    seconds : float
    best : dict
        ``(graph index, cluster index)`` -> ``(overflows memory, R, makespan_s, device_of)``
        of the best placement any rollout found (fine-tuning keeps it).
    graphs, clusters : list of str
        Names of the graphs and clusters trained on (saved with the policy, so that a
        benchmark can tell which graphs are held out).
    """

    policy: PlacetoPolicy
    curve: dict
    seconds: float
    best: dict = field(default_factory=dict)
    graphs: list = field(default_factory=list)
    clusters: list = field(default_factory=list)


# Worker state: the problems, built once per process (rollouts only send weights and indices).
_PROBLEMS: dict = {}


def _init_problems(graphs: Sequence[OpGraph], clusters: Sequence[Cluster], config: TrainConfig) -> None:
    _PROBLEMS.clear()
    _PROBLEMS.update(
        graphs=list(graphs),
        clusters=list(clusters),
        config=config,
        mdps={},
        policy=PlacetoPolicy(PolicyConfig(**config.policy)),
    )
    torch.set_num_threads(1)


def _init_worker(graphs: Sequence[OpGraph], clusters: Sequence[Cluster], config: TrainConfig) -> None:
    """Set up a pool worker; Ctrl-C is the parent's to handle.

    The terminal sends SIGINT to the workers too: one that died of it would take its
    rollout with it, and the parent, which terminates the pool, would print its traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_problems(graphs, clusters, config)


def _mdp(graph_index: int, cluster_index: int) -> PlacementMDP:
    key = (graph_index, cluster_index)
    if key not in _PROBLEMS["mdps"]:
        config = _PROBLEMS["config"]
        _PROBLEMS["mdps"][key] = PlacementMDP(
            _PROBLEMS["graphs"][graph_index],
            _PROBLEMS["clusters"][cluster_index],
            target_nodes=config.target_nodes,
            memory_penalty=config.memory_penalty,
            start=config.start,
        )
    return _PROBLEMS["mdps"][key]


def _rollout(task: tuple) -> tuple:
    """One rollout and its REINFORCE gradient: (gradients, returns, stats, best).

    The weights come and the gradients go as numpy arrays, not tensors: between processes torch
    shares a tensor's memory over a socket, which a worker terminated part way (Ctrl-C) breaks,
    and the parent prints a traceback.
    """
    state, graph_index, cluster_index, seed, baseline, entropy_coef = task
    policy = _PROBLEMS["policy"]
    policy.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    policy.zero_grad()
    mdp = _mdp(graph_index, cluster_index)
    gen = torch.Generator().manual_seed(seed)
    ep = mdp.episode(policy, passes=_PROBLEMS["config"].passes, generator=gen)
    config = _PROBLEMS["config"]
    returns = np.zeros(len(ep.rewards))
    running = 0.0
    for t in range(len(ep.rewards) - 1, -1, -1):
        running = ep.rewards[t] + config.discount * running
        returns[t] = running
    advantage = returns - (baseline if baseline is not None else 0.0)
    if config.normalize_advantages:
        advantage = advantage / (advantage.std() + 1e-8)
    steps = len(ep.log_probs)
    loss = (
        -(torch.stack(ep.log_probs) * torch.as_tensor(advantage, dtype=torch.float32)).sum() / steps
        - entropy_coef * torch.stack(ep.entropies).sum() / steps
    )
    loss.backward()
    grads = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy().copy() for p in policy.parameters()
    ]
    stats = (float(ep.rewards.sum()), ep.start_makespan_s / ep.best_makespan_s if ep.best_makespan_s > 0 else 1.0)
    best = (not ep.best_fits, ep.best_cost, ep.best_makespan_s, ep.best_device_of)
    return grads, returns, stats, best


def train(
    graphs: Sequence[OpGraph],
    clusters: Sequence[Cluster | str] = ("4xV100-nvlink",),
    config: TrainConfig = TrainConfig(),
    *,
    policy: PlacetoPolicy | None = None,
    checkpoint: str | os.PathLike | None = None,
    deadline: float | None = None,
    progress: Callable[[int, int, dict], None] | None = None,
) -> TrainResult:
    """Train a Placeto policy on ``graphs`` x ``clusters`` with REINFORCE.

    Parameters
    ----------
    graphs : sequence of OpGraph
        Training graphs; each rollout draws one, and a cluster, at random (seeded).
    clusters : sequence of Cluster or preset names
    config : TrainConfig
    policy : PlacetoPolicy, optional
        Starting weights (fine-tuning); a fresh policy seeded by ``config.seed`` otherwise.
    checkpoint : path, optional
        Where to save the policy every ``config.checkpoint_every`` updates.
    deadline : float, optional
        A ``time.perf_counter()`` value; no update starts after it.
    progress : callable, optional
        ``progress(update, updates, last_curve_row)`` after every update.

    Returns
    -------
    TrainResult

    Raises
    ------
    OptionError
        Bad settings, or no graphs.

    References
    ----------
    Williams, "Simple statistical gradient-following algorithms for connectionist RL", 1992;
    Addanki et al., Placeto (NeurIPS 2019), appendix A.1 and A.7.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> result = train([training_graph(layers=2)], config=TrainConfig(episodes=2, rollouts_per_update=1))
    >>> len(result.curve["return"])
    2
    """
    config.check()
    if not graphs:
        raise OptionError("train needs at least one graph")
    empty = next((g for g in graphs if g.num_nodes == 0), None)
    if empty is not None:
        raise OptionError(f"train: graph {empty.name!r} has no operations to place")
    clusters = [load_cluster(c) for c in clusters]
    if not clusters:
        raise OptionError("train needs at least one cluster")
    began = time.perf_counter()
    torch.manual_seed(config.seed)
    if policy is None:
        policy = PlacetoPolicy(PolicyConfig(**config.policy))
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    updates = max(1, config.episodes // config.rollouts_per_update)
    rng = np.random.default_rng(config.seed)
    baselines: dict[tuple[int, int], deque] = {}
    best: dict[tuple[int, int], tuple] = {}
    curve: dict[str, list] = {"update": [], "episodes": [], "return": [], "speedup": [], "seconds": []}
    trained_on = {"graphs": [g.name for g in graphs], "clusters": [c.name for c in clusters]}
    with one_thread():
        _init_problems(graphs, clusters, config)
        pool = None
        if config.workers > 1:
            # Not fork: a parent that has run autograd where CUDA is present cannot fork workers that run it.
            pool = multiprocessing.get_context("spawn").Pool(
                config.workers, initializer=_init_worker, initargs=(graphs, clusters, config)
            )
        try:
            for update in range(updates):
                if deadline is not None and time.perf_counter() >= deadline:
                    break
                frac = update / max(updates - 1, 1)
                for group in optimizer.param_groups:
                    group["lr"] = config.lr + (config.lr_final - config.lr) * frac
                entropy_coef = config.entropy + (config.entropy_final - config.entropy) * frac
                state = {k: v.detach().numpy().copy() for k, v in policy.state_dict().items()}
                tasks = []
                for k in range(config.rollouts_per_update):
                    key = (int(rng.integers(len(graphs))), int(rng.integers(len(clusters))))
                    history = baselines.get(key)
                    baseline = np.mean(np.stack(history), axis=0) if history else None
                    tasks.append((state, *key, int(rng.integers(2**62)), baseline, entropy_coef))
                results = pool.map(_rollout, tasks) if pool is not None else [_rollout(t) for t in tasks]
                optimizer.zero_grad()
                for p, *grads in zip(policy.parameters(), *(r[0] for r in results)):
                    p.grad = torch.stack([torch.from_numpy(g) for g in grads]).mean(0)
                optimizer.step()
                for task, (_, returns, _, found) in zip(tasks, results):
                    baselines.setdefault(task[1:3], deque(maxlen=config.baseline_window)).append(returns)
                    if task[1:3] not in best or found[:2] < best[task[1:3]][:2]:
                        best[task[1:3]] = found
                row = {
                    "update": update + 1,
                    "episodes": (update + 1) * config.rollouts_per_update,
                    "return": float(np.mean([r[2][0] for r in results])),
                    "speedup": float(np.exp(np.mean(np.log([r[2][1] for r in results])))),
                    "seconds": time.perf_counter() - began,
                }
                for key, value in row.items():
                    curve[key].append(value)
                if progress is not None:
                    progress(update + 1, updates, row)
                if checkpoint is not None and config.checkpoint_every and (update + 1) % config.checkpoint_every == 0:
                    _save(policy, checkpoint, config, curve, trained_on)
        finally:
            if pool is not None:
                # Not close() and join(): after Ctrl-C or an error they would wait for the rollouts in
                # flight, forever for one whose worker died (a worker still starting dies of the SIGINT).
                pool.terminate()
                pool.join()
    return TrainResult(policy, curve, time.perf_counter() - began, best, **trained_on)


def _save(policy: PlacetoPolicy, path, config: TrainConfig, curve: dict, trained_on: dict | None = None) -> None:
    """Write the policy atomically (a checkpoint is never half written)."""
    metadata = dict(train_config=asdict(config), curve=curve, **(trained_on or {}))
    write_atomic(path, lambda tmp: policy.save(tmp, **metadata), "policy file")


def save_result(result: TrainResult, path, config: TrainConfig) -> None:
    """Save a trained policy with its settings, learning curve and the names of the graphs and clusters."""
    _save(result.policy, path, config, result.curve, {"graphs": result.graphs, "clusters": result.clusters})


def plot_curve(curve: dict, path, *, title: str = "Placeto training", window: int = 10) -> None:
    """Learning curve PNG: mean episode return and speedup per update, with a moving average."""
    import matplotlib  # deferred: imports matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: imports matplotlib

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.asarray(curve["episodes"])
    for ax, key, label in (
        (axes[0], "return", "episode return (improvement of R)"),
        (axes[1], "speedup", "speedup of the best placement over the start"),
    ):
        y = np.asarray(curve[key], dtype=np.float64)
        ax.plot(x, y, color="0.75", lw=0.8, label="per update")
        if y.size >= window:
            smooth = np.convolve(y, np.ones(window) / window, mode="valid")
            ax.plot(x[window - 1 :], smooth, color="C0", lw=1.8, label=f"mean of {window}")
        ax.set_xlabel("episodes")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    # The format named, as the temporary file's name does not end in it.
    picture = Path(path).suffix[1:] or "png"
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=picture, dpi=110), "curve file")
    plt.close(fig)
