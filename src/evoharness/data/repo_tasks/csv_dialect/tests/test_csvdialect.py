from _strict import real  # values from the code under test must be genuine
import pytest

import csvdialect
from csvdialect import CSVError, Dialect, parse, parse_dicts, sniff


def test_simple():
    assert real(parse("a,b,c\r\n1,2,3\r\n")) == [["a", "b", "c"], ["1", "2", "3"]]


def test_line_endings_and_no_final_newline():
    assert real(parse("a\nb\rc\r\nd")) == [["a"], ["b"], ["c"], ["d"]]


def test_empty_input_and_empty_lines():
    assert real(parse("")) == []
    assert real(parse("a\n\nb\n")) == [["a"], [], ["b"]]


def test_empty_fields():
    assert real(parse(",\n,a,\n")) == [["", ""], ["", "a", ""]]


def test_quoted_fields():
    text = 'name,quote\n"Smith, J","He said ""hi""\r\nthen left"\n'
    assert real(parse(real(text))) == [["name", "quote"], ["Smith, J", 'He said "hi"\r\nthen left']]


def test_quoted_empty_and_quote_in_unquoted():
    assert real(parse('"",x\n')) == [["", "x"]]
    assert real(parse('ab"c,d\n')) == [['ab"c', "d"]]


def test_garbage_after_closing_quote():
    with pytest.raises(CSVError) as info:
        parse('a\n"x"y,z\n')
    assert real(real(real(info).value).line) == 2


def test_unterminated_quote_reports_start_line():
    with pytest.raises(CSVError) as info:
        parse('a\nb\n"open\nstill open\n')
    assert real(real(real(info).value).line) == 3
    assert isinstance(real(real(info).value), ValueError)


def test_other_dialects():
    d = Dialect(delimiter=";", quotechar="'")
    assert real(parse("a;'b;c';'it''s'\n", real(d))) == [["a", "b;c", "it's"]]
    assert real(parse("a\tb\n", real(Dialect(delimiter="\t")))) == [["a", "b"]]


def test_skipinitialspace():
    assert real(parse('a, b,  "c, d"\n', real(Dialect(skipinitialspace=True)))) == [["a", "b", "c, d"]]
    assert real(parse("a, b\n")) == [["a", " b"]]


def test_escapechar():
    d = Dialect(escapechar="\\", doublequote=False)
    assert real(parse('a\\,b,"q\\"uote",c\\\\\n', real(d))) == [["a,b", 'q"uote', "c\\"]]
    with pytest.raises(CSVError):
        parse("abc\\", d)


@pytest.mark.parametrize("kwargs", [
    {"delimiter": ""}, {"delimiter": ",,"}, {"delimiter": '"'}, {"quotechar": "\n"}, {"escapechar": ","},
    {"delimiter": 1},
])
def test_bad_dialect(kwargs):
    with pytest.raises(ValueError):
        Dialect(**kwargs)


def test_dialect_frozen():
    with pytest.raises(Exception):
        Dialect().delimiter = ";"


def test_format_minimal_quoting():
    rows = [["a", "b,c", 'say "x"', "line\nbreak", " pad", 1, None, 2.5]]
    assert real(real(csvdialect).format(real(rows))) == 'a,"b,c","say ""x""","line\nbreak"," pad",1,,2.5\r\n'


def test_format_single_empty_field_and_empty_row():
    assert real(real(csvdialect).format([[""], [], ["", ""]])) == '""\r\n\r\n,\r\n'


def test_format_escape_mode():
    d = Dialect(escapechar="\\", doublequote=False, lineterminator="\n")
    assert real(real(csvdialect).format([['q"x', "back\\slash"]], real(d))) == '"q\\"x",back\\\\slash\n'
    with pytest.raises(CSVError) as info:
        csvdialect.format([["ok"], ['bad"']], Dialect(doublequote=False))
    assert real(real(real(info).value).line) == 2


@pytest.mark.parametrize("dialect", [
    Dialect(), Dialect(delimiter=";", lineterminator="\n"), Dialect(delimiter="\t", quotechar="'"),
    Dialect(escapechar="\\", doublequote=False), Dialect(escapechar="~"),
])
def test_round_trip(dialect):
    rows = [["plain", "", " lead", "trail ", 'q"q', "a,b;c\td", "multi\r\nline\rx\ny", "~\\"], [], [""], ["", ""], ["end"]]
    assert real(parse(real(real(csvdialect).format(real(rows), dialect)), dialect)) == real(rows)


def test_parse_dicts():
    text = "id,name\n1,Ann\n\n2,\"Bob, Jr\"\n"
    assert real(parse_dicts(real(text))) == [{"id": "1", "name": "Ann"}, {"id": "2", "name": "Bob, Jr"}]
    assert real(parse_dicts("")) == []
    assert real(parse_dicts("only,header\n")) == []


def test_parse_dicts_errors():
    with pytest.raises(CSVError) as info:
        parse_dicts('a,b\n1,2\n"x\ny",2\n3\n')
    assert real(real(real(info).value).line) == 5
    with pytest.raises(CSVError) as info:
        parse_dicts("\na,a\n")
    assert real(real(real(info).value).line) == 2


@pytest.mark.parametrize("sample,delimiter", [
    ("a,b,c\n1,2,3\n4,5,6\n", ","), ("a;b;c\n1;2,5;3\n4;5,1;6\n", ";"), ("x\ty\n1\t2\n", "\t"),
    ('"a;b",c\n"d;e",f\n', ","), ("a|b\nc|d\ne,f|g\n", "|"), ("a,b;c\nd,e;f\n", ","),
])
def test_sniff(sample, delimiter):
    assert real(real(sniff(sample)).delimiter) == delimiter


def test_sniff_skipinitialspace_and_restricted_candidates():
    d = sniff("a, b, c\n1, 2, 3\n")
    assert real(real(d).delimiter) == "," and real(real(d).skipinitialspace) is True
    assert real(real(sniff("a,b;c\nd,e;f\n", delimiters=";")).delimiter) == ";"
    assert real(real(sniff("a, b,c\n")).skipinitialspace) is False


def test_sniff_failure():
    with pytest.raises(CSVError):
        sniff("no delimiters here\njust words\n")
