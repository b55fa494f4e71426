from _strict import real  # values from the code under test must be genuine
import pytest

from unitconv import DimensionError, UnitError, convert, convert_text, dimension, parse_quantity, units


@pytest.mark.parametrize("value,src,dst,expected", [
    (1, "km", "m", 1000), (1, "mi", "km", 1.609344), (12, "in", "ft", 1), (3, "ft", "yd", 1),
    (1, "lb", "oz", 16), (2500, "g", "kg", 2.5), (1, "kg", "mg", 1e6), (90, "min", "h", 1.5),
    (1, "day", "s", 86400), (250, "ms", "s", 0.25), (0, "C", "K", 273.15), (100, "C", "F", 212),
    (-40, "F", "C", -40), (32, "F", "K", 273.15), (0, "K", "C", -273.15), (5, "m", "m", 5),
])
def test_convert(value, src, dst, expected):
    assert real(convert(value, src, dst)) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_round_trip():
    lengths = real(units("length"))
    assert "km" in lengths and "ft" in lengths  # an empty list would make the loop vacuous
    for u in lengths:
        assert real(convert(real(convert(3.7, "m", real(u))), real(u), "m")) == pytest.approx(3.7, rel=1e-12)


def test_whitespace_stripped():
    assert real(convert(1, " km ", "m")) == pytest.approx(1000)


@pytest.mark.parametrize("src,dst", [("m", "kg"), ("s", "C"), ("F", "ft")])
def test_dimension_mismatch(src, dst):
    with pytest.raises(DimensionError):
        convert(1, src, dst)


@pytest.mark.parametrize("unit", ["KM", "meters", "", "c", "Min"])
def test_unknown_unit(unit):
    with pytest.raises(UnitError):
        convert(1, unit, "m")


def test_error_classes():
    assert issubclass(real(UnitError), ValueError) and issubclass(real(DimensionError), ValueError)


def test_below_absolute_zero():
    with pytest.raises(ValueError):
        convert(-300, "C", "K")
    with pytest.raises(ValueError):
        convert(-1, "K", "F")


@pytest.mark.parametrize("bad", ["1", None, True])
def test_type_error(bad):
    with pytest.raises(TypeError):
        convert(bad, "m", "km")


def test_dimension_and_units():
    assert real(dimension("oz")) == "mass" and real(dimension("F")) == "temperature" and real(dimension("day")) == "time"
    assert real(units("temperature")) == ["C", "F", "K"]
    assert real(units("time")) == ["day", "h", "min", "ms", "s"]
    assert len(real(units())) == 21 and real(units()) == sorted(real(units()))
    with pytest.raises(ValueError):
        units("volume")
    with pytest.raises(UnitError):
        dimension("parsec")


@pytest.mark.parametrize("text,expected", [
    ("12.5 km", (12.5, "km")), ("-40C", (-40.0, "C")), ("3e2 m", (300.0, "m")), (" 7  ft ", (7.0, "ft")),
    (".5h", (0.5, "h")), ("+2 lb", (2.0, "lb")),
])
def test_parse_quantity(text, expected):
    assert real(parse_quantity(text)) == expected


@pytest.mark.parametrize("text", ["km", "12", "1.2.3 m", "inf m", "nan K", "1 2 m", ""])
def test_parse_quantity_malformed(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_parse_quantity_unknown_unit():
    with pytest.raises(UnitError):
        parse_quantity("3 furlongs")


def test_convert_text():
    assert real(convert_text("1 mi", "km")) == "1.61 km"
    assert real(convert_text("100 C", "F", 0)) == "212 F"
    assert real(convert_text("1 in", "mm", 3)) == "25.400 mm"
    with pytest.raises(DimensionError):
        convert_text("1 kg", "m")
