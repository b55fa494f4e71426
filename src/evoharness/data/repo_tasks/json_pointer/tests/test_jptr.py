from _strict import real  # values from the code under test must be genuine
import copy

import pytest

from jptr import (InvalidPointerError, JsonPointerError, ResolutionError, escape, parse, resolve,
                  set_value, to_pointer, unescape)

# The example document of RFC 6901, section 5.
RFC = {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5,
       "k\"l": 6, " ": 7, "m~n": 8}


@pytest.mark.parametrize("pointer,expected", [
    ("", RFC), ("/foo", ["bar", "baz"]), ("/foo/0", "bar"), ("/", 0), ("/a~1b", 1), ("/c%d", 2),
    ("/e^f", 3), ("/g|h", 4), ("/i\\j", 5), ("/k\"l", 6), ("/ ", 7), ("/m~0n", 8),
])
def test_rfc_examples(pointer, expected):
    assert real(resolve(real(RFC), pointer)) == expected


def test_escape_order():
    assert real(unescape("~01")) == "~1"
    assert real(escape("~1")) == "~01"
    assert real(escape("a/b~c")) == "a~1b~0c"


def test_parse_and_to_pointer():
    assert real(parse("")) == []
    assert real(parse("/")) == [""]
    assert real(parse("/a~1b/0")) == ["a/b", "0"]
    assert real(to_pointer(["a/b", 0, "~"])) == "/a~1b/0/~0"
    for p in ["", "/", "//", "/a~1b/~0/3"]:
        assert real(to_pointer(real(parse(real(p))))) == real(p)


@pytest.mark.parametrize("bad", ["foo", "#/foo", "/a~2", "/a~", "/~x"])
def test_invalid_pointer(bad):
    with pytest.raises(InvalidPointerError):
        resolve(RFC, bad)


@pytest.mark.parametrize("pointer", ["/nope", "/foo/2", "/foo/-", "/foo/01", "/foo/-1", "/foo/bar", "/foo/0/x", "/ /x"])
def test_resolution_errors(pointer):
    with pytest.raises(ResolutionError):
        resolve(RFC, pointer)


def test_default():
    assert real(resolve(real(RFC), "/nope", default=None)) is None
    assert real(resolve(real(RFC), "/foo/9", default="d")) == "d"
    with pytest.raises(InvalidPointerError):
        resolve(RFC, "bad", default=None)


def test_error_hierarchy():
    assert issubclass(real(InvalidPointerError), real(JsonPointerError)) and issubclass(real(InvalidPointerError), ValueError)
    assert issubclass(real(ResolutionError), real(JsonPointerError)) and issubclass(real(ResolutionError), LookupError)


def test_dict_keys_are_strings():
    assert real(resolve({"0": "s", 0: "i"}, "/0")) == "s"
    with pytest.raises(ResolutionError):
        resolve({1: "x"}, "/1")


def test_set_value_dict_and_list():
    doc = {"a": {"b": [1, 2]}}
    assert real(set_value(real(doc), "/a/c", 3)) is real(doc)
    set_value(doc, "/a/b/0", 10)
    set_value(doc, "/a/b/-", 30)
    set_value(doc, "/a/b/3", 40)
    assert real(doc) == {"a": {"b": [10, 2, 30, 40], "c": 3}}


def test_set_value_root():
    doc = {"a": 1}
    assert real(set_value(real(doc), "", [1])) == [1]
    assert real(doc) == {"a": 1}


@pytest.mark.parametrize("pointer", ["/x/y", "/a/b/5", "/a/b/01", "/a/b/0/z"])
def test_set_value_errors(pointer):
    doc = {"a": {"b": [1]}}
    before = copy.deepcopy(doc)
    with pytest.raises(ResolutionError):
        set_value(doc, pointer, 0)
    assert real(doc) == real(before)
