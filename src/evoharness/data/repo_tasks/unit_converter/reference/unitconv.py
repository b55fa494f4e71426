"""Convert lengths, masses, times (linear factors) and temperatures (affine)."""

import re

__all__ = ["UnitError", "DimensionError", "convert", "dimension", "units", "parse_quantity", "convert_text"]

_FACTORS = {
    "length": {"m": 1.0, "km": 1000.0, "cm": 0.01, "mm": 0.001, "in": 0.0254, "ft": 0.3048,
               "yd": 0.9144, "mi": 1609.344},
    "mass": {"kg": 1.0, "g": 0.001, "mg": 1e-6, "lb": 0.45359237, "oz": 0.028349523125},
    "time": {"s": 1.0, "ms": 0.001, "min": 60.0, "h": 3600.0, "day": 86400.0},
}
# temperature: (to_kelvin, from_kelvin)
_TEMPS = {
    "K": (lambda x: x, lambda k: k),
    "C": (lambda x: x + 273.15, lambda k: k - 273.15),
    "F": (lambda x: (x - 32) * 5 / 9 + 273.15, lambda k: (k - 273.15) * 9 / 5 + 32),
}
_QUANTITY = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S+)\s*")


class UnitError(ValueError):
    pass


class DimensionError(ValueError):
    pass


def dimension(unit):
    unit = unit.strip()
    if unit in _TEMPS:
        return "temperature"
    for dim, table in _FACTORS.items():
        if unit in table:
            return dim
    raise UnitError(f"unknown unit {unit!r}")


def units(dim=None):
    tables = {**{d: list(t) for d, t in _FACTORS.items()}, "temperature": list(_TEMPS)}
    if dim is None:
        return sorted(u for names in tables.values() for u in names)
    if dim not in tables:
        raise ValueError(f"unknown dimension {dim!r}")
    return sorted(tables[dim])


def convert(value, src, dst):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("value must be a number")
    src, dst = src.strip(), dst.strip()
    d_src, d_dst = dimension(src), dimension(dst)
    if d_src != d_dst:
        raise DimensionError(f"cannot convert {d_src} ({src}) to {d_dst} ({dst})")
    if d_src == "temperature":
        kelvin = _TEMPS[src][0](value)
        if kelvin < 0:
            raise ValueError("temperature below absolute zero")
        return _TEMPS[dst][1](kelvin)
    table = _FACTORS[d_src]
    return value * table[src] / table[dst]


def parse_quantity(text):
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    dimension(m.group(2))
    return float(m.group(1)), m.group(2)


def convert_text(text, dst, digits=2):
    value, unit = parse_quantity(text)
    return f"{format(convert(value, unit, dst), f'.{digits}f')} {dst.strip()}"
