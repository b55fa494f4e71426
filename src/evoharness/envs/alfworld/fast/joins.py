"""Compile conjunctive conditions into fast Python enumerators.

A PDDL precondition disjunct (a list of literals over typed parameters) is
turned into the source of a nested-loop join over `FactStore` hash indexes and
compiled with ``exec``; compiled functions are cached by (condition, literal
order) and shared by every game and episode.

`plan_order` picks the literal order greedily: a literal whose arguments are
all bound first (a membership test), then literals sharing a bound variable
before unconnected ones (no cartesian products), and among those the one with
the smallest expected fan-out (estimated from a game's initial facts).
Negative literals and (in)equalities are tested as soon as their arguments are
bound, each variable is type-checked when bound (Fast Downward's type
predicates), and a parameter no literal binds is enumerated over its type.
The result lists every satisfying binding in parameter order (or the given
head atoms), with repeats where a binding is reached twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from evoharness.envs.alfworld.fast.pddl import Literal


@dataclass(frozen=True)
class JoinSpec:
    params: tuple[tuple[str, str], ...]  # (variable, type), output order
    literals: tuple[Literal, ...]
    bound: tuple[str, ...] = ()  # variables given as arguments
    relaxed: bool = False  # ignore negative literals (Fast Downward's relaxed exploration)
    seed: int | None = None  # index of the positive literal enumerated from the delta store
    heads: tuple[Literal, ...] = ()  # if given, emit these atoms instead of the bindings


def _is_var(a: str) -> bool:
    return a.startswith("?")


def _joinable(lit: Literal) -> bool:
    return not lit.negated and lit.pred != "=" and not lit.pred.startswith("type@")


def plan_order(spec: JoinSpec, estimate: Callable[[str, tuple[int, ...]], float]) -> tuple[int, ...]:
    """Order of the positive literals (indexes into ``spec.literals``)."""
    bound = set(spec.bound)
    remaining = [i for i, lit in enumerate(spec.literals) if _joinable(lit) and i != spec.seed]
    order: list[int] = []
    if spec.seed is not None:
        order.append(spec.seed)
        bound.update(a for a in spec.literals[spec.seed].args if _is_var(a))
    while remaining:

        def cost(i: int):
            lit = spec.literals[i]
            pos = tuple(k for k, a in enumerate(lit.args) if not _is_var(a) or a in bound)
            if len(pos) == len(lit.args):
                return (0, -1.0, i)
            # connected literals (sharing a bound variable) before cartesian products
            # (estimates in powers of two, so games of similar size share a plan)
            return (1 if pos else 2, round(math.log2(1.0 + estimate(lit.pred, pos))), i)

        i = min(remaining, key=cost)
        remaining.remove(i)
        order.append(i)
        bound.update(a for a in spec.literals[i].args if _is_var(a))
    return tuple(order)


@cache
def compile_join(
    spec: JoinSpec, order: tuple[int, ...], fluent: frozenset, universal_types: frozenset = frozenset({"object"})
) -> Callable:
    """Return ``f(F, S, D, T, *bound_values) -> list[tuple]``.

    F: fluent store, S: static store, D: delta store (for `spec.seed`), T: type
    name -> set of objects. `universal_types` are types every object has (no check).
    """
    ptype = dict(spec.params)
    lits = spec.literals
    bound = set(spec.bound)
    lines: list[str] = []
    pre: list[str] = []
    consts: dict[str, str] = {}
    names: dict[str, str] = {}
    psets: dict[tuple, str] = {}
    checked: set[str] = set()
    state = {"depth": 1, "loop": False, "n": 0}

    def c(val: str) -> str:
        if val not in consts:
            consts[val] = f"K{len(consts)}"
        return consts[val]

    def ref(a: str) -> str:
        if not _is_var(a):
            return c(a)
        if a not in names:
            names[a] = f"v{len(names)}"
        return names[a]

    def emit(line: str) -> None:
        lines.append("    " * state["depth"] + line)

    def fail() -> str:
        return "continue" if state["loop"] else "return out"

    def pset(store: str, pred: str) -> str:
        k = (store, pred)
        if k not in psets:
            psets[k] = f"P{len(psets)}"
            pre.append(f"    {psets[k]} = {store}.pred({c(pred)})")
        return psets[k]

    def type_check(var: str) -> None:
        t = ptype.get(var)
        if t is not None and t not in universal_types and var not in checked:
            emit(f"if {ref(var)} not in T[{c(t)}]: {fail()}")
        checked.add(var)

    tests = [i for i, lit in enumerate(lits) if not _joinable(lit) and not (spec.relaxed and lit.negated)]
    tested: set[int] = set()

    def flush_tests() -> None:
        for i in tests:
            if i in tested:
                continue
            lit = lits[i]
            free = [a for a in lit.args if _is_var(a) and a not in bound]
            if lit.pred == "=":
                a, b = lit.args
                if not lit.negated and len(free) == 1 and not (a == b):
                    other = b if free[0] == a else a
                    emit(f"{ref(free[0])} = {ref(other)}")
                    bound.add(free[0])
                    type_check(free[0])
                    tested.add(i)
                    continue
                if not free:
                    emit(f"if {ref(a)} {'==' if lit.negated else '!='} {ref(b)}: {fail()}")
                    tested.add(i)
                continue
            if free:
                continue
            if lit.pred.startswith("type@"):
                cond = f"{ref(lit.args[0])} {'in' if lit.negated else 'not in'} T[{c(lit.pred[5:])}]"
            else:
                store = "F" if lit.pred in fluent else "S"
                atom = "(" + ", ".join([c(lit.pred)] + [ref(a) for a in lit.args]) + ",)"
                cond = f"{atom} {'in' if lit.negated else 'not in'} {pset(store, lit.pred)}"
            emit(f"if {cond}: {fail()}")
            tested.add(i)

    for t in sorted({t for _, t in spec.params} - set(universal_types)):
        pre.append(f"    if not T[{c(t)}]: return out")  # a type without objects: nothing to find
    for v in spec.bound:
        type_check(v)
    flush_tests()
    for i in order:
        lit = lits[i]
        store = "D" if i == spec.seed else ("F" if lit.pred in fluent else "S")
        pos = tuple(k for k, a in enumerate(lit.args) if not _is_var(a) or a in bound)
        if len(pos) == len(lit.args) and i != spec.seed:
            atom = "(" + ", ".join([c(lit.pred)] + [ref(a) for a in lit.args]) + ",)"
            emit(f"if {atom} not in {pset(store, lit.pred)}: {fail()}")
            continue
        var = f"a{state['n']}"
        if pos:
            idx = f"I{state['n']}"
            pre.append(f"    {idx} = {store}.index({c(lit.pred)}, {pos!r})")
            key = ref(lit.args[pos[0]]) if len(pos) == 1 else "(" + ", ".join(ref(lit.args[k]) for k in pos) + ",)"
            emit(f"for {var} in {idx}.get({key}, ()):")
        else:
            emit(f"for {var} in {pset(store, lit.pred)}:")
        state["n"] += 1
        state["depth"] += 1
        state["loop"] = True
        newly: list[str] = []
        for k, a in enumerate(lit.args):
            if k in pos:
                continue
            if a in bound or a in newly:
                emit(f"if {var}[{k + 1}] != {ref(a)}: continue")
            else:
                emit(f"{ref(a)} = {var}[{k + 1}]")
                newly.append(a)
        for a in newly:
            bound.add(a)
            type_check(a)
        flush_tests()
    for v, t in spec.params:  # parameters no literal binds: enumerate their type
        if v not in bound:
            emit(f"for {ref(v)} in T[{c(t)}]:")
            state["depth"] += 1
            state["loop"] = True
            bound.add(v)
            checked.add(v)
            flush_tests()
    if spec.heads:
        for h in spec.heads:
            emit("out.append((" + ", ".join([c(h.pred)] + [ref(a) for a in h.args]) + ",))")
    else:
        emit("out.append((" + ", ".join(ref(v) for v, _ in spec.params) + ",))")
    args = "".join(", " + ref(v) for v in spec.bound)
    code = "\n".join([f"def join(F, S, D, T{args}):", "    out = []"] + pre + lines + ["    return out"])
    ns = {name: val for val, name in consts.items()}
    exec(compile(code, "<join>", "exec"), ns)
    fn = ns["join"]
    fn.source = code
    return fn
