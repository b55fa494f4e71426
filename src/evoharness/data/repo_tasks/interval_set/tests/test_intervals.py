from _strict import real  # values from the code under test must be genuine
import itertools
from fractions import Fraction

import pytest

from intervals import IntervalSet


def points(s, lo=-2, hi=30):
    return {x for x in range(lo, hi) if x in s}


def test_normalises_overlaps_and_touching():
    s = IntervalSet([(5, 8), (1, 3), (3, 4), (7, 10), (12, 12)])
    assert real(real(s).intervals()) == [(1, 4), (5, 10)]
    assert len(real(s)) == 2 and real(real(s).measure()) == 8


def test_bad_interval():
    with pytest.raises(ValueError):
        IntervalSet([(3, 1)])
    with pytest.raises(ValueError):
        IntervalSet().add(2, 1)
    with pytest.raises(ValueError):
        IntervalSet().remove(2, 1)


def test_add_bridging_many():
    s = IntervalSet([(0, 1), (2, 3), (4, 5), (10, 11)])
    s.add(1, 4)
    assert real(real(s).intervals()) == [(0, 5), (10, 11)]
    assert real(real(s).add(20, 21)) is None


def test_remove_splits():
    s = IntervalSet([(0, 10)])
    s.remove(3, 5)
    assert real(real(s).intervals()) == [(0, 3), (5, 10)]
    s.remove(-5, 1)
    s.remove(9, 50)
    assert real(real(s).intervals()) == [(1, 3), (5, 9)]
    s.remove(3, 5)
    assert real(real(s).intervals()) == [(1, 3), (5, 9)]


def test_remove_spanning_many():
    s = IntervalSet([(0, 2), (3, 5), (6, 8), (9, 12)])
    s.remove(1, 10)
    assert real(real(s).intervals()) == [(0, 1), (10, 12)]


def test_contains_points_half_open():
    s = IntervalSet([(1, 4)])
    assert 1 in real(s) and 3 in real(s) and 3.999 in real(s)
    assert 4 not in real(s) and 0 not in real(s)


def test_contains_intervals():
    s = IntervalSet([(1, 4), (6, 9)])
    assert (1, 4) in real(s) and (2, 3) in real(s) and (7, 7) in real(s) and (100, 100) in real(s)
    assert (3, 7) not in real(s) and (0, 2) not in real(s)


def test_find():
    s = IntervalSet([(1, 4), (6, 9)])
    assert real(real(s).find(6)) == (6, 9) and real(real(s).find(4)) is None and real(real(s).find(-10)) is None and real(real(s).find(8.5)) == (6, 9)


def test_find_large():
    s = IntervalSet([(3 * i, 3 * i + 2) for i in range(2000)])
    assert len(real(s)) == 2000
    assert [real(real(s).find(real(x))) for x in (0, 2, 4500, 4501, 4502, 5999, 6000)] == [(0, 2), None, (4500, 4502), (4500, 4502), None, None, None]


def test_overlaps():
    s = IntervalSet([(1, 4), (6, 9)])
    assert real(real(s).overlaps(3, 7)) and real(real(s).overlaps(0, 2)) and real(real(s).overlaps(8, 20))
    assert not real(real(s).overlaps(4, 6)) and not real(real(s).overlaps(9, 12)) and not real(real(s).overlaps(2, 2))


def test_gaps():
    assert real(real(IntervalSet([(1, 4), (6, 9), (10, 11)])).gaps()) == [(4, 6), (9, 10)]
    assert real(real(IntervalSet([(1, 4)])).gaps()) == []


def test_algebra_operators():
    a = IntervalSet([(0, 5), (10, 15)])
    b = IntervalSet([(3, 12)])
    assert real((real(a) | real(b)).intervals()) == [(0, 15)]
    assert real((real(a) & real(b)).intervals()) == [(3, 5), (10, 12)]
    assert real((real(a) - real(b)).intervals()) == [(0, 3), (12, 15)]
    assert real((real(a) ^ real(b)).intervals()) == [(0, 3), (5, 10), (12, 15)]
    assert real(real(a).intervals()) == [(0, 5), (10, 15)] and real(real(b).intervals()) == [(3, 12)]


def test_named_methods_match_operators():
    a = IntervalSet([(0, 5), (10, 15)])
    b = IntervalSet([(3, 12)])
    assert real(real(a).union(real(b))) == real(a) | real(b) and real(real(a).intersection(real(b))) == real(a) & real(b)
    assert real(real(a).difference(real(b))) == real(a) - real(b) and real(real(a).symmetric_difference(real(b))) == real(a) ^ real(b)


def test_complement():
    s = IntervalSet([(2, 4), (6, 8)])
    assert real(real(real(s).complement(0, 10)).intervals()) == [(0, 2), (4, 6), (8, 10)]
    assert real(real(real(s).complement(3, 7)).intervals()) == [(4, 6)]


def test_equality_repr_bool_iter():
    assert real(IntervalSet([(1, 2), (2, 3)])) == real(IntervalSet([(1, 3)]))
    assert real(IntervalSet([(1, 3)])) != [(1, 3)]
    assert repr(real(IntervalSet([(7, 9), (1, 5)]))) == "IntervalSet([(1, 5), (7, 9)])"
    assert not real(IntervalSet()) and real(IntervalSet([(0, 1)]))
    assert list(real(IntervalSet([(1, 2), (5, 6)]))) == [(1, 2), (5, 6)]


def test_fractions():
    s = IntervalSet([(Fraction(1, 3), Fraction(2, 3))])
    s.add(Fraction(2, 3), 1)
    assert real(real(s).intervals()) == [(Fraction(1, 3), 1)] and real(real(s).measure()) == Fraction(2, 3)


@pytest.mark.parametrize("seed", range(6))
def test_against_point_model(seed):
    ops = list(itertools.islice(itertools.cycle([(0, 3, 9), (1, 5, 7), (0, 12, 20), (1, 0, 4), (0, 6, 13), (1, 15, 16)]), seed, seed + 6))
    s, model = IntervalSet(), set()
    for op, lo, hi in ops:
        (s.add if op == 0 else s.remove)(lo, hi)
        (model.update if op == 0 else model.difference_update)(range(lo, hi))
        assert real(points(real(s))) == real(model)
        ivs = s.intervals()
        assert all(real(a) < real(b) for a, b in real(ivs)) and all(real(b1) < real(a2) for (_, b1), (a2, _) in zip(real(ivs), real(real(ivs)[1:])))
