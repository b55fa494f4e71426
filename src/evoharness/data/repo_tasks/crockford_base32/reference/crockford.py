"""Crockford base32 for non-negative integers, with optional mod-37 check symbol."""

__all__ = ["DecodeError", "encode", "decode", "normalize"]

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CHECK = ALPHABET + "*~$=U"
_ALIASES = {"I": "1", "L": "1", "O": "0"}
_VALUE = {ch: i for i, ch in enumerate(CHECK)}


class DecodeError(ValueError):
    pass


def encode(n, checksum=False, group=0):
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError("n must be an int")
    if n < 0:
        raise ValueError("n must be non-negative")
    if group < 0:
        raise ValueError("group must be >= 0")
    digits, m = [], n
    while True:
        m, r = divmod(m, 32)
        digits.append(ALPHABET[r])
        if m == 0:
            break
    body = "".join(reversed(digits))
    if group:
        body = "-".join(body[i:i + group] for i in range(0, len(body), group))
    return body + (CHECK[n % 37] if checksum else "")


def normalize(s):
    if not isinstance(s, str):
        raise TypeError("s must be a str")
    out = []
    for ch in s.upper():
        if ch == "-":
            continue
        ch = _ALIASES.get(ch, ch)
        if ch not in ALPHABET:
            raise DecodeError(f"invalid symbol {ch!r}")
        out.append(ch)
    return "".join(out)


def decode(s, checksum=False):
    if not isinstance(s, str):
        raise TypeError("s must be a str")
    text = s.replace("-", "")
    check = None
    if checksum:
        if not text:
            raise DecodeError("empty input")
        check = text[-1].upper()
        check = _ALIASES.get(check, check)
        if check not in _VALUE:
            raise DecodeError(f"invalid check symbol {text[-1]!r}")
        text = text[:-1]
    body = normalize(text)
    if not body:
        raise DecodeError("empty input")
    n = 0
    for ch in body:
        n = n * 32 + _VALUE[ch]
    if checksum and _VALUE[check] != n % 37:
        raise DecodeError("check symbol mismatch")
    return n
