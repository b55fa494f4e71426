"""The game's TWL2 grammar: command templates, feedback rules, text derivation.

Reproduces ``textworld.envs.pddl.logic`` (the TWL2 document) and
``textworld.envs.pddl.textgen`` (the context-sensitive grammar) as the stock
engine runs them, without TatSu:

- The document holds top-level ``grammar :: \"\"\"{json}\"\"\";`` blocks and
  ``action Name { template :: "..."; feedback :: "#rule#"; grammar :: ...; }``
  blocks; the JSON rule tables are merged in document order (a later table
  replaces a rule of the same name), and in an action's table lines starting
  with ``#`` are dropped first. ``#`` outside strings starts a comment.
- A rule right-hand side is a sequence of terminals, ``#nonterminal#``,
  ``{python expression | query}`` and ``[{... | query}]`` (a list: "a, b, and
  c", with the ``list_separator``/``list_last_separator``/``list_empty`` rules).
  TatSu quirks matched: leading whitespace of a right-hand side is dropped,
  tabs before a token are dropped, a double-quoted terminal loses its quotes,
  and parsing silently stops at a character it cannot read (``;``, a stray
  ``}``...), dropping the rest.
- Of a rule's alternatives the **first** whose condition holds is used (the
  stock engine never draws at random: the text is deterministic).
- Conditions and list queries are conjunctive queries ``p(x:type) & q(...)``
  matched against the engine's *textual* fact set (see ``engine.py``: it also
  holds ``not_p`` facts), with textworld's semantics: a placeholder binds a
  (name, type) variable, two placeholders never bind the same variable, the
  variables already bound by the action count as used, facts are visited per
  type signature (textworld's subtype order) and in sorted order — which is
  why "mug 2, mug 1" come in that order.
- ``{expr}`` is evaluated as Python with the bound placeholders as entity
  records (``.name``, ``.id``, ``.indefinite``...), like the stock ``eval``.
"""

from __future__ import annotations

import builtins
import json
import re
import textwrap
from collections import deque
from dataclasses import dataclass
from functools import cache, lru_cache

# ---------------------------------------------------------------- entities


class Entity:
    """Mirror of ``textworld.generator.game.EntityInfo`` for one PDDL object."""

    __slots__ = ("id", "type", "name", "noun", "adj", "desc", "room_type", "definite", "indefinite", "synonyms")

    def __init__(self, id: str, type: str, name: str) -> None:
        self.id = id
        self.type = type
        self.name = name
        self.noun = self.adj = self.desc = self.room_type = self.synonyms = None
        self.definite = "the"
        self.indefinite = "a"

    def __str__(self) -> str:
        return str(self.name)

    def __repr__(self) -> str:
        return f"Entity({self.id!r}, {self.name!r})"


# ---------------------------------------------------------------- TWL2 document


@dataclass(frozen=True)
class ActionText:
    template: str
    feedback: str


_DOC_TOKEN = re.compile(
    r'\s+|#[^\n]*|"""(?:.|\n)*?"""|"[^"]*"|::|[{};]|[\w/-]+',
)


def parse_document(text: str) -> tuple[dict[str, ActionText], dict[str, list[dict]]]:
    """The TWL2 text -> (actions by lower-case name, merged JSON rule table)."""
    raw = _DOC_TOKEN.findall(text)
    if sum(map(len, raw)) != len(text):
        raise ValueError("cannot read the TWL2 grammar (unexpected characters)")
    toks = [t for t in raw if not t[0].isspace() and t[0] != "#"]
    actions: dict[str, ActionText] = {}
    table: dict[str, list[dict]] = {}
    i = 0

    def block(tok: str) -> str:
        return textwrap.dedent(tok[3:-3])

    def loads(data: str) -> dict:
        return _json_block(data)

    while i < len(toks):
        tok = toks[i]
        if tok == "grammar":
            code = toks[i + 2]
            table.update(loads(block(code)))
            i += 4
        elif tok == "action":
            name = toks[i + 1]
            i += 3  # action, name, {
            template = feedback = ""
            while toks[i] != "}":
                key, val = toks[i], toks[i + 2]
                if key == "template":
                    template = val[1:-1]
                elif key == "feedback":
                    feedback = val[1:-1]
                elif key == "grammar":
                    data = "\n".join(line for line in block(val).split("\n") if not line.lstrip().startswith("#"))
                    table.update(loads(data))
                i += 4
            actions[name.lower()] = ActionText(template, feedback)
            i += 1
        else:
            raise ValueError(f"unexpected token in TWL2 grammar: {tok!r}")
    return actions, table


@lru_cache(maxsize=64)
def _json_block(data: str) -> dict:
    return json.loads(data)


# ---------------------------------------------------------------- right-hand sides

# Symbols: ("t", text) | ("nt", name) | ("eval", code, source) | ("cond", expr, given) | ("list", cond)

_TAG = re.compile(r"[\w()/!<>\-\s,.]+")
_STATEMENT = re.compile(r"[^|\[\]{}\n<>]+")
_GIVEN_SEP = re.compile(r"\s*\|\s*")
_GIVEN = re.compile(r"[^;|{}\n\[\]#]+")
_LITERAL = re.compile(r'[^;|"<>\[\]#{}]*')


def _skip_tabs(s: str, i: int) -> int:
    while i < len(s) and s[i] == "\t":
        i += 1
    return i


@cache
def parse_rhs(s: str) -> tuple:
    """Parse a right-hand side (or a template / start string) into symbols."""
    i = 0
    if s.startswith("//"):
        j = s.find("\n")
        i = len(s) if j < 0 else j + 1
    else:
        while i < len(s) and s[i].isspace():
            i += 1
    out: list[tuple] = []
    while True:
        j = _skip_tabs(s, i)
        sym, k = _parse_symbol(s, j)
        if sym is None or (k == j and out):
            break
        out.append(sym)
        i = k
        if k == j:  # empty terminal: only once
            break
    return tuple(out)


def _parse_nonterminal(s: str, i: int):
    if i < len(s) and s[i] == "#":
        m = _TAG.match(s, _skip_tabs(s, i + 1))
        if m:
            j = _skip_tabs(s, m.end())
            if j < len(s) and s[j] == "#":
                return ("nt", m.group(0)), j + 1
    return None, i


def _parse_conditional(s: str, i: int):
    if i >= len(s) or s[i] != "{":
        return None, i
    j = _skip_tabs(s, i + 1)
    expr, k = _parse_nonterminal(s, j)
    if expr is None:
        m = _STATEMENT.match(s, j)
        if not m:
            return None, i
        src = m.group(0)
        expr, k = ("eval", compile(src.strip(" \t"), "<twl2>", "eval"), src), m.end()
    given = None
    k2 = _skip_tabs(s, k)
    m = _GIVEN_SEP.match(s, k2)
    if m:
        g = _GIVEN.match(s, _skip_tabs(s, m.end()))
        if g:
            given = g.group(0)
            k = g.end()
    k = _skip_tabs(s, k)
    if k < len(s) and s[k] == "}":
        return ("cond", expr, given), k + 1
    return None, i


def _parse_symbol(s: str, i: int):
    if i < len(s) and s[i] == "[":
        cond, k = _parse_conditional(s, _skip_tabs(s, i + 1))
        if cond is not None:
            k = _skip_tabs(s, k)
            if k < len(s) and s[k] == "]":
                return ("list", cond), k + 1
    sym, k = _parse_conditional(s, i)
    if sym is not None:
        return sym, k
    sym, k = _parse_nonterminal(s, i)
    if sym is not None:
        return sym, k
    if i < len(s) and s[i] == '"':
        m = _LITERAL.match(s, i + 1)
        j = _skip_tabs(s, m.end())
        if j < len(s) and s[j] == '"':
            return ("t", m.group(0)), j + 1
        return ("t", ""), i  # TatSu falls back to an empty terminal: parsing stops here
    m = _LITERAL.match(s, i)
    return ("t", m.group(0)), m.end()


# ---------------------------------------------------------------- queries

_PRED = re.compile(r"\s*(\$?)\s*(!?[\w/]+)\s*\(([^)]*)\)\s*")


@cache
def parse_query(expr: str) -> tuple:
    """``p(a:t, b:u) & q(...)`` -> ((pred, ((name, type), ...)), ...)."""
    out = []
    for part in expr.split("&"):
        m = _PRED.fullmatch(part)
        if not m:
            raise ValueError(f"cannot parse query literal {part!r}")
        name = m.group(2)
        if name.startswith("!"):
            name = "not_" + name[1:]
        phs = []
        for arg in m.group(3).split(","):
            arg = arg.strip()
            if not arg:
                continue
            if ":" in arg:
                n, t = (x.strip() for x in arg.split(":", 1))
            else:
                n, t = arg, arg.rstrip("'")
            phs.append((n, t))
        out.append((name, tuple(phs)))
    return tuple(out)


class TypeTree:
    """textworld's ``TypeHierarchy`` as the stock engine builds it from FD's types."""

    def __init__(self, types: list[tuple[str, list[str]]]) -> None:
        self.children: dict[str, list[str]] = {}
        known: set[str] = set()
        for name, parents in types:
            if name in known:
                continue  # duplicate type: textworld raises and the engine skips it
            known.add(name)
            for p in parents:
                self.children.setdefault(p, []).append(name)
                self.children[p].sort()
        self._cache: dict[tuple, list[tuple]] = {}

    def multi_subtypes(self, types: tuple[str, ...]) -> list[tuple[str, ...]]:
        got = self._cache.get(types)
        if got is None:
            got = [types] + list(self._bfs(types))
            self._cache[types] = got
        return got

    def _expand(self, types: tuple[str, ...]):
        for i in range(len(types)):
            exp = list(types)
            for child in self.children.get(types[i], ()):
                exp[i] = child
                yield tuple(exp)

    def _bfs(self, start):
        seen = set()
        queue = deque(self._expand(start))
        while queue:
            item = queue.popleft()
            yield item
            for e in self._expand(item):
                if e not in seen:
                    seen.add(e)
                    queue.append(e)


# ---------------------------------------------------------------- derivation

_EVAL_GLOBALS = {"__builtins__": builtins}


class Grammar:
    """A game's rule table plus the machinery to derive text in a fact context.

    ``facts`` passed to `derive` must offer ``sorted_matching(pred, types,
    bound)`` (see ``engine.TextFacts``).
    """

    def __init__(
        self, table: dict[str, list[dict]], types: TypeTree, entities: dict[str, Entity], obj_type: dict[str, str]
    ) -> None:
        self.rules: dict[str, list[tuple[tuple, tuple | None]]] = {}
        for name, alts in table.items():
            self.rules[name] = [
                (parse_rhs(a["rhs"]), parse_query(a["condition"]) if a.get("condition") else None) for a in alts
            ]
        self.types = types
        self.entities = entities
        self.obj_type = obj_type

    # -- queries
    def assignments(self, query: tuple, mapping: dict, facts) -> list[dict]:
        """All mappings extending `mapping` ((name, type) -> (obj, type)) that satisfy `query`."""
        used = set(mapping.values())
        out: list[dict] = []
        self._match(query, 0, dict(mapping), used, facts, out, None)
        return out

    def satisfiable(self, query: tuple, mapping: dict, facts) -> bool:
        out: list[dict] = []
        self._match(query, 0, dict(mapping), set(mapping.values()), facts, out, 1)
        return bool(out)

    def _match(self, query, depth, mapping, used, facts, out, limit) -> None:
        if depth == len(query):
            out.append(dict(mapping))
            return
        pred, phs = query[depth]
        ph_types = tuple(t for _, t in phs)
        obj_type = self.obj_type
        for combo in self.types.multi_subtypes(ph_types):
            bound = []
            for pos, ph in enumerate(phs):
                var = mapping.get(ph)
                if var is not None:
                    if var[1] != combo[pos]:
                        bound = None
                        break
                    bound.append((pos, var[0]))
            if bound is None:
                continue
            for args in facts.sorted_matching(pred, combo, tuple(bound)):
                new = []
                ok = True
                for ph, name in zip(phs, args):
                    var = (name, obj_type.get(name))
                    existing = mapping.get(ph)
                    if existing is None:
                        if var in used:
                            ok = False
                            break
                        mapping[ph] = var
                        used.add(var)
                        new.append(ph)
                    elif existing != var:
                        ok = False
                        break
                if ok:
                    self._match(query, depth + 1, mapping, used, facts, out, limit)
                for ph in new:
                    used.discard(mapping.pop(ph))
                if limit is not None and len(out) >= limit:
                    return

    # -- text
    def derive(self, start: str, mapping: dict, facts) -> str:
        parts: list[str] = []
        self._symbols(parse_rhs(start), mapping, facts, parts)
        return "".join(parts)

    def _nonterminal(self, name: str, mapping: dict, facts, parts: list[str]) -> None:
        alts = self.rules.get(name)
        if not alts:
            raise KeyError(f"Can't find symbol '#{name}#' in the set of production rules.")
        for rhs, cond in alts:
            if cond is None or self.satisfiable(cond, mapping, facts):
                self._symbols(rhs, mapping, facts, parts)
                return
        raise IndexError(f"no applicable alternative for #{name}#")

    def _expand_cond(self, sym: tuple, mapping: dict, facts) -> list[str]:
        _, expr, given = sym
        contexts = self.assignments(parse_query(given), mapping, facts) if given else [mapping]
        out = []
        for ctx in contexts:
            parts: list[str] = []
            if expr[0] == "nt":
                self._nonterminal(expr[1], ctx, facts, parts)
            else:
                env = {ph[0]: self.entities[var[0]] for ph, var in ctx.items()}
                parts.append(str(eval(expr[1], _EVAL_GLOBALS, env)))
            out.append("".join(parts))
        return out

    def _symbols(self, symbols: tuple, mapping: dict, facts, parts: list[str]) -> None:
        for sym in symbols:
            kind = sym[0]
            if kind == "t":
                parts.append(sym[1])
            elif kind == "nt":
                self._nonterminal(sym[1], mapping, facts, parts)
            elif kind == "cond":
                parts.extend(self._expand_cond(sym, mapping, facts))
            else:  # list
                items = self._expand_cond(sym[1], mapping, facts)
                if not items:
                    self._nonterminal("list_empty", mapping, facts, parts)
                elif len(items) == 1:
                    parts.append(items[0])
                else:
                    sep: list[str] = []
                    self._nonterminal("list_separator", mapping, facts, sep)
                    last: list[str] = []
                    self._nonterminal("list_last_separator", mapping, facts, last)
                    parts.append("".join(sep).join(items[:-1]))
                    parts.append("".join(last))
                    parts.append(items[-1])

    def dependencies(self, text: str) -> tuple[set[str], set[str], set[tuple]]:
        """What any derivation of `text` may read: (queried predicates, names used
        in Python expressions, query placeholders). Used to cache derived commands."""
        preds: set[str] = set()
        names: set[str] = set()
        phs: set[tuple] = set()
        seen: set[str] = set()

        def query(q):
            for p, args in q:
                preds.add(p)
                phs.update(args)

        def walk(symbols):
            for sym in symbols:
                if sym[0] == "nt":
                    rule(sym[1])
                elif sym[0] in ("cond", "list"):
                    c = sym if sym[0] == "cond" else sym[1]
                    if c[2]:
                        query(parse_query(c[2]))
                    if c[1][0] == "nt":
                        rule(c[1][1])
                    else:
                        names.update(c[1][1].co_names)
                    if sym[0] == "list":
                        for n in ("list_empty", "list_separator", "list_last_separator"):
                            rule(n)

        def rule(name):
            if name in seen:
                return
            seen.add(name)
            for rhs, cond in self.rules.get(name, ()):
                if cond:
                    query(cond)
                walk(rhs)

        walk(parse_rhs(text))
        return preds, names, phs
