from _strict import real  # values from the code under test must be genuine
import pytest

from wrapit import align, dedent, fill, wrap

TEXT = "The quick brown fox jumps over the lazy dog"


def test_basic_wrap():
    assert real(wrap(real(TEXT), 10)) == ["The quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_exact_fit():
    assert real(wrap("aaaa bbbb", 9)) == ["aaaa bbbb"]
    assert real(wrap("aaaa bbbb", 8)) == ["aaaa", "bbbb"]


def test_whitespace_collapses():
    assert real(wrap("  a\t\tb\n\nc  ", 80)) == ["a b c"]


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty(text):
    assert real(wrap(text, 5)) == []


def test_every_line_fits():
    for width in range(5, 30):
        lines = real(wrap(TEXT * 3, width))
        assert len(lines) >= len(TEXT * 3) // width  # an empty answer fits trivially
        for line in lines:
            assert len(real(line)) <= real(width)


def test_indent():
    assert real(wrap(real(TEXT), 12, indent="> ")) == ["> The quick", "> brown fox", "> jumps over", "> the lazy", "> dog"]


def test_break_long_words():
    assert real(wrap("ab abcdefghij cd", 4)) == ["ab", "abcd", "efgh", "ij", "cd"]
    assert real(wrap("abcdefgh x", 4)) == ["abcd", "efgh", "x"]
    assert real(wrap("abcdefg x", 4)) == ["abcd", "efg", "x"]
    assert real(wrap("abcdef x", 4)) == ["abcd", "ef x"]


def test_no_break_long_words():
    assert real(wrap("ab abcdefghij cd", 4, break_long_words=False)) == ["ab", "abcdefghij", "cd"]


@pytest.mark.parametrize("width,indent", [(0, ""), (-3, ""), (2, "  "), (3, "    ")])
def test_bad_width(width, indent):
    with pytest.raises(ValueError):
        wrap("a b", width, indent=indent)


def test_fill():
    assert real(fill(real(TEXT), 10)) == "The quick\nbrown fox\njumps over\nthe lazy\ndog"
    assert real(fill(real(TEXT), 12, indent="  ")) == real("\n".join(real(wrap(real(TEXT), 12, indent="  "))))


def test_align_left_right_center():
    assert real(align(["ab", "abc"], 6, "left")) == ["ab    ", "abc   "]
    assert real(align(["ab", "abc"], 6, "right")) == ["    ab", "   abc"]
    assert real(align(["ab", "abc"], 6, "center")) == ["  ab  ", " abc  "]


def test_justify():
    lines = ["a bb c", "dd e", "last one"]
    assert real(align(real(lines), 10, "justify")) == ["a   bb   c", "dd       e", "last one  "]
    assert real(align(["a b c d e", "z"], 12, "justify")) == ["a  b  c  d e", "z           "]


def test_justify_single_word_and_exact():
    assert real(align(["word", "x y"], 6, "justify")) == ["word  ", "x y   "]
    assert real(align(["ab cd", "x"], 5, "justify")) == ["ab cd", "x    "]


def test_justify_wrap_integration():
    lines = align(wrap(TEXT, 16), 16, "justify")
    assert all(len(real(ln)) == 16 for ln in real(lines))
    assert real(real(lines)[0]) == "The  quick brown"


@pytest.mark.parametrize("how", ["left", "right", "center", "justify"])
def test_align_too_long(how):
    with pytest.raises(ValueError):
        align(["abcdef"], 5, how)


def test_align_unknown():
    with pytest.raises(ValueError):
        align(["a"], 5, "middle")


def test_dedent():
    assert real(dedent("    a\n      b\n    c")) == "a\n  b\nc"
    assert real(dedent("\ta\n\t\tb")) == "a\n\tb"
    assert real(dedent("  a\n\n   \n  b\n")) == "a\n\n\nb\n"
    assert real(dedent(" \ta\n  b")) == "\ta\n b"
    assert real(dedent("no indent\n  x")) == "no indent\n  x"
