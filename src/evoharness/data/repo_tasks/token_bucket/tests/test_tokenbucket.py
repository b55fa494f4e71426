from _strict import real  # values from the code under test must be genuine
import pytest

from tokenbucket import RateLimiter, TokenBucket


class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock(1000.0)


def test_starts_full(clock):
    b = TokenBucket(2, 5, clock)
    assert real(real(b).tokens) == 5


def test_initial(clock):
    assert real(real(TokenBucket(2, 5, real(clock), initial=0)).tokens) == 0


def test_burst_then_refuse(clock):
    b = TokenBucket(1, 3, clock)
    assert [real(real(b).try_acquire()) for _ in range(4)] == [True, True, True, False]
    assert real(real(b).tokens) == 0


def test_refill_is_continuous_and_capped(clock):
    b = TokenBucket(2, 5, clock, initial=0)
    clock.now += 1.25
    assert real(real(b).tokens) == pytest.approx(2.5)
    clock.now += 100
    assert real(real(b).tokens) == 5


def test_exact_refill_with_float_dust(clock):
    b = TokenBucket(10, 3, clock, initial=0)
    clock.now += 0.3  # 1000.3 - 1000.0 == 0.29999999999995453
    assert real(real(b).wait_time(3)) == 0.0
    assert real(real(b).try_acquire(3))


def test_failed_acquire_changes_nothing(clock):
    b = TokenBucket(1, 5, clock, initial=2)
    assert not real(real(b).try_acquire(3))
    assert real(real(b).tokens) == 2
    assert real(real(b).try_acquire(2))


def test_fractional_tokens(clock):
    b = TokenBucket(0.5, 2, clock, initial=0)
    clock.now += 1
    assert real(real(b).try_acquire(0.5))
    assert real(real(b).tokens) == pytest.approx(0)


def test_wait_time(clock):
    b = TokenBucket(4, 8, clock, initial=1)
    assert real(real(b).wait_time(1)) == 0.0
    assert real(real(b).wait_time(3)) == pytest.approx(0.5)
    assert real(real(b).tokens) == 1
    clock.now += 0.5
    assert real(real(b).wait_time(3)) == 0.0


def test_acquire_debt(clock):
    b = TokenBucket(2, 4, clock, initial=1)
    assert real(real(b).acquire(3)) == pytest.approx(1.0)
    assert real(real(b).tokens) == pytest.approx(-2)
    assert real(real(b).wait_time(1)) == pytest.approx(1.5)
    clock.now += 1.5
    assert real(real(b).try_acquire(1))


def test_acquire_no_wait(clock):
    b = TokenBucket(1, 2, clock)
    assert real(real(b).acquire()) == 0.0 and real(real(b).tokens) == 1


def test_clock_backwards(clock):
    b = TokenBucket(1, 10, clock, initial=0)
    clock.now -= 50
    assert real(real(b).tokens) == 0
    clock.now += 3
    assert real(real(b).tokens) == pytest.approx(3)


@pytest.mark.parametrize("method", ["try_acquire", "wait_time", "acquire"])
@pytest.mark.parametrize("n", [0, -1, 6])
def test_bad_n(clock, method, n):
    b = TokenBucket(1, 5, clock)
    with pytest.raises(ValueError):
        getattr(b, method)(n)


@pytest.mark.parametrize("args", [(0, 5), (-1, 5), (1, 0), (1, -2)])
def test_bad_construction(clock, args):
    with pytest.raises(ValueError):
        TokenBucket(*args, clock=clock)


@pytest.mark.parametrize("initial", [-0.1, 5.1])
def test_bad_initial(clock, initial):
    with pytest.raises(ValueError):
        TokenBucket(1, 5, clock, initial=initial)


def test_reads_the_injected_clock_only():
    ticks = []

    def fake():
        ticks.append(1)
        return 42.0
    b = TokenBucket(1, 1, fake)
    b.try_acquire()
    assert real(ticks) and real(real(b).tokens) == 0


def test_rate_limiter_per_key(clock):
    rl = RateLimiter(rate=1, burst=2, clock=clock)
    assert [real(real(rl).allow("alice")) for _ in range(3)] == [True, True, False]
    assert real(real(rl).allow("bob"))
    assert real(real(rl).retry_after("alice")) == pytest.approx(1.0)
    assert real(real(rl).retry_after("carol")) == 0.0
    assert len(real(rl)) == 2
    clock.now += 1
    assert real(real(rl).allow("alice")) and not real(real(rl).allow("alice"))


def test_rate_limiter_prune(clock):
    rl = RateLimiter(rate=1, burst=2, clock=clock)
    rl.allow("a")
    rl.allow("b")
    rl.allow("b")
    clock.now += 1
    assert real(real(rl).prune()) == 1
    assert len(real(rl)) == 1
    clock.now += 1
    assert real(real(rl).prune()) == 1 and len(real(rl)) == 0


def test_rate_limiter_bad_args(clock):
    with pytest.raises(ValueError):
        RateLimiter(rate=0, burst=1, clock=clock)
