from _strict import real  # values from the code under test must be genuine
import math

import pytest

from statkit import StatError, histogram, mean, median, mode, percentile, stdev, variance, zscores

DATA = [2, 4, 4, 4, 5, 5, 7, 9]


def test_mean():
    assert real(mean(real(DATA))) == 5.0
    assert real(mean(real(x) for x in [1, 2])) == 1.5


@pytest.mark.parametrize("fn", [mean, median, mode, variance, stdev, zscores])
def test_empty_raises(fn):
    with pytest.raises(StatError):
        fn([])


def test_stat_error_is_value_error():
    assert issubclass(real(StatError), ValueError)


def test_median_odd_unsorted():
    assert real(median([9, 1, 5])) == 5


def test_median_even():
    assert real(median([4, 1, 3, 2])) == 2.5
    assert real(median(iter([1, 2]))) == 1.5


def test_mode_first_on_tie():
    assert real(mode([3, 1, 1, 3, 2])) == 3
    assert real(mode(["b", "a", "a"])) == "a"


def test_variance_sample_and_population():
    assert real(variance(real(DATA), sample=False)) == 4.0
    assert real(variance(real(DATA))) == pytest.approx(32 / 7)
    assert real(stdev(real(DATA), sample=False)) == 2.0


def test_sample_variance_needs_two():
    with pytest.raises(StatError):
        variance([3])
    assert real(variance([3], sample=False)) == 0.0


def test_generator_consumed_once():
    assert real(variance(real(x) for x in real(DATA))) == pytest.approx(32 / 7)


@pytest.mark.parametrize("p,expected", [(0, 1), (25, 1.75), (50, 2.5), (75, 3.25), (100, 4), (90, 3.7)])
def test_percentile(p, expected):
    assert real(percentile([4, 2, 1, 3], p)) == pytest.approx(expected)


def test_percentile_matches_median():
    assert real(percentile(real(DATA), 50)) == real(median(real(DATA)))
    assert real(percentile([7], 33)) == 7


@pytest.mark.parametrize("p", [-1, 100.5])
def test_percentile_range(p):
    with pytest.raises(ValueError):
        percentile(DATA, p)


def test_percentile_empty():
    with pytest.raises(StatError):
        percentile([], 50)


def test_zscores():
    z = zscores(DATA)
    assert real(real(z)[0]) == pytest.approx(-1.5) and real(real(z)[-1]) == pytest.approx(2.0)
    assert math.isclose(sum(real(z)), 0, abs_tol=1e-12)


def test_zscores_constant():
    assert real(zscores([3, 3, 3])) == [0.0, 0.0, 0.0]


def test_histogram():
    assert real(histogram([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 5)) == [2, 2, 2, 2, 3]
    assert real(histogram(real(DATA), 7)) == [1, 0, 3, 2, 0, 1, 1]


def test_histogram_constant_and_single_bin():
    assert real(histogram([5, 5, 5], 3)) == [3, 0, 0]
    assert real(histogram(real(DATA), 1)) == [8]


def test_histogram_errors():
    with pytest.raises(ValueError):
        histogram(DATA, 0)
    with pytest.raises(StatError):
        histogram([], 3)
