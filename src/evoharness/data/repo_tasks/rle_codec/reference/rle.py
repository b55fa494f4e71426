"""Run-length encoding for text ("3a1b") and bytes ((count, value) pairs)."""

import itertools
import re

__all__ = ["RLEError", "encode", "decode", "encode_bytes", "decode_bytes"]

_TOKEN = re.compile(r"([1-9][0-9]*)(\D)", re.S)


class RLEError(ValueError):
    pass


def encode(text):
    if not isinstance(text, str):
        raise TypeError("encode() needs a str")
    if any(ch in "0123456789" for ch in text):
        raise RLEError("digits cannot be run-length encoded")
    return "".join(f"{len(list(group))}{ch}" for ch, group in itertools.groupby(text))


def decode(data):
    if not isinstance(data, str):
        raise TypeError("decode() needs a str")
    out, pos = [], 0
    while pos < len(data):
        m = _TOKEN.match(data, pos)
        if m is None:
            raise RLEError(f"malformed run at offset {pos}: {data[pos:pos + 10]!r}")
        out.append(m.group(2) * int(m.group(1)))
        pos = m.end()
    return "".join(out)


def encode_bytes(data):
    out = bytearray()
    for value, group in itertools.groupby(bytes(data)):
        n = len(list(group))
        while n:
            chunk = min(n, 255)
            out += bytes((chunk, value))
            n -= chunk
    return bytes(out)


def decode_bytes(data):
    data = bytes(data)
    if len(data) % 2:
        raise RLEError("odd length: expected (count, value) pairs")
    out = bytearray()
    for i in range(0, len(data), 2):
        if data[i] == 0:
            raise RLEError(f"zero count at offset {i}")
        out += bytes((data[i + 1],)) * data[i]
    return bytes(out)
