"""Descriptive statistics over iterables of numbers."""

import math
from collections import Counter


class StatError(ValueError):
    """Raised when a statistic is undefined for the given data."""


def _values(data, what):
    values = list(data)
    if not values:
        raise StatError(f"{what} of empty data")
    return values


def mean(data):
    values = _values(data, "mean")
    return sum(values) / len(values)


def median(data):
    values = sorted(_values(data, "median"))
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2


def mode(data):
    values = _values(data, "mode")
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def variance(data, sample=True):
    values = _values(data, "variance")
    if sample and len(values) < 2:
        raise StatError("sample variance needs at least two values")
    m = sum(values) / len(values)
    return sum((x - m) ** 2 for x in values) / (len(values) - 1 if sample else len(values))


def stdev(data, sample=True):
    return math.sqrt(variance(data, sample))


def percentile(data, p):
    if not 0 <= p <= 100:
        raise ValueError("p must be within [0, 100]")
    values = sorted(_values(data, "percentile"))
    k = (len(values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def zscores(data):
    values = _values(data, "zscores")
    m, s = mean(values), stdev(values, sample=False)
    if s == 0:
        return [0.0] * len(values)
    return [(x - m) / s for x in values]


def histogram(data, bins):
    if bins < 1:
        raise ValueError("bins must be >= 1")
    values = _values(data, "histogram")
    lo, hi = min(values), max(values)
    counts = [0] * bins
    if hi == lo:
        counts[0] = len(values)
        return counts
    width = (hi - lo) / bins
    for x in values:
        counts[min(int((x - lo) / width), bins - 1)] += 1
    return counts
