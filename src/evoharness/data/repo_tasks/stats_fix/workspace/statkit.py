"""Descriptive statistics over iterables of numbers."""

import math
from collections import Counter


class StatError(ValueError):
    """Raised when a statistic is undefined for the given data."""


def mean(data):
    values = list(data)
    if not values:
        return 0.0
    return sum(values) / len(values)


def median(data):
    values = list(data)
    if not values:
        raise StatError("median of empty data")
    return values[len(values) // 2]


def mode(data):
    values = list(data)
    if not values:
        raise StatError("mode of empty data")
    counts = Counter(values)
    best = max(counts.values())
    return [v for v in values if counts[v] == best][-1]


def variance(data, sample=True):
    values = list(data)
    if not values:
        raise StatError("variance of empty data")
    m = mean(values)
    return sum((x - m) ** 2 for x in values) / len(values)


def stdev(data, sample=True):
    return math.sqrt(variance(data, sample))


def percentile(data, p):
    values = sorted(data)
    if not values:
        raise StatError("percentile of empty data")
    k = len(values) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def zscores(data):
    values = list(data)
    m, s = mean(values), stdev(values)
    return [(x - m) / s for x in values]


def histogram(data, bins):
    values = list(data)
    if not values:
        raise StatError("histogram of empty data")
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins
    counts = [0] * bins
    for x in values:
        counts[int((x - lo) / width)] += 1
    return counts
