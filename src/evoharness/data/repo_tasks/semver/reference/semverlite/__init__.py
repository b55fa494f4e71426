"""Semantic Versioning 2.0.0: parsing, precedence, bumping and node-style ranges."""

import functools
import re

__all__ = ["Version", "satisfies", "max_satisfying"]

_NUM = r"0|[1-9]\d*"
_IDENT = r"[0-9A-Za-z-]+"
_VERSION = re.compile(
    rf"({_NUM})\.({_NUM})\.({_NUM})"
    rf"(?:-((?:{_NUM}|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:{_NUM}|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    rf"(?:\+({_IDENT}(?:\.{_IDENT})*))?")


def _pre_key(pre):
    # numeric identifiers sort before alphanumeric ones; release (no pre) sorts last
    return (1,) if not pre else (0, tuple((0, x, "") if isinstance(x, int) else (1, 0, x) for x in pre))


@functools.total_ordering
class Version:
    __slots__ = ("major", "minor", "patch", "prerelease", "build")

    def __init__(self, major, minor=0, patch=0, prerelease=(), build=()):
        if min(major, minor, patch) < 0:
            raise ValueError("version numbers must be non-negative")
        self.major, self.minor, self.patch = major, minor, patch
        self.prerelease, self.build = tuple(prerelease), tuple(build)

    @classmethod
    def parse(cls, text):
        m = _VERSION.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ValueError(f"not a semantic version: {text!r}")
        pre = tuple(int(x) if x.isdigit() else x for x in m.group(4).split(".")) if m.group(4) else ()
        build = tuple(m.group(5).split(".")) if m.group(5) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, build)

    def __str__(self):
        s = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            s += "-" + ".".join(map(str, self.prerelease))
        if self.build:
            s += "+" + ".".join(self.build)
        return s

    def __repr__(self):
        return f"Version({str(self)!r})"

    def _key(self):
        return (self.major, self.minor, self.patch, _pre_key(self.prerelease))

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def bump(self, part):
        M, m, p, pre = self.major, self.minor, self.patch, self.prerelease
        if part == "major":
            return Version(M if pre and m == 0 and p == 0 else M + 1)
        if part == "minor":
            return Version(M, m if pre and p == 0 else m + 1)
        if part == "patch":
            return Version(M, m, p if pre else p + 1)
        if part == "prerelease":
            if not pre:
                return Version(M, m, p + 1, (0,))
            if isinstance(pre[-1], int):
                return Version(M, m, p, pre[:-1] + (pre[-1] + 1,))
            return Version(M, m, p, pre + (0,))
        raise ValueError(f"unknown part {part!r}")


_COMPARATOR = re.compile(r"(\^|~|>=|<=|>|<|=)?\s*(\S+)")
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b, "=": lambda a, b: a == b}


def _comparators(alternative):
    """Expand one AND-group into a list of (op, Version)."""
    out = []
    tokens = re.findall(r"(?:\^|~|>=|<=|>|<|=)?\s*[^\s<>=^~]+|\S+", alternative.strip())
    if not tokens:
        raise ValueError("empty comparator set")
    for token in tokens:
        m = _COMPARATOR.fullmatch(token)
        if m is None:
            raise ValueError(f"bad comparator {token!r}")
        op, text = m.group(1) or "=", m.group(2)
        if text == "*" and m.group(1) is None:
            continue
        v = Version.parse(text)
        if op == "^":
            if v.major:
                upper = Version(v.major + 1)
            elif v.minor:
                upper = Version(0, v.minor + 1)
            else:
                upper = Version(0, 0, v.patch + 1)
            out += [(">=", v), ("<", upper)]
        elif op == "~":
            out += [(">=", v), ("<", Version(v.major, v.minor + 1))]
        else:
            out.append((op, v))
    return out


def satisfies(version, spec):
    v = version if isinstance(version, Version) else Version.parse(version)
    alternatives = [_comparators(alt) for alt in spec.split("||")]
    for comps in alternatives:
        if not all(_OPS[op](v, bound) for op, bound in comps):
            continue
        if v.prerelease and not any(b.prerelease and (b.major, b.minor, b.patch) == (v.major, v.minor, v.patch)
                                    for _, b in comps):
            continue
        return True
    return False


def max_satisfying(versions, spec):
    best = None
    for text in versions:
        if satisfies(text, spec) and (best is None or Version.parse(text) > Version.parse(best)):
            best = text
    return best
