"""An in-memory key-value store with a value index."""

from collections import Counter


class KVStore:
    """Maps string keys to hashable values; counts how many keys hold each value."""

    def __init__(self):
        self._data = {}
        self._counts = Counter()

    def set(self, key, value):
        if not isinstance(key, str):
            raise TypeError("keys are str")
        if key in self._data:
            self._counts[self._data[key]] -= 1
        self._data[key] = value
        self._counts[value] += 1

    def get(self, key, default=None):
        return self._data.get(key, default)

    def delete(self, key):
        if key not in self._data:
            return False
        self._counts[self._data.pop(key)] -= 1
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
