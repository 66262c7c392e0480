"""Busy intervals of a device or channel (:class:`Timeline`) and a channel's queue (:class:`QueueOrder`).

A list scheduler books jobs out of time order: an operation may take an idle
gap between two booked ones (HEFT's and DPOS's insertion), and a transfer is
booked when its consumer is placed, long after transfers that queue behind
it. Both structures keep their entries sorted in blocks of a few dozen, each
block with a summary (its widest gap, its latest end) that lets a search skip
whole blocks: graphs of 100k nodes leave long timelines.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

__all__ = ["QueueOrder", "Timeline"]


class Timeline:
    """Busy intervals of one device or channel, in time order, that find the earliest idle gap fast.

    :meth:`find` answers "the earliest start at or after ``ready`` of a job
    of ``length``", in an idle gap (``insertion``) or after the last
    interval; :meth:`book` takes the slot it found. Each block of intervals
    keeps an upper bound on its widest gap: bookings only split gaps, so the
    bound stays valid, and a search skips every block whose bound is too
    small.

    Examples
    --------
    >>> t = Timeline()
    >>> t.book(*t.find(0.0, 2.0, insertion=True), 2.0, "a")
    >>> t.book(*t.find(5.0, 4.0, insertion=True), 4.0, "b")
    >>> t.find(1.0, 3.0, insertion=True), t.find(1.0, 3.0, insertion=False)     # (start, block, index)
    ((2.0, 0, 1), (9.0, 0, 2))
    >>> t.items()
    ['a', 'b']
    """

    BLOCK = 64

    def __init__(self) -> None:
        self.starts: list[list[float]] = [[]]
        self.finishes: list[list[float]] = [[]]
        self.payload: list[list] = [[]]
        self.last = [float("-inf")]  # last finish of each block (non-decreasing)
        self.widest = [0.0]  # longest gap before an interval of each block
        # Per ready time, a job length that found no gap between it and the then last interval:
        # bookings only shrink gaps, so a job as long need not look there again (list
        # schedulers ask the same question many times over).
        self.no_gap: dict[float, tuple[float, float]] = {}

    def __len__(self) -> int:
        return sum(len(f) for f in self.finishes)

    def last_item(self):
        """What the latest interval carries (None when empty)."""
        return self.payload[-1][-1] if self.payload[-1] else None

    def items(self) -> list:
        """What every interval carries, in time order."""
        return [x for block in self.payload for x in block]

    def find(self, ready: float, length: float, insertion: bool) -> tuple[float, int, int]:
        """Earliest start >= ``ready`` of a job of ``length``, and where it enters: ``(start, block, index)``.

        With ``insertion`` the job may take an idle gap between booked
        intervals; otherwise it goes after the last one. An interval that
        finishes by ``ready`` stays before the job (so a zero-length
        predecessor finishing at ``ready`` keeps its place).
        """
        last_b = len(self.finishes) - 1
        end = len(self.finishes[last_b])
        if not insertion or self.last[last_b] <= ready:
            return max(ready, self.last[last_b]), last_b, end
        shortest, searched = self.no_gap.get(ready, (float("inf"), ready))
        found = self._first_gap(max(ready, searched) if length >= shortest else ready, length)
        if found is None:
            self.no_gap[ready] = (length, self.last[last_b])
            return self.last[last_b], last_b, end
        return found

    def idle_at(self, begin: float, length: float) -> bool:
        """Whether no booked interval overlaps ``[begin, begin + length)`` (as :meth:`find` with insertion sees it)."""
        last_b = len(self.finishes) - 1
        if self.last[last_b] <= begin:
            return True
        b = bisect_right(self.last, begin)
        return begin + length <= self.starts[b][bisect_right(self.finishes[b], begin)]

    def _first_gap(self, ready: float, length: float) -> tuple[float, int, int] | None:
        """The earliest idle gap after ``ready`` that holds ``length`` (as :meth:`find`), None if none does."""
        last_b = len(self.finishes) - 1
        if self.last[last_b] <= ready:
            return None
        b = bisect_right(self.last, ready)
        starts, finishes = self.starts[b], self.finishes[b]
        k = bisect_right(finishes, ready)
        if ready + length <= starts[k]:
            return ready, b, k
        for i in range(k + 1, len(starts)):
            if finishes[i - 1] + length <= starts[i]:
                return finishes[i - 1], b, i
        # The margin covers rounding between `a + length <= b` and `b - a >= length`. Most searches find no
        # later block wide enough: the largest bound, taken in C, settles those without a walk.
        if b == last_b or max(self.widest[b + 1 :]) + 1e-9 < length:
            return None
        for b in range(b + 1, last_b + 1):
            if self.widest[b] + 1e-9 >= length:
                starts, finishes = self.starts[b], self.finishes[b]
                if self.last[b - 1] + length <= starts[0]:
                    return self.last[b - 1], b, 0
                widest = starts[0] - self.last[b - 1]
                for i in range(1, len(starts)):
                    if finishes[i - 1] + length <= starts[i]:
                        return finishes[i - 1], b, i
                    widest = max(widest, starts[i] - finishes[i - 1])
                self.widest[b] = widest  # bookings only shrink gaps: tighten the bound now that it is known
        return None

    def book(self, begin: float, b: int, k: int, length: float, item=None) -> None:
        """Book ``[begin, begin + length)`` at the place :meth:`find` returned (``begin, b, k``)."""
        if k == len(self.starts[b]):
            # Past the last interval: the idle time before it is a new gap.
            before = self.last[b] if self.starts[b] else (self.last[b - 1] if b > 0 else 0.0)
            self.widest[b] = max(self.widest[b], begin - before)
        self.starts[b].insert(k, begin)
        self.finishes[b].insert(k, begin + length)
        self.payload[b].insert(k, item)
        if len(self.starts[b]) > 2 * self.BLOCK:
            half = self.BLOCK
            for lists in (self.starts, self.finishes, self.payload):
                lists.insert(b + 1, lists[b][half:])
                del lists[b][half:]
            self.last.insert(b + 1, 0.0)
            self.widest.insert(b + 1, 0.0)
            self._refresh(b)
            self._refresh(b + 1)
        # Any other booking only splits a gap, so every block's widest gap stays an upper bound.
        self.last[b] = self.finishes[b][-1]

    def _refresh(self, b: int) -> None:
        starts, finishes = self.starts[b], self.finishes[b]
        self.last[b] = finishes[-1] if finishes else float("-inf")
        widest = starts[0] - (self.last[b - 1] if b > 0 else 0.0) if starts else 0.0
        for i in range(1, len(starts)):
            gap = starts[i] - finishes[i - 1]
            if gap > widest:
                widest = gap
        self.widest[b] = widest


class QueueOrder:
    """The transfers booked on one channel, by their place in its queue, that tell when those ahead of a new one end.

    The reference model's channel serves its queue first come, first served
    (FORMATS.md, rule 4): by the time a transfer joined the queue (its
    producer's finish), ties by producer, destination device name and
    tensor. A transfer's key is that tuple, ``(queued, producer, destination
    name rank, tensor)``, and it cannot start before every transfer whose key
    sorts before it has ended: :meth:`ahead_until` gives that time.
    A list scheduler books transfers out of queue order, so the keys are kept
    sorted in blocks of a few dozen, each with the latest end among its
    transfers.

    Examples
    --------
    >>> q = QueueOrder()
    >>> q.add((2.0, 7, 0, 0), 5.0)
    >>> q.add((0.5, 3, 1, 0), 1.5)
    >>> q.ahead_until((1.0, 4, 0, 0)), q.ahead_until((3.0, 1, 0, 0)), q.ahead_until((0.0, 1, 0, 0))
    (1.5, 5.0, 0.0)
    """

    BLOCK = 64

    def __init__(self) -> None:
        self.keys: list[list[tuple]] = [[]]  # consecutive ranges of keys
        self.ends: list[list[float]] = [[]]
        self.latest = [0.0]  # latest end in each block
        self.firsts: list[tuple] = []  # first key of each block but the first
        self.last_key: tuple = ()  # the largest key (() sorts before every key)
        self.latest_end = 0.0  # the latest end of all

    def ahead_until(self, key: tuple) -> float:
        """When the last transfer queued ahead of ``key`` ends (0 if none is)."""
        if key > self.last_key:  # most transfers are booked in the order they queue
            return self.latest_end
        b = bisect_right(self.firsts, key)
        until = max(self.latest[:b], default=0.0)
        keys = self.keys[b]
        i = bisect_left(keys, key)
        if i == len(keys):
            return max(until, self.latest[b])
        return max(until, max(self.ends[b][:i])) if i else until

    def add(self, key: tuple, end: float) -> None:
        """Record a transfer booked with queue key ``key`` that ends at ``end``."""
        b = bisect_right(self.firsts, key)
        keys, ends = self.keys[b], self.ends[b]
        i = bisect_right(keys, key)
        keys.insert(i, key)
        ends.insert(i, end)
        self.latest[b] = max(self.latest[b], end)
        self.last_key, self.latest_end = max(self.last_key, key), max(self.latest_end, end)
        if len(keys) > 2 * self.BLOCK:
            half = self.BLOCK
            self.keys.insert(b + 1, keys[half:])
            self.ends.insert(b + 1, ends[half:])
            del keys[half:], ends[half:]
            self.latest[b] = max(ends)
            self.latest.insert(b + 1, max(self.ends[b + 1]))
            self.firsts.insert(b, self.keys[b + 1][0])
