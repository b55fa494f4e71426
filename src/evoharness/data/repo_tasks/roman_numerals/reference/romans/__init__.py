"""Integer <-> Roman numeral conversion (canonical subtractive notation, 1..3999)."""

import re

__all__ = ["InvalidRomanNumeralError", "to_roman", "from_roman", "is_roman", "roman_range"]

_PAIRS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_CANONICAL = re.compile(r"M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")


class InvalidRomanNumeralError(ValueError):
    pass


def to_roman(n):
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected int, got {type(n).__name__}")
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is outside 1..3999")
    out = []
    for value, letters in _PAIRS:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)


def from_roman(s):
    if not isinstance(s, str):
        raise TypeError(f"expected str, got {type(s).__name__}")
    text = s.strip().upper()
    if not text or not _CANONICAL.fullmatch(text):
        raise InvalidRomanNumeralError(f"not a canonical Roman numeral: {s!r}")
    total, i = 0, 0
    for value, letters in _PAIRS:
        while text.startswith(letters, i):
            total += value
            i += len(letters)
    return total


def is_roman(s):
    try:
        from_roman(s)
    except (TypeError, ValueError):
        return False
    return True


def roman_range(start, stop, step=1):
    if step == 0:
        raise ValueError("step must not be zero")
    for n in range(start, stop, step):
        yield to_roman(n)
