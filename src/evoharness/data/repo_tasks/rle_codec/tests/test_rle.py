from _strict import real  # values from the code under test must be genuine
import pytest

from rle import RLEError, decode, decode_bytes, encode, encode_bytes


@pytest.mark.parametrize("text,enc", [
    ("", ""), ("a", "1a"), ("aaab", "3a1b"), ("aab", "2a1b"), ("abc", "1a1b1c"),
    ("WWWWWWWWWWWWBWWWWWWWWWWWWBBB", "12W1B12W3B"), ("  \n\n", "2 2\n"), ("ééé€", "3é1€"),
])
def test_encode(text, enc):
    assert real(encode(text)) == enc
    assert real(decode(enc)) == text


def test_long_run():
    assert real(encode("x" * 1000)) == "1000x"
    assert real(decode("1000x")) == "x" * 1000


def test_decode_non_maximal():
    assert real(decode("1a1a2b")) == "aabb"


@pytest.mark.parametrize("bad", ["a", "3", "0a", "03a", "2a3", "-1a", "1a b"])
def test_decode_malformed(bad):
    with pytest.raises(RLEError):
        decode(bad)


def test_error_is_value_error():
    assert issubclass(real(RLEError), ValueError)


def test_encode_rejects_digits():
    with pytest.raises(ValueError):
        encode("a1b")


@pytest.mark.parametrize("fn", [encode, decode])
def test_type_errors(fn):
    with pytest.raises(TypeError):
        fn(b"abc")


def test_round_trip_mixed():
    text = "aaaabbbcca  zz\t\tq" * 3
    assert real(decode(real(encode(real(text))))) == real(text)


@pytest.mark.parametrize("data,enc", [
    (b"", b""), (b"\x00", b"\x01\x00"), (b"aab", b"\x02a\x01b"),
    (b"\x00" * 300, b"\xff\x00\x2d\x00"), (b"\x07" * 255, b"\xff\x07"), (b"\x07" * 256, b"\xff\x07\x01\x07"),
])
def test_bytes(data, enc):
    assert real(encode_bytes(data)) == enc
    assert real(decode_bytes(enc)) == data


def test_bytes_all_values_round_trip():
    data = bytes(range(256)) * 2 + b"\xff" * 600
    assert real(decode_bytes(real(encode_bytes(real(data))))) == real(data)


@pytest.mark.parametrize("bad", [b"\x01", b"\x00a", b"\x02a\x00b"])
def test_decode_bytes_malformed(bad):
    with pytest.raises(RLEError):
        decode_bytes(bad)
