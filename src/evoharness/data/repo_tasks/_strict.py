"""Helper of the pack's hidden suites: `real(x)` is `x`, or fails the test when `x` is not a genuine value.

Every value an assert takes from the code under test goes through `real` (the
suites were rewritten so: ``assert real(to_roman(4)) == "IV"``). A task-agnostic
"magic" module answers every name with an object that equals everything, is
callable, iterable and empty, and with exception classes that catch everything;
plain asserts then pass without any of the task's code (issue 49: 0.45 of the
pack). `real` rejects such objects on evidence: a genuine value does not equal
fresh probes it has never seen (a private object, a random string, number,
tuple, list, dict), and a genuine class does not claim instances of an
unrelated private class nor come from a metaclass that overrides
``__instancecheck__``/``__subclasscheck__``. The scorer mounts this file beside
each pack suite (``/score/tests/_strict.py``), imported before the code under
test.
"""

import secrets

_STD_META_CHECKS = {type.__instancecheck__, type.__subclasscheck__}
try:
    import abc as _abc

    _STD_META_CHECKS |= {_abc.ABCMeta.__instancecheck__, _abc.ABCMeta.__subclasscheck__}
except Exception:  # pragma: no cover
    pass


class _Unrelated:
    """A class no code under test has ever seen."""


def _probes():
    word = "evo-probe-" + secrets.token_hex(8)
    number = secrets.randbits(61) + 7
    return (_Unrelated(), object(), word, number, number + 0.5, (word,), [word], {word: number}, frozenset((word,)))


def _truthy(v):
    try:
        return bool(v)
    except Exception:
        return False


def real(x):
    """`x` itself when it is a genuine value; raises AssertionError (the test fails) when it
    equals values it cannot know, or is a class that accepts anything."""
    for probe in _probes():
        try:
            same = x == probe
        except Exception:
            continue
        if _truthy(same):
            raise AssertionError(f"{type(x).__name__} object equals an unrelated {type(probe).__name__}: "
                                 "not a genuine value")
    if isinstance(x, type):
        meta = type(x)
        if (getattr(meta, "__instancecheck__", None) not in _STD_META_CHECKS
                or getattr(meta, "__subclasscheck__", None) not in _STD_META_CHECKS):
            raise AssertionError(f"class {x.__name__} has a metaclass that overrides isinstance/issubclass")
        try:
            claims = isinstance(_Unrelated(), x) or (x is not object and issubclass(_Unrelated, x))
        except Exception:
            claims = False
        if claims and x is not object:
            raise AssertionError(f"class {x.__name__} claims instances of an unrelated class")
    return x
