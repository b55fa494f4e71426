"""Expressions: tokenizer, recursive-descent parser to closures, lookups and filters."""

import re
from collections.abc import Mapping

from .errors import TemplateSyntaxError


class Undefined:
    """The value of a failed lookup."""

    def __init__(self, name):
        self.name = name

    def __bool__(self):
        return False


class Markup(str):
    """A string that must not be HTML-escaped again."""


def html_escape(value):
    if isinstance(value, Markup):
        return value
    s = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return Markup(s.replace('"', "&quot;").replace("'", "&#39;"))


def _text(v):
    return "" if isinstance(v, Undefined) or v is None else str(v)

FILTERS = {
    "upper": lambda v: _text(v).upper(),
    "lower": lambda v: _text(v).lower(),
    "title": lambda v: _text(v).title(),
    "trim": lambda v: _text(v).strip(),
    "length": lambda v: 0 if isinstance(v, Undefined) else len(v),
    "first": lambda v: v[0],
    "last": lambda v: v[-1],
    "reverse": lambda v: v[::-1] if isinstance(v, str) else list(reversed(list(v))),
    "sort": lambda v: sorted(v),
    "join": lambda v, sep="": str(sep).join(str(x) for x in v),
    "default": lambda v, d="": d if isinstance(v, Undefined) or v is None else v,
    "items": lambda v: list(v.items()),
    "escape": html_escape,
    "safe": lambda v: Markup(_text(v)),
}

_TOKEN = re.compile(r"""\s*(?:
    (?P<STRING>"[^"]*"|'[^']*')
  | (?P<INT>\d+)
  | (?P<NAME>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<OP>==|!=|<=|>=|[<>|.(),=])
)""", re.VERBOSE)
_COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


def tokenize(text, lineno):
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise TemplateSyntaxError(f"bad character in expression: {text[pos:].strip()[:10]!r}", lineno)
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    tokens.append(("EOF", ""))
    return tokens


def lookup(value, key):
    if isinstance(value, Undefined):
        return Undefined(f"{value.name}.{key}")
    if isinstance(value, Mapping) and key in value:
        return value[key]
    if key.isdigit() and isinstance(value, (list, tuple, str)) and int(key) < len(value):
        return value[int(key)]
    if not key.startswith("_") and hasattr(value, key):
        return getattr(value, key)
    return Undefined(key)


def resolve(scope, name):
    for frame in reversed(scope):
        if name in frame:
            return frame[name]
    return Undefined(name)


class Parser:
    """Parse one expression into a closure ``f(scope) -> value`` (scope: list of dicts)."""

    def __init__(self, text, lineno):
        self.tokens, self.i, self.lineno = tokenize(text, lineno), 0, lineno

    def peek(self, kind=None, value=None):
        k, v = self.tokens[self.i]
        return (kind is None or k == kind) and (value is None or v == value)

    def take(self):
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, msg):
        raise TemplateSyntaxError(msg, self.lineno)

    def expect(self, kind, value=None):
        if not self.peek(kind, value):
            self.fail(f"expected {value or kind}, found {self.tokens[self.i][1] or 'end'!r}")
        return self.take()[1]

    def parse_all(self):
        f = self.expr()
        if not self.peek("EOF"):
            self.fail(f"unexpected {self.tokens[self.i][1]!r}")
        return f

    def expr(self):
        return self.or_expr()

    def or_expr(self):
        return self._chain("or", self.and_expr, any)

    def and_expr(self):
        return self._chain("and", self.not_expr, all)

    def _chain(self, word, sub, combine):
        parts = [sub()]
        while self.peek("NAME", word):
            self.take()
            parts.append(sub())
        if len(parts) == 1:
            return parts[0]
        return lambda s: combine(bool(p(s)) for p in parts)

    def not_expr(self):
        if self.peek("NAME", "not"):
            self.take()
            inner = self.not_expr()
            return lambda s: not inner(s)
        return self.comparison()

    def comparison(self):
        left = self.filtered()
        op = None
        if self.peek("OP") and self.tokens[self.i][1] in _COMPARE:
            op = self.take()[1]
        elif self.peek("NAME", "in"):
            op = self.take()[1]
        elif self.peek("NAME", "not") and self.tokens[self.i + 1] == ("NAME", "in"):
            self.i += 2
            op = "not in"
        if op is None:
            return left
        right, fn = self.filtered(), _COMPARE[op]
        return lambda s: fn(left(s), right(s))

    def filtered(self):
        f = self.primary()
        while self.peek("OP", "|"):
            self.take()
            name = self.expect("NAME")
            if name not in FILTERS:
                self.fail(f"unknown filter {name!r}")
            args = []
            if self.peek("OP", "("):
                self.take()
                if not self.peek("OP", ")"):
                    args.append(self.expr())
                    while self.peek("OP", ","):
                        self.take()
                        args.append(self.expr())
                self.expect("OP", ")")
            f = self._apply(f, FILTERS[name], args)
        return f

    @staticmethod
    def _apply(f, flt, args):
        return lambda s: flt(f(s), *(a(s) for a in args))

    def primary(self):
        kind, value = self.take()
        if kind == "STRING":
            return lambda s: value[1:-1]
        if kind == "INT":
            return lambda s: int(value)
        if kind == "NAME" and value in ("true", "false", "none"):
            const = {"true": True, "false": False, "none": None}[value]
            return lambda s: const
        if kind == "NAME" and value not in ("and", "or", "not", "in"):
            keys = []
            while self.peek("OP", "."):
                self.take()
                k, v = self.take()
                if k not in ("NAME", "INT"):
                    self.fail("expected a name or an index after '.'")
                keys.append(v)
            return self._path(value, keys)
        if (kind, value) == ("OP", "("):
            f = self.expr()
            self.expect("OP", ")")
            return f
        self.fail(f"unexpected {value or 'end of expression'!r}")

    @staticmethod
    def _path(name, keys):
        def get(s):
            v = resolve(s, name)
            for k in keys:
                v = lookup(v, k)
            return v
        return get


def compile_expr(text, lineno):
    if not text.strip():
        raise TemplateSyntaxError("empty expression", lineno)
    return Parser(text, lineno).parse_all()
