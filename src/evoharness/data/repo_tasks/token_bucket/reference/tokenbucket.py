"""Token-bucket rate limiting (continuous refill, lazy clock reads) and a per-key limiter."""

import time

__all__ = ["TokenBucket", "RateLimiter"]

_EPS = 1e-9


class TokenBucket:
    def __init__(self, rate, capacity, clock=time.monotonic, initial=None):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be > 0")
        initial = capacity if initial is None else initial
        if not 0 <= initial <= capacity:
            raise ValueError("initial must be within [0, capacity]")
        self.rate, self.capacity, self._clock = rate, capacity, clock
        self._tokens, self._last = float(initial), clock()

    def _refill(self):
        now = self._clock()
        if now > self._last:
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def _check(self, n):
        if n <= 0:
            raise ValueError("n must be > 0")
        if n > self.capacity:
            raise ValueError("n exceeds the bucket capacity")

    @property
    def tokens(self):
        self._refill()
        return self._tokens

    def try_acquire(self, n=1):
        self._check(n)
        self._refill()
        if self._tokens + _EPS >= n:
            self._tokens -= n
            return True
        return False

    def wait_time(self, n=1):
        self._check(n)
        self._refill()
        missing = n - self._tokens
        return 0.0 if missing <= _EPS else missing / self.rate

    def acquire(self, n=1):
        wait = self.wait_time(n)
        self._tokens -= n
        return wait


class RateLimiter:
    def __init__(self, rate, burst, clock=time.monotonic):
        TokenBucket(rate, burst, clock)  # validate arguments once, up front
        self.rate, self.burst, self._clock = rate, burst, clock
        self._buckets = {}

    def _bucket(self, key):
        if key not in self._buckets:
            self._buckets[key] = TokenBucket(self.rate, self.burst, self._clock)
        return self._buckets[key]

    def allow(self, key):
        return self._bucket(key).try_acquire(1)

    def retry_after(self, key):
        if key not in self._buckets:
            return 0.0
        return self._buckets[key].wait_time(1)

    def __len__(self):
        return len(self._buckets)

    def prune(self):
        full = [k for k, b in self._buckets.items() if b.tokens >= b.capacity - _EPS]
        for k in full:
            del self._buckets[k]
        return len(full)
