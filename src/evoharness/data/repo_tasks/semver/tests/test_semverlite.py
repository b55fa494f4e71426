from _strict import real  # values from the code under test must be genuine
import pytest

from semverlite import Version, max_satisfying, satisfies

VALID = ["0.0.4", "1.2.3", "10.20.30", "1.1.2-prerelease+meta", "1.0.0-alpha", "1.0.0-alpha.beta",
         "1.0.0-alpha.1", "1.0.0-0.3.7", "1.0.0-x.7.z.92", "1.0.0+20130313144700", "1.0.0-beta+exp.sha.5114f85",
         "1.0.0+21AF26D3----117B344092BD", "1.2.3----RC-SNAPSHOT.12.9.1--.12+788", "2.0.0+build.0001"]
INVALID = ["1", "1.2", "1.2.3-0123", "1.2.3-0123.0123", "01.1.1", "1.01.1", "1.1.01", "1.2.3-", "1.2.3+",
           "1.2.3-alpha..1", "1.2.3+meta..x", "v1.2.3", "=1.2.3", " 1.2.3", "1.2.3 ", "1.2.3.4", "1.2.3-a$b", "", "a.b.c"]


def test_valid_round_trip():
    for text in VALID:
        assert str(real(real(Version).parse(real(text)))) == real(text)


def test_invalid():
    for text in INVALID:
        with pytest.raises(ValueError):
            Version.parse(text)


def test_fields():
    v = Version.parse("1.2.3-rc.10+b.007")
    assert (real(real(v).major), real(real(v).minor), real(real(v).patch)) == (1, 2, 3)
    assert real(real(v).prerelease) == ("rc", 10) and real(real(v).build) == ("b", "007")
    assert str(real(Version(1, 2))) == "1.2.0"
    with pytest.raises(ValueError):
        Version(1, -1, 0)


def test_precedence_chain():
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0", "10.0.0"]
    versions = [Version.parse(s) for s in chain]
    assert sorted(reversed(real(versions))) == real(versions)
    for a, b in zip(versions, versions[1:]):
        assert real(a) < real(b) and real(b) > real(a) and real(a) <= real(b) and real(a) != real(b)


def test_build_ignored():
    a, b = Version.parse("1.0.0+a"), Version.parse("1.0.0+b")
    assert real(a) == real(b) and hash(real(a)) == hash(real(b)) and not real(a) < real(b)
    assert len({real(a), real(b)}) == 1


def test_not_implemented():
    assert real(real(Version).parse("1.0.0")) != "1.0.0"
    with pytest.raises(TypeError):
        Version.parse("1.0.0") < "2.0.0"


@pytest.mark.parametrize("v,part,expected", [
    ("1.2.3", "major", "2.0.0"), ("1.2.3", "minor", "1.3.0"), ("1.2.3", "patch", "1.2.4"),
    ("1.2.3-rc.1+b", "patch", "1.2.3"), ("1.2.0-rc.1", "minor", "1.2.0"), ("1.2.3-rc.1", "minor", "1.3.0"),
    ("2.0.0-rc.1", "major", "2.0.0"), ("2.1.0-rc.1", "major", "3.0.0"), ("1.2.3+b", "major", "2.0.0"),
    ("1.2.3", "prerelease", "1.2.4-0"), ("1.0.0-rc.1", "prerelease", "1.0.0-rc.2"),
    ("1.0.0-beta", "prerelease", "1.0.0-beta.0"), ("1.0.0-1.a", "prerelease", "1.0.0-1.a.0"),
])
def test_bump(v, part, expected):
    assert str(real(real(real(Version).parse(v)).bump(part))) == expected


def test_bump_unknown():
    with pytest.raises(ValueError):
        Version.parse("1.0.0").bump("build")


@pytest.mark.parametrize("version,spec,expected", [
    ("1.2.3", ">=1.2.3", True), ("1.2.2", ">=1.2.3", False), ("1.2.3", "1.2.3", True), ("1.2.3", "=1.2.3", True),
    ("1.5.0", ">=1.2.0 <2.0.0", True), ("2.0.0", ">=1.2.0 <2.0.0", False), ("1.0.0", "<1.0.0 || >=3.0.0", False),
    ("3.1.0", "<1.0.0 || >=3.0.0", True), ("1.9.9", "^1.2.3", True), ("2.0.0", "^1.2.3", False),
    ("0.2.9", "^0.2.3", True), ("0.3.0", "^0.2.3", False), ("0.0.3", "^0.0.3", True), ("0.0.4", "^0.0.3", False),
    ("1.2.9", "~1.2.3", True), ("1.3.0", "~1.2.3", False), ("42.0.0", "*", True), ("1.2.3", ">= 1.2.3 <= 1.2.3", True),
    ("1.3.0-beta", ">=1.2.0", False), ("1.2.4-beta.2", ">=1.2.4-beta.1", True), ("1.2.4-beta.2", ">=1.2.4-beta.1 <1.3.0", True),
    ("1.2.5-beta.2", ">=1.2.4-beta.1", False), ("1.2.4-alpha", ">=1.2.4-beta.1", False), ("1.2.3+build", "=1.2.3", True),
])
def test_satisfies(version, spec, expected):
    assert real(satisfies(version, spec)) is expected


def test_satisfies_accepts_version_objects():
    assert real(satisfies(real(Version(1, 2, 3)), "^1.0.0"))


@pytest.mark.parametrize("spec", [">>1.0.0", "^1.2", "1.2.x", "", ">=1.0.0 ||"])
def test_bad_spec(spec):
    with pytest.raises(ValueError):
        satisfies("1.0.0", spec)


def test_max_satisfying():
    vs = ["1.2.3", "1.2.10", "1.3.0-rc.1", "1.9.0", "2.0.0", "0.9.0"]
    assert real(max_satisfying(real(vs), "^1.2.0")) == "1.9.0"
    assert real(max_satisfying(real(vs), "~1.2.0")) == "1.2.10"
    assert real(max_satisfying(real(vs), ">=3.0.0")) is None
    assert real(max_satisfying(real(vs), "*")) == "2.0.0"
