"""Each device's memory over time, as the reference model counts it, for a partial list schedule."""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["MemoryTimeline"]


class MemoryTimeline:
    """Memory in use on each device over time, as the reference model counts it, for a partial schedule.

    Each device ``d`` keeps a step function ``level_d(t)``, the bytes of every
    step :meth:`add` put there at or before ``t`` (a free is a negative step).
    :meth:`fits` says whether new steps keep ``level_d(t) + added(t) <=
    limit_d`` at every instant, not only at the booking frontier: where a
    step's free is known only later (an output's, once its last consumer is
    booked) it is held for good until then, and a copy sent to a device when
    its producer ends, long before the consumer booked now, counts from then
    on (FORMATS.md, rule 6). ``limit_d`` is the device's capacity times
    ``capacity_scale`` (per device; the memory retries move it).

    Most checks are settled by a ceiling, a level no instant exceeds, without
    the step function: steps wait in a pending list until a check needs them.

    Examples
    --------
    >>> m = MemoryTimeline(np.array([10.0]))
    >>> m.add(0, 2.0, 6.0); m.add(0, 5.0, -6.0)       # 6 bytes held over [2, 5)
    >>> m.fits(0, [(0.0, 4.0)]), m.fits(0, [(0.0, 5.0)]), m.fits(0, [(5.0, 10.0)])
    (True, False, True)
    >>> float(m.used[0])
    0.0
    """

    def __init__(self, capacity: np.ndarray, capacity_scale: np.ndarray | None = None):
        self.capacity = capacity.astype(np.float64) * (1.0 if capacity_scale is None else capacity_scale)
        n_dev = len(self.capacity)
        self.limits: list[float] = self.capacity.tolist()  # read at every check: Python floats
        self.used = [0.0] * n_dev
        # Per device, breakpoints and the level from each until the next (grown by doubling).
        self.times = [np.full(64, -np.inf) for _ in range(n_dev)]
        self.levels = [np.zeros(64) for _ in range(n_dev)]
        self.count = [1] * n_dev
        # Per device, a level no instant exceeds: raised by every allocation, reset to the true
        # peak when it is too high to settle a question on its own (frees do not lower it).
        self.ceiling = [0.0] * n_dev
        # Per device, the times and bytes of the steps added since its step function was last brought up
        # to date: a check the ceiling settles needs none of them, and on graphs whose memory is not tight
        # that is every check (bench/scaling.py). Arrays of floats: a schedule keeps its timeline.
        self.pending_times = [array("d") for _ in range(n_dev)]
        self.pending_bytes = [array("d") for _ in range(n_dev)]
        self._seen = np.zeros(n_dev)
        # Per device, the highest level from each breakpoint on, made when a check needs it and kept until the
        # step function changes: where memory is tight, a scheduler checks several nodes and devices between
        # two bookings, and a check's last event holds to the end of the step.
        self._suffix_max: list[np.ndarray | None] = [None] * n_dev

    @property
    def seen(self) -> np.ndarray:
        """Per device, the highest level the timeline ever reached: what its checks compared with the capacity."""
        for d in range(len(self.capacity)):
            self._settle(d)
        return self._seen

    def _settle(self, d: int) -> None:
        """Apply ``d``'s pending steps to its step function, in the order they were added."""
        if self.pending_times[d]:
            self._suffix_max[d] = None
        for at, amount in zip(self.pending_times[d], self.pending_bytes[d]):
            k = self._breakpoint(d, at)
            after = self.levels[d][k : self.count[d]]
            after += amount
            if amount > 0:
                self._seen[d] = max(self._seen[d], after.max())
        self.pending_times[d], self.pending_bytes[d] = array("d"), array("d")

    def _breakpoint(self, d: int, at: float) -> int:
        """Index of the breakpoint at time ``at`` on device ``d``, made where there is none."""
        n, times, levels = self.count[d], self.times[d], self.levels[d]
        k = int(times[:n].searchsorted(at, side="right")) - 1
        if times[k] == at:
            return k
        if n == len(times):
            self.times[d] = times = np.concatenate([times, np.full(n, np.inf)])
            self.levels[d] = levels = np.concatenate([levels, np.zeros(n)])
        times[k + 2 : n + 1] = times[k + 1 : n]
        levels[k + 2 : n + 1] = levels[k + 1 : n]
        times[k + 1] = at
        levels[k + 1] = levels[k]
        self.count[d] = n + 1
        return k + 1

    def add(self, d: int, at: float, amount: float) -> None:
        """Hold ``amount`` more bytes on ``d`` from time ``at`` on (less, when negative: a free)."""
        if amount:
            self.pending_times[d].append(at)
            self.pending_bytes[d].append(amount)
            self.used[d] += amount
            if amount > 0:
                self.ceiling[d] += amount

    def surely_fits(self, d: int, most: float) -> bool:
        """Whether ``d`` holds ``most`` more bytes at every instant, by its ceiling alone (:meth:`fits` may
        still say so where this does not)."""
        return self.ceiling[d] + most <= self.limits[d]

    def fits(self, d: int, events: list[tuple[float, float]]) -> bool:
        """Whether ``d`` stays within its limit at every instant with ``events`` added: (time, bytes) steps."""
        limit = self.limits[d]
        added = sum(amount for _, amount in events if amount > 0)
        if self.surely_fits(d, added):
            return True
        self._settle(d)
        n, times, levels = self.count[d], self.times[d][: self.count[d]], self.levels[d]
        suffix_max = self._suffix_max[d]
        if suffix_max is None:
            suffix_max = self._suffix_max[d] = np.maximum.accumulate(levels[n - 1 :: -1])[::-1]
        self.ceiling[d] = float(suffix_max[0])
        if self.ceiling[d] + added <= limit:
            return True
        events = sorted(events)
        held = 0.0
        # Each event's level holds until the next event's time (the last one's, for good).
        for (at, amount), end in zip(events, [at for at, _ in events[1:]] + [np.inf]):
            held += amount
            if end == at:
                continue
            lo = int(times.searchsorted(at, side="right")) - 1
            hi = n if end == np.inf else int(times.searchsorted(end, side="left"))
            highest = suffix_max[lo] if hi >= n else levels[lo : max(hi, lo + 1)].max()
            if highest + held > limit:
                return False
        return True
