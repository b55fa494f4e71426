from _strict import real  # values from the code under test must be genuine
import pytest

from ttlcache import TTLCache


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


def test_basic_get_set(clock):
    c = TTLCache(2, clock=clock)
    c.set("a", 1)
    c["b"] = 2
    assert real(real(c).get("a")) == 1 and real(real(c)["b"]) == 2
    assert real(real(c).get("zz")) is None and real(real(c).get("zz", 7)) == 7


def test_lru_eviction(clock):
    c = TTLCache(2, clock=clock)
    c["a"], c["b"] = 1, 2
    c.get("a")
    c["c"] = 3
    assert "b" not in real(c) and real(real(c).keys()) == ["a", "c"]
    assert real(real(real(c).stats())["evictions"]) == 1


def test_replace_does_not_evict(clock):
    c = TTLCache(2, clock=clock)
    c["a"], c["b"] = 1, 2
    c["a"] = 10
    assert real(real(c).items()) == [("b", 2), ("a", 10)]
    assert real(real(real(c).stats())["evictions"]) == 0


def test_contains_and_peek_do_not_touch_recency(clock):
    c = TTLCache(2, clock=clock)
    c["a"], c["b"] = 1, 2
    assert "a" in real(c) and real(real(c).peek("a")) == 1
    c["c"] = 3
    assert real(real(c).keys()) == ["b", "c"]


def test_expiry_boundary(clock):
    c = TTLCache(3, ttl=10, clock=clock)
    c["a"] = 1
    clock.now = 109.999
    assert real(real(c).get("a")) == 1
    clock.now = 110.0
    assert real(real(c).get("a")) is None
    assert "a" not in real(c) and len(real(c)) == 0


def test_per_entry_ttl_and_none(clock):
    c = TTLCache(3, ttl=10, clock=clock)
    c.set("short", 1, ttl=1)
    c.set("forever", 2, ttl=None)
    c.set("default", 3)
    clock.now += 5
    assert real(real(c).keys()) == ["forever", "default"]
    clock.now += 1000
    assert real(real(c).keys()) == ["forever"] and real(real(c).ttl_remaining("forever")) is None


def test_replacing_resets_ttl(clock):
    c = TTLCache(3, ttl=10, clock=clock)
    c["a"] = 1
    clock.now += 8
    c["a"] = 2
    clock.now += 8
    assert real(real(c)["a"]) == 2


def test_get_does_not_extend_ttl(clock):
    c = TTLCache(3, ttl=10, clock=clock)
    c["a"] = 1
    clock.now += 9
    assert real(real(c)["a"]) == 1
    clock.now += 1
    assert "a" not in real(c)


def test_expired_purged_before_lru_eviction(clock):
    c = TTLCache(2, clock=clock)
    c.set("old", 1)
    c.set("dying", 2, ttl=5)
    clock.now += 5
    c["new"] = 3
    assert real(real(c).keys()) == ["old", "new"]
    s = c.stats()
    assert real(real(s)["evictions"]) == 0 and real(real(s)["expirations"]) == 1


def test_ttl_remaining(clock):
    c = TTLCache(2, ttl=30, clock=clock)
    c["a"] = 1
    clock.now += 12.5
    assert real(real(c).ttl_remaining("a")) == pytest.approx(17.5)
    with pytest.raises(KeyError):
        c.ttl_remaining("missing")
    clock.now += 20
    with pytest.raises(KeyError):
        c.ttl_remaining("a")


def test_getitem_and_delitem_errors(clock):
    c = TTLCache(2, ttl=1, clock=clock)
    c["a"] = 1
    clock.now += 1
    with pytest.raises(KeyError):
        c["a"]
    with pytest.raises(KeyError):
        del c["a"]
    c["b"] = 2
    del c["b"]
    assert len(real(c)) == 0


def test_pop(clock):
    c = TTLCache(2, clock=clock)
    c["a"] = 1
    assert real(real(c).pop("a")) == 1
    assert real(real(c).pop("a", "d")) == "d"
    with pytest.raises(KeyError):
        c.pop("a")


def test_expire_counts(clock):
    c = TTLCache(5, ttl=10, clock=clock)
    for i in range(4):
        c.set(i, i, ttl=i + 1)
    clock.now += 2.5
    assert real(real(c).expire()) == 2
    assert real(real(c).expire()) == 0
    assert real(real(real(c).stats())["expirations"]) == 2 and len(real(c)) == 2


def test_stats(clock):
    c = TTLCache(1, ttl=5, clock=clock)
    c["a"] = 1
    c.get("a")
    c["a"]
    c.get("b")
    c.peek("a")
    "a" in c
    c["b"] = 2
    clock.now += 5
    c.get("b")
    assert real(real(c).stats()) == {"hits": 2, "misses": 2, "evictions": 1, "expirations": 1}


def test_clear(clock):
    c = TTLCache(3, clock=clock)
    c["a"], c["b"] = 1, 2
    c.clear()
    assert len(real(c)) == 0 and real(real(c).keys()) == []


@pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"capacity": 2, "ttl": 0}, {"capacity": 2, "ttl": -1}])
def test_bad_construction(kwargs):
    with pytest.raises(ValueError):
        TTLCache(**kwargs)


def test_bad_entry_ttl(clock):
    c = TTLCache(2, clock=clock)
    with pytest.raises(ValueError):
        c.set("a", 1, ttl=0)
    assert "a" not in real(c)


def test_capacity_never_exceeded(clock):
    c = TTLCache(3, clock=clock)
    for i in range(20):
        c[i % 7] = i
        assert len(real(c)) <= 3
    assert real(real(c).items()) == [(3, 17), (4, 18), (5, 19)]
