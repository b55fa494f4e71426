from _strict import real  # values from the code under test must be genuine
import pytest

from tinyargs import ArgError, Parser


def make():
    p = Parser("cp")
    p.add_argument("-v", "--verbose", action="count")
    p.add_argument("-f", "--force", action="store_true")
    p.add_argument("-o", "--output-file")
    p.add_argument("-I", "--include", action="append", metavar="PATH")
    p.add_argument("-n", "--num", type=int, default=1)
    p.add_argument("--mode", choices=["fast", "safe"], default="safe")
    p.add_argument("src")
    p.add_argument("dst", nargs="*")
    return p


def test_defaults():
    ns = make().parse(["a"])
    assert vars(real(ns)) == {"verbose": 0, "force": False, "output_file": None, "include": [], "num": 1,
                        "mode": "safe", "src": "a", "dst": []}


def test_long_options():
    ns = make().parse(["--verbose", "--output-file", "out.txt", "--num=3", "--mode=fast", "a", "b", "c"])
    assert (real(real(ns).verbose), real(real(ns).output_file), real(real(ns).num), real(real(ns).mode), real(real(ns).src), real(real(ns).dst)) == (1, "out.txt", 3, "fast", "a", ["b", "c"])


def test_short_options_and_attached_values():
    ns = make().parse(["-o", "x", "-n5", "a"])
    assert real(real(ns).output_file) == "x" and real(real(ns).num) == 5


def test_bundles():
    ns = make().parse(["-vvf", "-vofile", "a"])
    assert real(real(ns).verbose) == 3 and real(real(ns).force) is True and real(real(ns).output_file) == "file"
    ns = make().parse(["-fo", "next", "a"])
    assert real(real(ns).force) and real(real(ns).output_file) == "next"


def test_append_fresh_each_parse():
    p = make()
    assert real(real(real(p).parse(["-I", "x", "--include=y", "-Iz", "a"])).include) == ["x", "y", "z"]
    assert real(real(real(p).parse(["a"])).include) == []


def test_last_store_wins_and_interleaving():
    ns = make().parse(["a", "-n", "1", "b", "--num", "2", "c", "-v"])
    assert real(real(ns).num) == 2 and real(real(ns).src) == "a" and real(real(ns).dst) == ["b", "c"] and real(real(ns).verbose) == 1


def test_double_dash():
    ns = make().parse(["-f", "--", "-v", "--num"])
    assert real(real(ns).force) and real(real(ns).verbose) == 0 and real(real(ns).src) == "-v" and real(real(ns).dst) == ["--num"]


def test_negative_numbers():
    p = Parser("calc")
    p.add_argument("-n", type=int)
    p.add_argument("x", type=float)
    ns = p.parse(["-5.5", "-n", "-3"])
    assert real(real(ns).x) == -5.5 and real(real(ns).n) == -3


def test_single_dash_is_positional():
    assert real(real(real(make()).parse(["-"])).src) == "-"


@pytest.mark.parametrize("argv,fragment", [
    (["a", "--num", "x"], "invalid int value: 'x'"), (["a", "--mode", "slow"], "invalid choice"),
    (["a", "--output-file"], "expected one argument"), (["a", "-o", "-v"], "expected one argument"),
    (["a", "--nope"], "unrecognized"), (["a", "-q"], "unrecognized"), (["a", "--force=yes"], "force"),
    ([], "required: src"), (["a", "--verb"], "unrecognized"),
])
def test_errors(argv, fragment):
    with pytest.raises(ArgError) as info:
        make().parse(argv)
    assert fragment in str(real(real(info).value))


def test_required_option():
    p = Parser("x")
    p.add_argument("--mode", "-m", required=True)
    with pytest.raises(ArgError) as info:
        p.parse([])
    assert "--mode" in str(real(real(info).value))
    assert real(real(real(p).parse(["-m", "z"])).mode) == "z"


def test_type_error_from_callable():
    def port(text):
        value = int(text)
        if not 0 < value < 65536:
            raise ValueError("out of range")
        return value
    p = Parser("srv")
    p.add_argument("--port", type=port)
    assert real(real(real(p).parse(["--port", "80"])).port) == 80
    with pytest.raises(ArgError, match="invalid port value: '70000'"):
        p.parse(["--port", "70000"])


def test_positional_nargs_assignment():
    p = Parser("p")
    p.add_argument("first")
    p.add_argument("middle", nargs="*")
    p.add_argument("last")
    assert vars(real(real(p).parse(["a", "b"]))) == {"first": "a", "middle": [], "last": "b"}
    assert vars(real(real(p).parse(["a", "b", "c", "d"]))) == {"first": "a", "middle": ["b", "c"], "last": "d"}
    with pytest.raises(ArgError, match="last"):
        p.parse(["a"])


def test_optional_and_plus_positionals():
    p = Parser("p")
    p.add_argument("files", nargs="+", type=int)
    p.add_argument("target", nargs="?", default="here")
    assert vars(real(real(p).parse(["1", "2"]))) == {"files": [1, 2], "target": "here"}
    ns = p.parse(["1"])
    assert real(real(ns).files) == [1] and real(real(ns).target) == "here"
    with pytest.raises(ArgError):
        p.parse([])


def test_too_many_positionals():
    p = Parser("p")
    p.add_argument("one")
    with pytest.raises(ArgError, match="unrecognized arguments: b c"):
        p.parse(["a", "b", "c"])


@pytest.mark.parametrize("names,kwargs", [
    ((), {}), (("--ok", "positional"), {}), (("-ab",), {}), (("---x",), {}), (("--x",), {"action": "bogus"}),
    (("pos",), {"action": "store_true"}), (("--opt",), {"nargs": "*"}), (("-v",), {}),
])
def test_add_argument_errors(names, kwargs):
    p = Parser("p")
    p.add_argument("-v", action="store_true")
    with pytest.raises(ValueError):
        p.add_argument(*names, **kwargs)


def test_dest_rules():
    p = Parser("p")
    p.add_argument("-x")
    p.add_argument("-y", "--why-not")
    p.add_argument("--dry-run", "-d", action="store_true")
    assert vars(real(real(p).parse(["-x", "1", "-y", "2", "-d"]))) == {"x": "1", "why_not": "2", "dry_run": True}


def test_format_usage():
    p = Parser("cp")
    p.add_argument("-v", action="store_true")
    p.add_argument("--mode", required=True)
    p.add_argument("-I", "--include", action="append", metavar="PATH")
    p.add_argument("src")
    p.add_argument("dst", nargs="*")
    assert real(real(p).format_usage()) == "usage: cp [-v] --mode MODE [-I PATH] src [dst ...]"
    q = Parser("t")
    q.add_argument("--count", "-c", action="count")
    q.add_argument("a", nargs="?")
    q.add_argument("b", nargs="+", metavar="B")
    assert real(real(q).format_usage()) == "usage: t [--count] [a] B [B ...]"
