"""Differential check: the stock TextWorld engine vs the fast engine, step by step.

Both engines play the same game with the same commands; after the reset and
after every step the observation (byte for byte), the admissible commands
(same order), ``won``, ``done`` and the facts (as sets) are compared. Commands
are chosen on line from the stock engine's admissible list by a seeded mix of:

- the privileged planner expert (``evoharness.envs.alfworld.expert``) when it
  is available, else a goal-directed pick among the admissible commands
  (take/put/heat/cool/clean/use first);
- random admissible commands (the noise of a noisy expert, or a random walk);
- invalid or odd commands: ``jump``, ``take nothing``, ``help``, ``look``,
  ``inventory``, ``examine X`` for objects not at hand, wrong case, extra
  spaces, the other wording's placing command, an empty string.

A trajectory goes on a few steps after the game is won. Used by the tests
(`tests/envs/test_fast_engine_diff.py`) and by ``benchmarks/diff_engines.py``.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field

from evoharness.envs.base import StepResult, TaskSpec

INVALID = (
    "jump",
    "take nothing",
    "help",
    "look",
    "inventory",
    "",
    "LOOK",
    "  inventory  ",
    "go to nowhere",
    "open the door",
)


@dataclass
class Mix:
    """Probabilities of each kind of command (the rest: expert / goal-directed)."""

    p_invalid: float = 0.15
    p_random: float = 0.25
    steps: int = 25
    after_win: int = 2


@dataclass
class GameReport:
    task_id: str
    task_type: str
    wording: str
    steps: int = 0  # compared states (reset + steps)
    mismatches: list[dict] = field(default_factory=list)
    won: bool = False
    error: str = ""


def compare(a: StepResult, b: StepResult, facts_a, facts_b) -> list[tuple[str, object, object]]:
    diffs = []
    if a.observation != b.observation:
        diffs.append(("observation", a.observation, b.observation))
    if a.admissible_commands != b.admissible_commands:
        diffs.append(("admissible_commands", a.admissible_commands, b.admissible_commands))
    if a.won != b.won:
        diffs.append(("won", a.won, b.won))
    if a.done != b.done:
        diffs.append(("done", a.done, b.done))
    if facts_a is not None:
        fa, fb = set(facts_a), set(facts_b)
        if fa != fb:
            diffs.append(("facts", sorted(fa - fb)[:10], sorted(fb - fa)[:10]))
    return diffs


@contextlib.contextmanager
def memoized_stock_engine():
    """Speed the stock engine up 2-4x for long differential runs without
    changing what it computes: memoise its pure parsing/translation functions
    (FD's PDDL->SAS translation, which it redoes 4x per load+reset; the TatSu
    parse of grammar strings, handed out as deep copies since the engine
    mutates them; textworld's query parser). Restored on exit."""
    import copy
    import functools

    import fast_downward
    from textworld import logic
    from textworld.envs.pddl import textgen

    saved = (fast_downward.pddl2sas, textgen._parse_and_convert, logic.Rule.__dict__["parse_conjunctive_query"])
    parse = textgen._parse_and_convert
    cached = functools.lru_cache(maxsize=8192)(
        lambda text, rule_name, trace: parse(text, rule_name=rule_name, trace=trace)
    )
    fast_downward.pddl2sas = functools.lru_cache(maxsize=4)(saved[0])
    textgen._parse_and_convert = lambda text, rule_name, trace=False: copy.deepcopy(cached(text, rule_name, trace))
    logic.Rule.parse_conjunctive_query = classmethod(functools.lru_cache(maxsize=8192)(saved[2].__func__))
    try:
        yield
    finally:
        fast_downward.pddl2sas, textgen._parse_and_convert = saved[0], saved[1]
        logic.Rule.parse_conjunctive_query = saved[2]


def _expert(task: TaskSpec):
    try:
        from evoharness.envs.alfworld.expert import PlannerExpert
        from evoharness.envs.alfworld.task_info import load_task_info

        return PlannerExpert(load_task_info(task.path))
    except Exception:  # noqa: BLE001 - the expert is optional here
        return None


_GOAL_VERBS = ("take ", "put ", "move ", "heat ", "cool ", "clean ", "use ", "open ")


def _goal_directed(rng: random.Random, admissible: list[str]) -> str:
    useful = [c for c in admissible if c.startswith(_GOAL_VERBS)]
    return rng.choice(useful or admissible)


def _invalid(rng: random.Random, facts, admissible: list[str]) -> str:
    r = rng.random()
    if r < 0.4:
        return rng.choice(INVALID)
    names = sorted({a for _, args in facts for a in args if a[-1:].isdigit()}) if facts else []
    if r < 0.6 and names:
        return f"examine {rng.choice(names)}"
    if r < 0.7 and names:
        return f"take {rng.choice(names)} from {rng.choice(names)}"
    if r < 0.8 and names:
        verb = rng.choice(("put {} in/on {}", "move {} to {}"))
        return verb.format(rng.choice(names), rng.choice(names))
    if admissible:
        c = rng.choice(admissible)
        return rng.choice((c.upper(), c + " ", " " + c, c.replace(" ", "  ", 1), c + " now"))
    return "jump"


def choose(rng: random.Random, mix: Mix, expert, facts, admissible: list[str]) -> str:
    r = rng.random()
    if r < mix.p_invalid or not admissible:
        return _invalid(rng, facts, admissible)
    if r < mix.p_invalid + mix.p_random:
        return rng.choice(admissible)
    if expert is not None:
        try:
            cmd, _ = expert.next_action(facts, admissible)
            if cmd:
                return cmd
        except Exception:  # noqa: BLE001 - a buggy expert must not stop the check
            pass
    return _goal_directed(rng, admissible)


def run_game(
    task: TaskSpec, seed: int = 0, mix: Mix | None = None, wording: str = "native", stock=None, check_reset: bool = True
) -> GameReport:
    """Play one trajectory on both engines and compare every state."""
    from evoharness.envs.alfworld.fast import FastAlfredEnv
    from evoharness.envs.alfworld.textworld_env import TextWorldAlfredEnv

    mix = mix or Mix()
    rep = GameReport(task.task_id, task.task_type, wording)
    rng = random.Random(f"{seed}:{task.task_id}:{wording}")
    expert = _expert(task)
    ref = stock or TextWorldAlfredEnv(task, wording=wording, facts=True)
    fast = FastAlfredEnv(task, wording=wording)
    try:
        a, b = ref.reset(), fast.reset()
        first = b
        fa = ref.facts()
        for d in compare(a, b, fa, fast.facts()):
            rep.mismatches.append({"step": 0, "command": "<reset>", "field": d[0], "stock": d[1], "fast": d[2]})
        rep.steps = 1
        after = 0
        for i in range(1, mix.steps + 1):
            cmd = choose(rng, mix, expert, fa, a.admissible_commands)
            a, b = ref.step(cmd), fast.step(cmd)
            fa = ref.facts()
            diffs = compare(a, b, fa, fast.facts())
            rep.steps += 1
            if diffs:
                rep.mismatches.append(
                    {
                        "step": i,
                        "command": cmd,
                        "fields": [d[0] for d in diffs],
                        "diff": [(d[0], d[1], d[2]) for d in diffs],
                    }
                )
            if a.won:
                rep.won = True
                after += 1
                if after > mix.after_win:
                    break
        if check_reset:
            again = fast.reset()
            if (again.observation, again.admissible_commands, again.won) != (
                first.observation,
                first.admissible_commands,
                first.won,
            ):
                rep.mismatches.append({"step": -1, "command": "<second reset>", "fields": ["reset"]})
    except Exception as e:  # noqa: BLE001 - reported, counted as a mismatch
        rep.error = f"{type(e).__name__}: {e}"
        rep.mismatches.append({"step": rep.steps, "command": "<error>", "fields": ["error"], "diff": rep.error})
    finally:
        if stock is None:
            ref.close()
        fast.close()
    return rep
