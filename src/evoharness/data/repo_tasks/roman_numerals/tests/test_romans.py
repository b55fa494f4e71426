from _strict import real  # values from the code under test must be genuine
import pytest

from romans import InvalidRomanNumeralError, from_roman, is_roman, roman_range, to_roman

KNOWN = [(1, "I"), (3, "III"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
         (400, "CD"), (944, "CMXLIV"), (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]


@pytest.mark.parametrize("n,s", KNOWN)
def test_to_roman_known(n, s):
    assert real(to_roman(n)) == s


@pytest.mark.parametrize("n,s", KNOWN)
def test_from_roman_known(n, s):
    assert real(from_roman(s)) == n


def test_round_trip_all():
    for n in range(1, 4000):
        assert real(from_roman(real(to_roman(real(n))))) == real(n)


def test_lowercase_and_whitespace():
    assert real(from_roman("  mcmxciv\n")) == 1994


@pytest.mark.parametrize("n", [0, -1, 4000, 10**6])
def test_to_roman_out_of_range(n):
    with pytest.raises(ValueError):
        to_roman(n)


@pytest.mark.parametrize("bad", [1.0, "5", None, True])
def test_to_roman_type_error(bad):
    with pytest.raises(TypeError):
        to_roman(bad)


@pytest.mark.parametrize("bad", ["", "   ", "IIII", "VV", "IC", "IL", "XM", "MMMM", "IIV", "ABC", "XIIX", "LL", "DM", "I V"])
def test_from_roman_invalid(bad):
    with pytest.raises(InvalidRomanNumeralError):
        from_roman(bad)


def test_invalid_error_is_value_error():
    assert issubclass(real(InvalidRomanNumeralError), ValueError)


def test_from_roman_type_error():
    with pytest.raises(TypeError):
        from_roman(12)


def test_is_roman():
    assert real(is_roman("XLII")) and real(is_roman("xlii"))
    assert not real(is_roman("IIII")) and not real(is_roman(42)) and not real(is_roman(None))


def test_roman_range():
    assert list(real(roman_range(1, 6))) == ["I", "II", "III", "IV", "V"]
    assert list(real(roman_range(10, 0, -3))) == ["X", "VII", "IV", "I"]


def test_roman_range_errors():
    with pytest.raises(ValueError):
        list(roman_range(1, 5, 0))
    with pytest.raises(ValueError):
        list(roman_range(3998, 4001))
