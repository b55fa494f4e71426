"""The fast ALFWorld engine against the stock TextWorld engine (the reference).

- `test_same_as_stock_engine`: 60 bundled games, 10 of each task type, one
  trajectory each mixing planner-expert steps, random admissible commands and
  invalid/odd commands (a quarter in the ``move`` wording); observation (byte
  for byte), admissible commands (same order), won, done and facts compared
  after the reset and every step. The stock engine runs with its pure parsing
  functions memoised (`memoized_stock_engine`: same output, 2-4x faster);
  `test_same_as_unmodified_stock_engine` repeats one game per type on the
  untouched stock engine.
- the pieces on their own: the PDDL tokens, the reachable atoms and every
  ground operator (name and effects) against Fast Downward's translator, the
  grammar parser against TatSu, the names against ALFWorld's demangler.

``benchmarks/diff_engines.py`` runs the trajectory check on every game.
"""

from __future__ import annotations

import json
import sys

import pytest

from evoharness.envs.alfworld.fast.diff import Mix, memoized_stock_engine, run_game
from evoharness.envs.alfworld.games import TASK_TYPES, discover_games

PER_TYPE = 10
MIX = Mix(steps=14, p_invalid=0.15, p_random=0.2, after_win=1)


def _bundled() -> list:
    return discover_games("valid_seen") + discover_games("train")


def _sample() -> list:
    """PER_TYPE games of each type, spread over the bundled valid_seen + train games."""
    games = _bundled()
    out = []
    for tt in TASK_TYPES:
        of_type = [g for g in games if g.task_type == tt]
        step = max(1, len(of_type) // PER_TYPE)
        out.extend(of_type[::step][:PER_TYPE])
    return out


SAMPLE = _sample()


def test_sample_covers_all_types():
    assert len(SAMPLE) >= 60
    assert {g.task_type for g in SAMPLE} == set(TASK_TYPES)


def _check(task, seed: int, wording: str) -> None:
    rep = run_game(task, seed=seed, mix=MIX, wording=wording)
    assert rep.steps >= 2
    assert not rep.mismatches, json.dumps(rep.mismatches[:2], default=str)[:3000]


@pytest.mark.parametrize("i", range(len(SAMPLE)), ids=[f"{g.split}:{g.task_id.split('/')[0]}" for g in SAMPLE])
def test_same_as_stock_engine(i):
    with memoized_stock_engine():
        _check(SAMPLE[i], i, "move" if i % 4 == 3 else "native")


@pytest.mark.parametrize("tt", TASK_TYPES)
def test_same_as_unmodified_stock_engine(tt):
    i = next(k for k, g in enumerate(SAMPLE) if g.task_type == tt) + 1
    _check(SAMPLE[i], 1000 + i, "native")


def _variant(tmp_path, name: str, goal: str, move_object: bool):
    """A bundled game with another goal (and an object moved elsewhere)."""
    from evoharness.envs.base import TaskSpec

    task = next(g for g in discover_games("valid_seen") if g.task_type == "pick_cool_then_place_in_recep")
    data = json.load(open(task.path))
    prob = data["pddl_problem"]
    prob = prob[: prob.index("(:goal")] + goal + "\n)"
    if move_object:
        import re

        facts = re.findall(r"\(inReceptacle (\S+) (\S+)\)", prob)
        (obj, r1), r2 = facts[0], next(r for _, r in facts if r != facts[0][1])
        prob = prob.replace(f"(inReceptacle {obj} {r1})", f"(inReceptacle {obj} {r2})")
    data["pddl_problem"] = prob
    data["grammar"] = data["grammar"].replace("Your task is to: ", f"Your task is to: ({name}) ")
    path = tmp_path / name / "game.tw-pddl"
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    return TaskSpec(f"variant/{name}", task.task_type, "test", str(path))


GOALS = {
    "hot-apple-in-fridge": "(:goal (and (exists (?o - object ?r - receptacle) "
    "(and (objectType ?o AppleType) (isHot ?o) "
    "(receptacleType ?r FridgeType) (inReceptacle ?o ?r))) (exists (?a - agent ?l - location) (atLocation ?a ?l))))",
    "sliced-not-cool": "(:goal (exists (?o - object) (and (objectType ?o AppleType) (isSliced ?o) (not (isCool ?o)))))",
    "hold-anything": "(:goal (exists (?a - agent ?o - object) (holds ?a ?o)))",
}


@pytest.mark.parametrize("name", sorted(GOALS))
def test_other_goal_and_layout(tmp_path, name):
    """Nothing is special-cased: a game with another goal and layout plays the same."""
    with memoized_stock_engine():
        rep = run_game(
            _variant(tmp_path, name, GOALS[name], move_object=name != "sliced-not-cool"),
            seed=7,
            mix=Mix(steps=12, p_random=0.5, p_invalid=0.15),
        )
    assert not rep.mismatches, json.dumps(rep.mismatches[:2], default=str)[:3000]


def test_unreachable_goal_is_an_error(tmp_path):
    from evoharness.envs.alfworld.fast import FastAlfredEnv

    goal = "(:goal (exists (?o - object) (and (objectType ?o FridgeType) (holds agent1 ?o))))"
    with pytest.raises(ValueError, match="cannot be reached"):
        FastAlfredEnv(_variant(tmp_path, "impossible", goal, move_object=False))


# ---------------------------------------------------------------- the pieces


def _game_data(task_type: str, k: int = 0) -> dict:
    tasks = [g for g in discover_games("valid_seen") if g.task_type == task_type]
    return json.load(open(tasks[k].path))


def test_pddl_tokens_match_fast_downward():
    argv = sys.argv[:]
    sys.argv = ["translate.py", "domain", "task"]  # FD's options module parses argv on import
    try:
        from fast_downward.translate.pddl_parser import lisp_parser
    finally:
        sys.argv = argv
    from evoharness.envs.alfworld.fast.pddl import parse_nested

    for tt in TASK_TYPES:
        data = _game_data(tt)
        for key in ("pddl_domain", "pddl_problem"):
            assert parse_nested(data[key]) == lisp_parser.parse_nested_list(data[key].split("\n"))


def _parse_sas(sas: str):
    lines = sas.split("\n")
    variables, ops, i = [], [], 0
    while i < len(lines):
        if lines[i] == "begin_variable":
            n = int(lines[i + 3])
            variables.append(lines[i + 4 : i + 4 + n])
            i += 4 + n
        elif lines[i] == "begin_operator":
            name, nprev = lines[i + 1], int(lines[i + 2])
            j = i + 3 + nprev
            effs = []
            for line in lines[j + 1 : j + 1 + int(lines[j])]:
                p = list(map(int, line.split()))
                nc = p[0]
                conds = tuple((p[1 + 2 * k], p[2 + 2 * k]) for k in range(nc))
                effs.append((p[1 + 2 * nc], p[3 + 2 * nc], conds))
            ops.append((name, effs))
            i = j + 1 + int(lines[j])
        else:
            i += 1

    def atom(var: int, val: int):
        kind, rest = variables[var][val].split(" ", 1)
        pred, args = rest.split("(", 1)
        return (pred,) + tuple(a for a in args[:-1].split(", ") if a), 0 if kind == "Atom" else 1

    return variables, ops, atom


@pytest.mark.parametrize("task_type", ["pick_two_obj_and_place", "pick_heat_then_place_in_recep"])
def test_operators_match_fast_downward(task_type):
    """Every ground operator FD keeps (and no other), with the same effects, and
    the same relaxed-reachable atoms: the whole operator space, not just a walk."""
    import fast_downward

    from evoharness.envs.alfworld.fast.game import compile_game
    from evoharness.envs.alfworld.fast.joins import JoinSpec, compile_join, plan_order
    from evoharness.envs.alfworld.fast.reach import translate_op

    data = _game_data(task_type)
    argv = sys.argv[:]
    try:
        _, sas = fast_downward.pddl2sas(data["pddl_domain"], data["pddl_problem"])
    finally:
        sys.argv = argv
    variables, ops, atom = _parse_sas(sas)
    fd: dict[str, set] = {}
    for name, effs in ops:
        rep = tuple(
            sorted(
                {
                    (atom(v, post)[0], post, tuple(sorted(atom(cv, cx)[0:2] for cv, cx in conds)))
                    for v, post, conds in effs
                }
            )
        )
        fd.setdefault(name, set()).add(rep)
    fd_atoms = {atom(v, 0)[0] for v in range(len(variables)) if not variables[v][0].startswith("Atom new-axiom")}

    game = compile_game(data)
    assert set(game.model) == fd_atoms
    mine: dict[str, set] = {}
    for copy in game.cd.domain.copies:
        spec = JoinSpec(tuple(copy.params), tuple(copy.precondition), relaxed=True)
        join = compile_join(spec, plan_order(spec, lambda p, pos: 1.0), game.cd.fluent)
        for binding in set(join(game.model, game.static, None, game.types)):
            effects = translate_op(copy, binding, game.is_fluent, game.init_atoms, game.types)
            if effects is not None:
                name = " ".join((copy.name,) + binding[: copy.n_external])
                mine.setdefault(name, set()).add(tuple(sorted({(a, post, tuple(sorted(c))) for a, post, c in effects})))
    assert set(mine) == set(fd)
    assert mine == fd


def _tw_symbols(symbols) -> tuple:
    from textworld.envs.pddl import textgen as tg

    def conv(s):
        if isinstance(s, tg.ListSymbol):
            return ("list", conv(s.symbol))
        if isinstance(s, tg.ConditionalSymbol):
            return ("cond", conv(s.expression), s.given)
        if isinstance(s, tg.NonterminalSymbol):
            return ("nt", s.symbol)
        if isinstance(s, tg.EvalSymbol):
            return ("eval", s.expression)
        return ("t", s.symbol)

    return tuple(conv(s) for s in symbols)


def _mine(symbols) -> tuple:
    def conv(s):
        if s[0] == "list":
            return ("list", conv(s[1]))
        if s[0] == "cond":
            return ("cond", conv(s[1]), s[2])
        if s[0] == "eval":
            return ("eval", s[2])
        return s

    return tuple(conv(s) for s in symbols)


def test_grammar_parser_matches_tatsu():
    from textworld.envs.pddl.textgen import _parse_and_convert

    from evoharness.envs.alfworld.fast.grammar import parse_document, parse_rhs

    data = _game_data("pick_clean_then_place_in_recep")
    actions, table = parse_document(data["grammar"])
    texts = [alt["rhs"] for alts in table.values() for alt in alts]
    texts += [a.template for a in actions.values()] + [a.feedback for a in actions.values()]
    texts += [" (it is open)", "a\tb {x}\t c", "\n\nfoo\n#bar#\n  baz", "  #foo#  ", 'say "hi" there', "x ; y", ""]
    texts += [
        "{o.indefinite} {o.name} (in/on the {r.name})}",
        '"unclosed',
        "[{#a# | p(x:t)}] and {b | q(y:u) & r(x:t, y:u)}",
    ]
    for text in texts:
        assert _mine(parse_rhs(text)) == _tw_symbols(_parse_and_convert(text, rule_name="symbols")), repr(text)


def test_document_matches_textworld():
    from textworld.envs.pddl.logic import GameLogic

    from evoharness.envs.alfworld.fast.grammar import parse_document

    for tt in ("look_at_obj_in_light", "pick_cool_then_place_in_recep"):
        data = _game_data(tt)
        logic = GameLogic(domain=data["pddl_domain"], grammar=data["grammar"])
        actions, table = parse_document(data["grammar"])
        assert {k: (a.template, a.feedback_rule) for k, a in logic.actions.items()} == {
            k: (a.template, a.feedback) for k, a in actions.items()
        }
        assert set(logic.grammar._rules) == set(table)
        for name, rules in logic.grammar._rules.items():
            assert [(r.condition or "") for r in rules] == [alt.get("condition", "") for alt in table[name]]


def test_names_match_alfworld_demangler():
    from alfworld.agents.utils.misc import Demangler

    from evoharness.envs.alfworld.fast.game import compile_game
    from evoharness.envs.alfworld.fast.names import demangle

    class Info:
        def __init__(self, id_):
            self.id = id_

    for tt in TASK_TYPES:
        game = compile_game(_game_data(tt))
        ids = {a for atom in game.problem.init for a in atom[1:]}
        d = Demangler(game_infos={i: Info(i) for i in ids})
        assert demangle(ids) == {i: d.demangle_alfred_name(i) for i in ids}


# ---------------------------------------------------------------- engine behaviour


def test_envs_on_one_game_are_independent(one_per_type):
    """Shared per-game caches must not leak state between live environments."""
    from evoharness.envs.alfworld.fast import FastAlfredEnv

    task = one_per_type[2]
    a, b = FastAlfredEnv(task), FastAlfredEnv(task)
    ra, rb = a.reset(), b.reset()
    first = (ra.observation, ra.admissible_commands, sorted(a.facts()))
    for _ in range(3):
        ra = a.step(ra.admissible_commands[0])
    assert (rb.observation, rb.admissible_commands, sorted(b.facts())) == first
    rb2 = b.reset()
    assert (rb2.observation, rb2.admissible_commands) == first[:2]
    assert a.facts() != b.facts()
    ra = a.reset()
    assert (ra.observation, ra.admissible_commands, sorted(a.facts())) == first


def test_make_env_selects_engine(one_per_type):
    from evoharness.envs.alfworld import make_env

    env = make_env(one_per_type[0], engine="fast")
    assert env.engine == "fast"
    r = env.reset()
    assert r.goal and r.admissible_commands and not r.won
    assert env.step("jump").observation == "Nothing happens."
    env.close()
