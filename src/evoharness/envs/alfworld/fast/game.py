"""Everything static about one game file, computed once and cached by content hash.

A ``game.tw-pddl`` file holds the PDDL domain, the TWL2 grammar and the PDDL
problem. The stock engine re-translates the PDDL (twice) on every reset and
re-parses parts of the grammar on every step; here the domain (shared by all
ALFWorld games) is parsed and its joins compiled once per process, and each
game's problem, relaxed reachability, names, intro text and first admissible
commands once per game (an LRU keeps the most recent games).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

from evoharness.envs.alfworld.fast.facts import FactStore, TextFacts
from evoharness.envs.alfworld.fast.grammar import ActionText, Entity, Grammar, TypeTree, parse_document
from evoharness.envs.alfworld.fast.joins import JoinSpec, compile_join, plan_order
from evoharness.envs.alfworld.fast.names import demangle
from evoharness.envs.alfworld.fast.pddl import Domain, Literal, Problem, parse_domain, parse_problem
from evoharness.envs.alfworld.fast.reach import (
    Op,
    RelaxedRule,
    build_relaxed_rules,
    make_op,
    relaxed_model,
    surely_kept,
    translate_op,
)

GAME_CACHE_SIZE = 64


class TypeSets(dict):
    """type name -> objects of that type or a subtype (an unknown type has none)."""

    def __missing__(self, key):
        return frozenset()


@dataclass
class CompiledDomain:
    domain: Domain
    fluent: frozenset
    relaxed_rules: list[RelaxedRule]
    copy_specs: list[JoinSpec]  # per action copy: all bindings satisfying its precondition
    tree: TypeTree
    joins: dict = field(default_factory=dict)  # spec -> compiled join (literal order fixed by the first game)

    def join(self, spec: JoinSpec, estimate):
        fn = self.joins.get(spec)
        if fn is None:
            fn = self.joins[spec] = compile_join(spec, plan_order(spec, estimate), self.fluent)
        return fn


@lru_cache(maxsize=8)
def compile_domain(text: str) -> CompiledDomain:
    domain = parse_domain(text)
    specs = [JoinSpec(tuple(c.params), tuple(c.precondition)) for c in domain.copies]
    # textworld's type tree: FD's types in order, the first declaration of a name wins
    types = [("object", [])] + [(n, domain.supertypes.get(n, [])) for n in domain.types if n != "object"]
    return CompiledDomain(
        domain, frozenset(domain.fluent_predicates), build_relaxed_rules(domain), specs, TypeTree(types)
    )


def _estimator(static: FactStore, init_fluent: FactStore, fluent):
    """Expected fan-out of a literal given its bound positions, from a game's initial facts."""
    cache: dict = {}

    def estimate(pred: str, pos: tuple) -> float:
        k = (pred, pos)
        v = cache.get(k)
        if v is None:
            facts = (init_fluent if pred in fluent else static).by_pred.get(pred, ())
            n = len(facts)
            if not pos or not n:
                v = float(n)
            else:
                v = n / len({tuple(a[i + 1] for i in pos) for a in facts})
            cache[k] = v
        return v

    return estimate


@lru_cache(maxsize=8)
def _document(text: str) -> tuple[dict[str, ActionText], dict]:
    return parse_document(text)


@dataclass
class Game:
    key: str
    cd: CompiledDomain
    problem: Problem
    types: TypeSets
    static: FactStore
    init_fluent: FactStore
    init_atoms: set
    model: FactStore
    copy_joins: list
    goal_joins: list
    actions: dict[str, ActionText]
    grammar: Grammar
    names: dict[str, str]
    text_init: TextFacts
    ops: dict = field(default_factory=dict)  # (copy index, binding) -> Op | None
    commands: dict = field(default_factory=dict)  # command_key(op) -> command (templates over static facts)
    static_template: dict = field(default_factory=dict)  # action name -> template only queries static facts
    initial: tuple | None = None  # (intro, admissible, command -> op, won)
    _key_spec: dict = field(default_factory=dict)

    def is_fluent(self, atom: tuple) -> bool:
        return atom in self.model

    def op(self, copy, binding: tuple) -> Op | None:
        """The operator for an applicable (copy, binding), or None if FD drops it."""
        key = (copy.index, binding)
        try:
            return self.ops[key]
        except KeyError:
            if surely_kept(copy, binding):
                op = make_op(copy, binding)
            else:
                effects = translate_op(copy, binding, self.is_fluent, self.init_atoms, self.types)
                op = None if effects is None else make_op(copy, binding, effects)
            self.ops[key] = op
            return op

    def command_key(self, op: Op):
        """Key under which `op`'s derived command can be cached, or None.

        A template that only reads static facts gives the same text for every
        operator that agrees on the placeholders the template reads (provided
        its queries bind no new placeholder, which the other bound objects
        could block)."""
        action = op.name[0]
        spec = self._key_spec.get(action, 0)
        if spec == 0:
            spec = None
            if self.static_template.get(action):
                _, names, phs = self.grammar.dependencies(self.actions[action].template)
                params = [ph for ph, _ in op.mapping]
                if all(ph in params for ph in phs):
                    used = {ph for ph in phs} | {ph for ph in params if ph[0] in names}
                    spec = tuple(i for i, ph in enumerate(params) if ph in used)
            self._key_spec[action] = spec
        if spec is None:
            return None
        return (op.copy.name,) + tuple(op.mapping[i][1] for i in spec)

    def effects(self, op: Op) -> tuple:
        if op.effects is None:
            op.effects = translate_op(op.copy, op.binding, self.is_fluent, self.init_atoms, self.types)
            if op.effects is None:  # cannot happen: surely_kept() is a sufficient test
                raise AssertionError(f"operator {op.name} has no effect")
        return op.effects


def _lift_constants(lits) -> tuple[tuple, list[tuple[str, str]]]:
    """Replace the objects named in a goal by bound variables, so that goals of
    the same shape share one compiled join."""
    consts: dict[str, str] = {}
    out = []
    for lit in lits:
        args = []
        for a in lit.args:
            if not a.startswith("?"):
                a = consts.setdefault(a, f"?const{len(consts)}")
            args.append(a)
        out.append(Literal(lit.pred, tuple(args), lit.negated))
    return tuple(out), [(v, c) for c, v in consts.items()]


def _call_with(fn, values, F, S, D, T):
    return fn(F, S, D, T, *values)


_GAMES: OrderedDict[str, Game] = OrderedDict()


_PATH_KEYS: dict[tuple, str] = {}


def load_game(path: str) -> Game:
    """The compiled game for a ``game.tw-pddl`` file (cached by content)."""
    st = os.stat(path)
    pkey = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    key = _PATH_KEYS.get(pkey)
    game = _GAMES.get(key) if key else None
    if game is not None:
        _GAMES.move_to_end(key)
        return game
    raw = open(path, "rb").read()
    key = hashlib.sha1(raw).hexdigest()
    _PATH_KEYS[pkey] = key
    game = _GAMES.get(key)
    if game is not None:
        _GAMES.move_to_end(key)
        return game
    enabled = gc.isenabled()
    gc.disable()  # compiling allocates many small objects: no collection pauses meanwhile
    try:
        game = compile_game(json.loads(raw), key)
    finally:
        if enabled:
            gc.enable()
    _GAMES[key] = game
    while len(_GAMES) > GAME_CACHE_SIZE:
        _GAMES.popitem(last=False)
    return game


def compile_game(data: dict, key: str = "") -> Game:
    cd = compile_domain(data["pddl_domain"])
    domain = cd.domain
    problem = parse_problem(data["pddl_problem"], domain)
    fluent = domain.fluent_predicates

    types = TypeSets()
    for obj, t in problem.objects.items():
        for tt in [t] + domain.supertypes.get(t, ["object"] if t != "object" else []):
            types.setdefault(tt, set()).add(obj)
    types.setdefault("object", set()).update(problem.objects)
    for t in list(types):
        types[t] = frozenset(types[t])
    for copy in domain.copies:  # types no object has (e.g. ALFWorld's "location,")
        for _, t in copy.params:
            types.setdefault(t, frozenset())

    static = FactStore(a for a in problem.init if a[0] not in fluent)
    init_fluent = FactStore(a for a in problem.init if a[0] in fluent)
    init_atoms = set(problem.init)
    estimate = _estimator(static, init_fluent, fluent)

    def compiled(spec: JoinSpec):
        return cd.join(spec, estimate)

    model = relaxed_model(cd.relaxed_rules, compiled, static, init_fluent, types)
    copy_joins = [compiled(spec) for spec in cd.copy_specs]
    goal_joins = []
    solvable = False
    for params, lits in problem.goal:
        lifted, consts = _lift_constants(lits)
        bound = tuple(v for v, _ in consts)
        values = tuple(c for _, c in consts)
        fn = compiled(JoinSpec(tuple(params), lifted, bound))
        goal_joins.append(functools.partial(_call_with, fn, values))
        relaxed_fn = compiled(JoinSpec(tuple(params), lifted, bound, relaxed=True))
        solvable = solvable or bool(relaxed_fn(model, static, None, types, *values))

    actions, table = _document(data["grammar"])
    obj_type = dict(problem.objects)
    ids = {a for atom in problem.init for a in atom[1:]}
    names = demangle(ids)
    entities = {i: Entity(i, obj_type.get(i), names[i]) for i in ids}
    grammar = Grammar(table, cd.tree, entities, obj_type)

    text_static: dict[str, frozenset] = {}
    text_dyn: dict[str, set] = {}
    for atom in problem.init:
        if atom[0] in fluent:
            text_dyn.setdefault(atom[0], set()).add(atom[1:])
        else:
            text_static.setdefault(atom[0], set()).add(atom[1:])
    text_static = {p: frozenset(s) for p, s in text_static.items()}
    for p in fluent:  # every fluent predicate is dynamic, and so is its "not_" twin
        text_dyn.setdefault(p, set())
        text_dyn.setdefault("not_" + p, set())
    text_init = TextFacts(text_static, text_dyn, obj_type, {})

    static_template = {}
    for name, act in actions.items():
        preds, _, _ = grammar.dependencies(act.template)
        static_template[name] = not any(p in text_dyn for p in preds)
    if not solvable:
        # Fast Downward then emits an empty task and the stock engine fails to
        # load it (KeyError: 'val1'); say what is wrong instead.
        raise ValueError(
            "the goal cannot be reached from the initial state, even ignoring negative conditions "
            "(the stock engine fails to load such a game)"
        )
    game = Game(
        key,
        cd,
        problem,
        types,
        static,
        init_fluent,
        init_atoms,
        model,
        copy_joins,
        goal_joins,
        actions,
        grammar,
        names,
        text_init,
        static_template=static_template,
    )
    return game
