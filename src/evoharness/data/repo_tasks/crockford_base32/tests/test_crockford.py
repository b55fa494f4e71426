from _strict import real  # values from the code under test must be genuine
import pytest

from crockford import DecodeError, decode, encode, normalize


@pytest.mark.parametrize("n,s", [(0, "0"), (1, "1"), (31, "Z"), (32, "10"), (1234, "16J"),
                                 (1024, "100"), (2**64 - 1, "FZZZZZZZZZZZZ")])
def test_encode_decode(n, s):
    assert real(encode(n)) == s
    assert real(decode(s)) == n


@pytest.mark.parametrize("n", [0, 1, 36, 37, 1234, 999999, 2**40 + 7])
def test_checksum_round_trip(n):
    s = encode(n, checksum=True)
    assert real(real(s)[-1]) == real("0123456789ABCDEFGHJKMNPQRSTVWXYZ*~$=U"[n % 37])
    assert real(decode(real(s), checksum=True)) == n


def test_checksum_symbols():
    assert real(encode(32, checksum=True)) == "10*"
    assert real(encode(36, checksum=True)) == "14U"
    assert real(decode("14u", checksum=True)) == 36


def test_checksum_mismatch():
    with pytest.raises(DecodeError):
        decode("16JA", checksum=True)


def test_grouping():
    assert real(encode(1234567, group=2)) == "15-NM-7"
    assert real(encode(1234567, group=3)) == "15N-M7"
    assert real(encode(1234567, group=2, checksum=True)) == "15-NM-7" + real("0123456789ABCDEFGHJKMNPQRSTVWXYZ*~$=U"[1234567 % 37])


def test_aliases_case_and_hyphens():
    assert real(decode("16j")) == 1234
    assert real(decode("1-6-J")) == 1234
    assert real(decode("IO")) == 32
    assert real(decode("lo")) == 32


def test_normalize():
    assert real(normalize("il-o-ab")) == "110AB"


@pytest.mark.parametrize("bad", ["", "-", "U", "1U", "ab c", "*", "12#"])
def test_decode_invalid(bad):
    with pytest.raises(DecodeError):
        decode(bad)


def test_decode_error_is_value_error():
    assert issubclass(real(DecodeError), ValueError)


def test_encode_errors():
    with pytest.raises(ValueError):
        encode(-1)
    with pytest.raises(TypeError):
        encode(1.5)
    with pytest.raises(TypeError):
        encode(True)
    with pytest.raises(ValueError):
        encode(5, group=-1)


def test_decode_type_error():
    with pytest.raises(TypeError):
        decode(123)


def test_round_trip_many():
    for n in range(0, 5000, 7):
        assert real(decode(real(encode(real(n), checksum=True, group=2)), checksum=True)) == real(n)
