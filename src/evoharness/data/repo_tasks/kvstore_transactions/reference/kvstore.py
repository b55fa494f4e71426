"""An in-memory key-value store with a value index and nested transactions (undo logs)."""

import contextlib
from collections import Counter

_ABSENT = object()


class TransactionError(RuntimeError):
    """commit/rollback without an open transaction."""


class KVStore:
    """Maps string keys to hashable values; counts how many keys hold each value.

    Each open transaction keeps an undo log: key -> the value it had when the transaction
    first touched it (or _ABSENT). Rollback replays it; commit merges it into the parent's
    log, keeping the parent's older entries.
    """

    def __init__(self):
        self._data = {}
        self._counts = Counter()
        self._undo = []  # one dict per open transaction, innermost last

    def _record(self, key):
        if self._undo and key not in self._undo[-1]:
            self._undo[-1][key] = self._data.get(key, _ABSENT)

    def _write(self, key, value):
        if key in self._data:
            self._counts[self._data.pop(key)] -= 1
        if value is not _ABSENT:
            self._data[key] = value
            self._counts[value] += 1

    def set(self, key, value):
        if not isinstance(key, str):
            raise TypeError("keys are str")
        self._record(key)
        self._write(key, value)

    def get(self, key, default=None):
        return self._data.get(key, default)

    def delete(self, key):
        if key not in self._data:
            return False
        self._record(key)
        self._write(key, _ABSENT)
        return True

    def count(self, value):
        return self._counts[value]

    def keys(self):
        return sorted(self._data)

    def snapshot(self):
        return dict(self._data)

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    # transactions

    @property
    def depth(self):
        return len(self._undo)

    @property
    def in_transaction(self):
        return bool(self._undo)

    def begin(self):
        self._undo.append({})

    def rollback(self):
        if not self._undo:
            raise TransactionError("no open transaction")
        for key, old in self._undo.pop().items():
            self._write(key, old)

    def commit(self):
        if not self._undo:
            raise TransactionError("no open transaction")
        log = self._undo.pop()
        if self._undo:
            parent = self._undo[-1]
            for key, old in log.items():
                parent.setdefault(key, old)

    def commit_all(self):
        while self._undo:
            self.commit()

    @contextlib.contextmanager
    def transaction(self):
        self.begin()
        try:
            yield self
        except BaseException:
            self.rollback()
            raise
        self.commit()
