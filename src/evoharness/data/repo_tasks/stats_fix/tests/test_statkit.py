import math

import pytest

from statkit import StatError, histogram, mean, median, mode, percentile, stdev, variance, zscores

DATA = [2, 4, 4, 4, 5, 5, 7, 9]


def test_mean():
    assert mean(DATA) == 5.0
    assert mean(x for x in [1, 2]) == 1.5


@pytest.mark.parametrize("fn", [mean, median, mode, variance, stdev, zscores])
def test_empty_raises(fn):
    with pytest.raises(StatError):
        fn([])


def test_stat_error_is_value_error():
    assert issubclass(StatError, ValueError)


def test_median_odd_unsorted():
    assert median([9, 1, 5]) == 5


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5
    assert median(iter([1, 2])) == 1.5


def test_mode_first_on_tie():
    assert mode([3, 1, 1, 3, 2]) == 3
    assert mode(["b", "a", "a"]) == "a"


def test_variance_sample_and_population():
    assert variance(DATA, sample=False) == 4.0
    assert variance(DATA) == pytest.approx(32 / 7)
    assert stdev(DATA, sample=False) == 2.0


def test_sample_variance_needs_two():
    with pytest.raises(StatError):
        variance([3])
    assert variance([3], sample=False) == 0.0


def test_generator_consumed_once():
    assert variance(x for x in DATA) == pytest.approx(32 / 7)


@pytest.mark.parametrize("p,expected", [(0, 1), (25, 1.75), (50, 2.5), (75, 3.25), (100, 4), (90, 3.7)])
def test_percentile(p, expected):
    assert percentile([4, 2, 1, 3], p) == pytest.approx(expected)


def test_percentile_matches_median():
    assert percentile(DATA, 50) == median(DATA)
    assert percentile([7], 33) == 7


@pytest.mark.parametrize("p", [-1, 100.5])
def test_percentile_range(p):
    with pytest.raises(ValueError):
        percentile(DATA, p)


def test_percentile_empty():
    with pytest.raises(StatError):
        percentile([], 50)


def test_zscores():
    z = zscores(DATA)
    assert z[0] == pytest.approx(-1.5) and z[-1] == pytest.approx(2.0)
    assert math.isclose(sum(z), 0, abs_tol=1e-12)


def test_zscores_constant():
    assert zscores([3, 3, 3]) == [0.0, 0.0, 0.0]


def test_histogram():
    assert histogram([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 5) == [2, 2, 2, 2, 3]
    assert histogram(DATA, 7) == [1, 0, 3, 2, 0, 1, 1]


def test_histogram_constant_and_single_bin():
    assert histogram([5, 5, 5], 3) == [3, 0, 0]
    assert histogram(DATA, 1) == [8]


def test_histogram_errors():
    with pytest.raises(ValueError):
        histogram(DATA, 0)
    with pytest.raises(StatError):
        histogram([], 3)
