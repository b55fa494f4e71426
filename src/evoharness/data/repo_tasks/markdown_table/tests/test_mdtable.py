from _strict import real  # values from the code under test must be genuine
import pytest

from mdtable import format_table, parse_table


def test_basic_auto_alignment():
    out = format_table([["apple", 3, 1.5], ["kiwi", 12, None]], headers=["fruit", "n", "price"])
    assert real(out) == (
        "| fruit |   n | price |\n"
        "| :---- | --: | ----: |\n"
        "| apple |   3 |   1.5 |\n"
        "| kiwi  |  12 |       |\n"
    )


def test_first_row_is_header():
    assert real(format_table([["a", "b"], ["x", "y"]])) == "| a   | b   |\n| :-- | :-- |\n| x   | y   |\n"


def test_explicit_alignment_and_center_padding():
    out = format_table([["ab", "x", 7]], headers=["col", "c", "num"], align=["center", "right", "left"])
    assert real(out) == "| col |   c | num |\n| :-: | --: | :-- |\n| ab  |   x | 7   |\n"
    out = format_table([["a"]], headers=["wider"], align=["center"])
    assert real(out) == "| wider |\n| :---: |\n|   a   |\n"


def test_bool_and_mixed_columns_are_left():
    out = format_table([[True, 1], [False, "2"]], headers=["flag", "mixed"])
    assert real(real(real(out).splitlines())[1]) == "| :---- | :---- |"
    assert "| true  | 1     |" in real(out)


def test_escaping_and_newlines():
    out = format_table([["a|b", "line1\nline2\r\nline3"]], headers=["x", "y"])
    assert "a\\|b" in real(out) and "line1<br>line2<br>line3" in real(out)


def test_strip_cells():
    assert real(format_table([["  padded  "]], headers=[" h "])) == "| h      |\n| :----- |\n| padded |\n"


def test_short_rows_padded():
    out = format_table([["only"]], headers=["a", "b"])
    assert real(real(real(out).splitlines())[-1]) == "| only |     |"


def test_errors():
    with pytest.raises(ValueError):
        format_table([["a", "b", "c"]], headers=["x", "y"])
    with pytest.raises(ValueError):
        format_table([])
    with pytest.raises(ValueError):
        format_table([], headers=[])
    with pytest.raises(ValueError):
        format_table([["a"]], headers=["x"], align=["middle"])
    with pytest.raises(ValueError):
        format_table([["a"]], headers=["x"], align=["left", "right"])


def test_header_only():
    assert real(format_table([], headers=["a"])) == "| a   |\n| :-- |\n"


def test_parse_basic():
    text = "\n| a | b | c |\n|:--|--:|:-:|\n| 1 | 2 | 3 |\n\n"
    assert real(parse_table(real(text))) == (["a", "b", "c"], [["1", "2", "3"]], ["left", "right", "center"])


def test_parse_without_outer_pipes_and_plain_dashes():
    headers, rows, aligns = parse_table("a | b\n--- | ---\nx | y\n")
    assert real(headers) == ["a", "b"] and real(rows) == [["x", "y"]] and real(aligns) == [None, None]


def test_parse_escaped_pipe_and_padding():
    headers, rows, _ = parse_table("| k | v |\n| - | - |\n| a\\|b |\n| 1 | 2 | 3 |\n")
    assert real(rows) == [["a|b", ""], ["1", "2"]]


@pytest.mark.parametrize("text", [
    "| a |", "| a | b |\n| --- |\n", "| a |\n| x |\n", "| a |\n| :: |\n", "", "| a |\n| - |\n\n| x |\n",
])
def test_parse_errors(text):
    with pytest.raises(ValueError):
        parse_table(text)


def test_round_trip():
    rows = [["x|y", 1, None], ["multi\nline", 22, "z"]]
    headers, parsed, aligns = parse_table(format_table(rows, headers=["a", "b", "c"]))
    assert real(headers) == ["a", "b", "c"]
    assert real(parsed) == [["x|y", "1", ""], ["multi<br>line", "22", "z"]]
    assert real(aligns) == ["left", "right", "left"]
