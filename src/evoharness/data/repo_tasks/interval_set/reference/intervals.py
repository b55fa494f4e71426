"""Sets of numbers as sorted, disjoint, non-adjacent half-open intervals."""

import bisect

__all__ = ["IntervalSet"]


def _check(start, end):
    if start > end:
        raise ValueError(f"start {start!r} > end {end!r}")


class IntervalSet:
    def __init__(self, intervals=()):
        self._starts, self._ends = [], []
        for start, end in intervals:
            self.add(start, end)

    @classmethod
    def _from_sorted(cls, pairs):
        s = cls()
        for start, end in pairs:
            if start >= end:
                continue
            if s._ends and start <= s._ends[-1]:
                s._ends[-1] = max(s._ends[-1], end)
            else:
                s._starts.append(start)
                s._ends.append(end)
        return s

    def intervals(self):
        return list(zip(self._starts, self._ends))

    def __iter__(self):
        return iter(self.intervals())

    def __len__(self):
        return len(self._starts)

    def __bool__(self):
        return bool(self._starts)

    def measure(self):
        return sum(e - s for s, e in zip(self._starts, self._ends))

    def add(self, start, end):
        _check(start, end)
        if start == end:
            return
        lo = bisect.bisect_left(self._ends, start)   # first interval that could touch
        hi = bisect.bisect_right(self._starts, end)  # past the last that could touch
        if lo < hi:
            start = min(start, self._starts[lo])
            end = max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]

    def remove(self, start, end):
        _check(start, end)
        if start == end:
            return
        lo = bisect.bisect_right(self._ends, start)
        hi = bisect.bisect_left(self._starts, end)
        if lo >= hi:
            return
        new = []
        if self._starts[lo] < start:
            new.append((self._starts[lo], start))
        if self._ends[hi - 1] > end:
            new.append((end, self._ends[hi - 1]))
        self._starts[lo:hi] = [s for s, _ in new]
        self._ends[lo:hi] = [e for _, e in new]

    def find(self, x):
        i = bisect.bisect_right(self._starts, x) - 1
        if i >= 0 and x < self._ends[i]:
            return (self._starts[i], self._ends[i])
        return None

    def __contains__(self, item):
        if isinstance(item, tuple):
            start, end = item
            if start >= end:
                return True
            hit = self.find(start)
            return hit is not None and end <= hit[1]
        return self.find(item) is not None

    def overlaps(self, start, end):
        if start >= end:
            return False
        i = bisect.bisect_right(self._ends, start)
        return i < len(self._starts) and self._starts[i] < end

    def gaps(self):
        return list(zip(self._ends[:-1], self._starts[1:]))

    def copy(self):
        return IntervalSet._from_sorted(self.intervals())

    def union(self, other):
        return IntervalSet._from_sorted(sorted(self.intervals() + other.intervals()))

    def difference(self, other):
        out = self.copy()
        for s, e in other:
            out.remove(s, e)
        return out

    def intersection(self, other):
        return self.difference(self.difference(other))

    def symmetric_difference(self, other):
        return self.difference(other).union(other.difference(self))

    def complement(self, lo, hi):
        return IntervalSet([(lo, hi)]).difference(self)

    __or__, __and__, __sub__, __xor__ = union, intersection, difference, symmetric_difference

    def __eq__(self, other):
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self.intervals() == other.intervals()

    def __repr__(self):
        return f"IntervalSet({self.intervals()!r})"
