"""A least-recently-used cache with per-entry time-to-live and an injectable clock."""

import time
from collections import OrderedDict

__all__ = ["TTLCache"]

_DEFAULT = object()


class TTLCache:
    def __init__(self, capacity, ttl=None, clock=time.monotonic):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._check_ttl(ttl)
        self.capacity, self.ttl, self._clock = capacity, ttl, clock
        self._data = OrderedDict()  # key -> (value, expires_at or None); order = LRU first
        self._stats = {"hits": 0, "misses": 0, "evictions": 0, "expirations": 0}

    @staticmethod
    def _check_ttl(ttl):
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl must be > 0 or None")

    def _live(self, key):
        """The entry if present and not expired (purging it if expired), else None."""
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[1] is not None and self._clock() >= entry[1]:
            del self._data[key]
            self._stats["expirations"] += 1
            return None
        return entry

    def expire(self):
        now = self._clock()
        dead = [k for k, (_, exp) in self._data.items() if exp is not None and now >= exp]
        for k in dead:
            del self._data[k]
        self._stats["expirations"] += len(dead)
        return len(dead)

    def set(self, key, value, ttl=_DEFAULT):
        ttl = self.ttl if ttl is _DEFAULT else ttl
        self._check_ttl(ttl)
        if self._live(key) is None and len(self._data) >= self.capacity:
            self.expire()
            while len(self._data) >= self.capacity:
                self._data.popitem(last=False)
                self._stats["evictions"] += 1
        self._data[key] = (value, None if ttl is None else self._clock() + ttl)
        self._data.move_to_end(key)

    def get(self, key, default=None):
        entry = self._live(key)
        if entry is None:
            self._stats["misses"] += 1
            return default
        self._stats["hits"] += 1
        self._data.move_to_end(key)
        return entry[0]

    def peek(self, key, default=None):
        entry = self._live(key)
        return default if entry is None else entry[0]

    def __getitem__(self, key):
        sentinel = object()
        value = self.get(key, sentinel)
        if value is sentinel:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value):
        self.set(key, value)

    def __delitem__(self, key):
        if self._live(key) is None:
            raise KeyError(key)
        del self._data[key]

    def __contains__(self, key):
        return self._live(key) is not None

    def __len__(self):
        self.expire()
        return len(self._data)

    def pop(self, key, default=_DEFAULT):
        entry = self._live(key)
        if entry is None:
            if default is _DEFAULT:
                raise KeyError(key)
            return default
        del self._data[key]
        return entry[0]

    def keys(self):
        self.expire()
        return list(self._data)

    def items(self):
        self.expire()
        return [(k, v) for k, (v, _) in self._data.items()]

    def ttl_remaining(self, key):
        entry = self._live(key)
        if entry is None:
            raise KeyError(key)
        return None if entry[1] is None else entry[1] - self._clock()

    def clear(self):
        self._data.clear()

    def stats(self):
        return dict(self._stats)
