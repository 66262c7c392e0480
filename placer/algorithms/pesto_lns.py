"""Large-neighbourhood search for :mod:`.pesto`: free part of the incumbent, re-solve with CP-SAT, repeat.

One CP-SAT solve of Pesto's whole model stalls long before its time is up:
the model holds every placement and every start time at once, and the
solver spends its work proving little about either. Large-neighbourhood
search (Shaw 1998; the LNS workers of CP-SAT itself) asks smaller questions:
keep the placement of most nodes as the incumbent has it, free the
placement of a few (a window of the incumbent's schedule, the nodes of one
device pair, a connected subgraph), and let the solver re-place those and
re-time everything, starting from the incumbent as a complete hint. Every
round is a small problem the solver answers well, and the rounds add up:
the longer the search runs, the more of the plan gets revisited.

The search is deterministic for a seed: the neighbourhoods come from a
seeded generator, each round's solve stops on CP-SAT's deterministic work
measure, and the number of rounds is a function of the time limit alone, so
that two runs with the same seed and limit take the same path. The wall
clock only guards the limit; when it ends a round or the search early, the
plan says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..cluster import Cluster
from ..errors import InvalidPlanError
from ..graph import OpGraph
from ..sim.critical import critical_path_nodes
from ..sim.simulator import SimResult, simulate

__all__ = ["NEIGHBOURHOOD_KINDS", "LnsBudget", "Neighbourhoods", "RefineResult", "refine"]

#: Rounds of the search per second of the time limit, on a model of ``REFERENCE_VARIABLES`` variables.
ROUNDS_PER_SECOND = 0.4
#: Rounds on bigger models (more devices: a transfer per tensor and device pair) cost more wall time
#: for the same deterministic work: their number shrinks in proportion.
REFERENCE_VARIABLES = 15_000
#: CP-SAT deterministic work of one round (a fraction of a second of solver time on a 200-node model).
WORK_PER_ROUND = 0.2
#: Work of the first solve, the whole model from the warm start, in rounds.
FIRST_SOLVE_ROUNDS = 1
#: At most this many rounds, whatever the limit (a 600 s limit gets 240).
MAX_ROUNDS = 100_000
#: The neighbourhood's first share of the coarse nodes, and its bounds.
FIRST_SHARE, MIN_SHARE, MAX_SHARE = 0.15, 0.08, 0.6
#: Growth of the neighbourhood after a round the solver closed, shrinkage after one it could not finish.
GROW, SHRINK = 1.25, 0.95
NEIGHBOURHOOD_KINDS = ("window", "devices", "subgraph")


@dataclass(frozen=True)
class LnsBudget:
    """The work of a search, from its time limit alone (so that it is the same on every machine).

    Attributes
    ----------
    rounds : int
        Neighbourhood rounds after the first solve.
    work_per_round : float
        CP-SAT deterministic time of one round.
    first_work : float
        CP-SAT deterministic time of the first solve of the whole model.

    Examples
    --------
    >>> LnsBudget.for_limit(60.0)
    LnsBudget(rounds=24, work_per_round=0.2, first_work=0.2)
    >>> LnsBudget.for_limit(60.0, variables=45_000).rounds
    8
    >>> LnsBudget.for_limit(1.5).rounds
    0
    """

    rounds: int
    work_per_round: float
    first_work: float

    @classmethod
    def for_limit(cls, seconds: float, variables: int = 0) -> "LnsBudget":
        """The budget of a ``seconds`` limit on a model of ``variables`` variables."""
        scale = min(1.0, REFERENCE_VARIABLES / variables) if variables > 0 else 1.0
        rounds = int(min(MAX_ROUNDS, math.floor(max(seconds, 0.0) * ROUNDS_PER_SECOND * scale)))
        if rounds < 1:
            return cls(0, WORK_PER_ROUND, WORK_PER_ROUND)
        return cls(rounds, WORK_PER_ROUND, FIRST_SOLVE_ROUNDS * WORK_PER_ROUND)


@dataclass
class Neighbourhoods:
    """Seeded choice of the coarse nodes a round frees, sized by how the solver fared.

    Parameters
    ----------
    adjacency : list of ndarray
        Undirected neighbours of every coarse node.
    groups : list of ndarray
        Per coarse node, the nodes that must move with it (its colocation
        group, itself included).
    num_devices : int
    seed : int

    Examples
    --------
    >>> hoods = Neighbourhoods([np.array([1]), np.array([0, 2]), np.array([1])],
    ...                        [np.array([i]) for i in range(3)], 2, seed=0)
    >>> free = hoods.pick(np.array([0, 1, 2]), np.array([0, 0, 1]))
    >>> free.dtype == bool and free.shape == (3,) and bool(free.any())
    True
    """

    adjacency: list[np.ndarray]
    groups: list[np.ndarray]
    num_devices: int
    seed: int
    share: float = FIRST_SHARE
    rng: np.random.Generator = field(init=False)
    kinds_used: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed % 2**63)
        self.kinds_used = {kind: 0 for kind in NEIGHBOURHOOD_KINDS}
        self.rounds = 0

    @property
    def size(self) -> int:
        n = len(self.adjacency)
        return int(min(n, max(2, round(self.share * n))))

    def adapt(self, closed: bool) -> None:
        """Grow the neighbourhood after a round the solver closed (proved optimal), shrink it otherwise."""
        self.share = min(MAX_SHARE, self.share * GROW) if closed else max(MIN_SHARE, self.share * SHRINK)

    def pick(self, start: np.ndarray, device_of: np.ndarray) -> np.ndarray:
        """A mask of the coarse nodes whose placement the next round frees.

        Kinds take turns: ``window``, the nodes whose incumbent start times
        are closest to a random instant; ``devices``, a window among the nodes
        of a random pair of devices; ``subgraph``, a breadth-first ball around
        a random node.
        """
        n = len(self.adjacency)
        kind = NEIGHBOURHOOD_KINDS[self.rounds % len(NEIGHBOURHOOD_KINDS)]
        if kind == "devices" and self.num_devices <= 2:
            kind = "window"
        self.rounds += 1
        self.kinds_used[kind] += 1
        k = self.size
        free = np.zeros(n, dtype=bool)
        if kind == "subgraph":
            root = int(self.rng.integers(n))
            seen, frontier = {root}, [root]
            while frontier and len(seen) < k:
                nxt = []
                for v in frontier:
                    for w in self.adjacency[v].tolist():
                        if w not in seen and len(seen) < k:
                            seen.add(w)
                            nxt.append(w)
                frontier = nxt
            free[list(seen)] = True
        else:
            pool = np.arange(n)
            if kind == "devices":
                pair = self.rng.choice(self.num_devices, size=2, replace=False)
                pool = np.flatnonzero(np.isin(device_of, pair))
                if pool.size == 0:
                    pool = np.arange(n)
            by_start = pool[np.lexsort((pool, start[pool]))]
            first = int(self.rng.integers(max(1, by_start.size - k + 1)))
            free[by_start[first : first + k]] = True
        for v in np.flatnonzero(free).tolist():  # colocated nodes move together
            free[self.groups[v]] = True
        return free


#: Simulations of the full-graph refinement per second of the time limit.
REFINE_PER_SECOND = 2.0
#: Move units of the refinement: the graph coarsened to this many times the solver's coarse size.
REFINE_UNIT_FACTOR = 4


@dataclass
class RefineResult:
    """Outcome of :func:`refine`: the placement, ranks, its simulation, and the moves tried and kept."""

    device_of: np.ndarray
    rank: np.ndarray
    result: SimResult
    evaluations: int
    accepted: int
    cut_by_wall_clock: bool


def refine(
    graph: OpGraph,
    cluster: Cluster,
    device_of: np.ndarray,
    rank: np.ndarray,
    unit_of: np.ndarray,
    seed: int,
    evaluations: int,
    until: float,
) -> RefineResult:
    """Hill-climb on the whole graph: move units off the critical path, each move checked by the simulator.

    The coarse solution fixes every node of a coarse node to one device; the
    refinement moves smaller units (``unit_of``, e.g. a finer coarsening) to
    another device, keeping each device's nodes in the order of ``rank`` (a
    linear extension of the graph, such as the solver's start times), so that
    the solver's schedule survives the move. A move is kept when the
    reference makespan falls, or stays and the mean finish time falls (to
    cross plateaus). It stops after ``evaluations`` simulations (so that a
    seed gives one result), or at ``until`` on the wall clock.

    Parameters
    ----------
    graph, cluster
    device_of : array of int
        Starting placement (valid for the graph's kinds and colocation).
    rank : array
        Position of every node in one global order consistent with the edges.
    unit_of : array of int
        Unit of every node; a unit moves as a whole, and must hold whole
        colocation groups.
    seed : int
    evaluations : int
    until : float
        ``time.perf_counter()`` value after which no further simulation starts.

    Returns
    -------
    RefineResult
    """
    rng = np.random.default_rng(seed % 2**63)
    allowed = graph.allowed(cluster)
    n_units = int(unit_of.max()) + 1 if unit_of.size else 0
    unit_allowed = np.ones((n_units, cluster.num_devices), dtype=bool)
    np.logical_and.at(unit_allowed, unit_of, allowed)
    members = [np.flatnonzero(unit_of == u) for u in range(n_units)]
    order_key = np.argsort(rank, kind="stable")

    def run(placement: np.ndarray) -> SimResult:
        seqs = [order_key[placement[order_key] == d] for d in range(cluster.num_devices)]
        return simulate(graph, cluster, placement, seqs, check=False)

    def key(r: SimResult) -> tuple[float, float]:
        return (r.makespan_s if r.fits else np.inf, float(np.mean(r.finish)) if r.finish.size else 0.0)

    current = device_of.copy()
    best = run(current)
    best_key = key(best)
    tried = accepted = 0
    cut = False
    seen = {current.tobytes()}
    neighbours_dst = graph.dst
    neighbours_src = graph.src
    while tried < evaluations and cluster.num_devices > 1 and n_units:
        if time.perf_counter() > until:
            cut = True
            break
        tried += 1
        chain = critical_path_nodes(best)
        node = int(chain[rng.integers(chain.size)]) if chain.size else int(rng.integers(graph.num_nodes))
        unit = int(unit_of[node])
        here = int(current[node])
        targets = np.flatnonzero(unit_allowed[unit])
        targets = targets[targets != here]
        if targets.size == 0:
            continue
        # Half the moves go where a neighbour of the unit runs (saving a transfer), the others anywhere.
        mine = members[unit]
        near = np.concatenate(
            [
                current[neighbours_dst[np.isin(neighbours_src, mine)]],
                current[neighbours_src[np.isin(neighbours_dst, mine)]],
            ]
        )
        near = np.intersect1d(near, targets)
        pool = near if near.size and rng.random() < 0.5 else targets
        target = int(pool[rng.integers(pool.size)])
        candidate = current.copy()
        candidate[mine] = target
        if candidate.tobytes() in seen:
            continue
        seen.add(candidate.tobytes())
        try:
            trial = run(candidate)
        except InvalidPlanError:  # no channel between the unit's new device and a neighbour's
            continue
        trial_key = key(trial)
        if trial_key < best_key:
            current, best, best_key = candidate, trial, trial_key
            accepted += 1
    return RefineResult(current, rank, best, tried, accepted, cut)
