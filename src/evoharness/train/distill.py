"""Distil noisy agent logs into BPE next-action pairs (stage-1 SFT data).

Input: logs of an imperfect agent, one episode per JSONL line, in either format
(detected per line):

Both ALFWorld wordings of the placing command are accepted (``put X in/on Y``
of json_2.1.1 games, ``move X to Y`` of alfworld >= 0.4): a log's wording is
the one it records (``info.wording`` of a Trajectory, ``wording`` of a ReAct
line: ``put`` or ``move``), else the one its own actions and observations use,
and the game is replayed in that wording (`log_wording`).

(a) this project's `Trajectory` JSONL (``rollout/records.py``), e.g. from
    ``evoharness eval --policy noisy_expert``: environment turns are kept
    (``kind == "env"``: ``action``, ``feedback``, ``admissible_commands``),
    meta and invalid turns are dropped (meta-actions are re-inserted below);
(b) a ReAct-format JSONL from any other agent::

        {"task_id": "...",            # optional: the game to replay (bundled pack / $ALFWORLD_DATA id)
         "task_type": "...",          # optional
         "split": "train",            # optional: where to look the task up
         "goal": "put a clean mug in coffeemachine.",
         "initial_observation": "-= Welcome to TextWorld, ALFRED! =- ...",
         "admissible_commands": [...],  # optional: at the start
         "steps": [{"action": "go to countertop 1",
                    "observation": "You arrive at loc 5. On the countertop 1, ...",
                    "admissible_commands": [...]}, ...],   # optional: after the step
         "won": true,
         "wording": "move"}             # optional: put | move (else detected from the steps)

Per episode (only ``won`` episodes are used):

1. **Clean.** Drop invalid steps (the engine answered ``Nothing happens.``) and
   cut loops: the physical state the agent changed is tracked from the
   (action, observation) pairs alone (where the agent stands, what it holds,
   which receptacles it opened or closed, which objects it moved and where,
   which it heated / cooled / cleaned / switched on); when a step returns to a
   state met earlier, every step since then is cut (a detour whose state is
   later revisited, a take-and-put-back, an open-and-close, a repeated
   command, a look / inventory / examine). Search visits that change nothing
   but the agent's place are kept unless the agent comes back: they are how
   a non-privileged agent learns where things are not.
2. **Verify.** With the game available (``task_id`` found in the bundled pack
   or ``$ALFWORLD_DATA``), the cleaned actions are replayed in a fresh
   environment: every one must be admissible and not answered ``Nothing
   happens.``, and the last must win; observations and admissible commands are
   then the engine's. Without the game, the log's own observations are used
   and admissible commands must be in the log.
3. **Rebuild the BPE state.** The cleaned steps are replayed through a fresh
   `BPEHarness` (belief from its parser, progress from committed subgoals,
   experience from the shared store). Before each environment action the
   scripted teacher (`policies/teacher.py`) is asked what it would do on the
   rendered prompt; while it answers with a meta-action (plan ``commit`` at
   the start and at subgoal switches, ``note``, ``recall``, ``track``), that
   meta-action is inserted and run. Then the log's action is emitted, with
   the teacher's reason when the teacher would have chosen it too, else a
   short reason from the current subgoal.
4. **Experience.** Episodes are processed in batches; the store is frozen
   during a batch and consolidated after it, so only verified successful
   episodes feed it (pickups, notes).

Output: one distilled `Trajectory` per episode (``policy = "distill:<source>"``),
and next-action pairs ``{"messages", "completion": "<think>…</think><action>…</action>"}``
in the same format as the teacher's (`rollout.collect.traces_to_sft`).

Caveat: a *privileged* agent's log (the noisy expert reads the PDDL state)
walks straight to hidden objects; distilled, it still teaches guessing. Use
it to test the pipeline; for SFT data prefer non-privileged agents (an LLM
with the ReAct or BPE harness) or the scripted teacher.

Command line::

    evoharness distill logs.jsonl --out runs/distill/traj.jsonl --sft runs/distill/sft.jsonl
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evoharness.config.collect import DistillConfig
from evoharness.config.harness import HarnessConfig
from evoharness.envs.alfworld.wording import parse_place
from evoharness.envs.base import StepResult, TaskSpec
from evoharness.files import read_jsonl
from evoharness.harness.base import META_VERBS, normalize_command, split_completion
from evoharness.harness.factory import make_harness
from evoharness.models.tokenizer import estimate_tokens
from evoharness.policies.base import format_action
from evoharness.policies.teacher import current_subgoal, decide, parse_prompt
from evoharness.rollout.collect import traces_to_sft, write_jsonl_atomic
from evoharness.rollout.records import Trajectory, TurnRecord

MAX_META_RUN = 4  # meta-actions inserted in a row at most (the teacher never needs more than 3)


# ----------------------------------------------------------------- the logs


@dataclass
class LogStep:
    """One environment step of a log: the command, the engine's answer, and
    the admissible commands before / after it (None when the log lacks them)."""

    action: str
    observation: str
    admissible_before: list[str] | None = None
    admissible_after: list[str] | None = None


@dataclass
class AgentLog:
    """One episode of an agent, whatever its source format."""

    episode_id: str
    goal: str
    initial_observation: str
    steps: list[LogStep]
    won: bool
    task_id: str = ""
    task_type: str = ""
    split: str = ""
    admissible_start: list[str] | None = None
    source: str = ""
    wording: str = "native"  # put | move | native (the game file's own) | mixed (see `log_wording`)


def log_action(raw: Any) -> str:
    """A step's action as an agent logged it, read by the harnesses' final-answer rule
    (`harness.base.split_completion`, `normalize_command`), so a log keeps the commands the
    harness would have executed: ``> go to desk 1`` (ReAct's own prompt format),
    ``Action: Go to desk 1.``, ``<think>…</think><action>go to desk 1</action>`` all give
    ``go to desk 1``. Text the rule finds no single action in is kept as written (and
    then fails replay, recorded as a drop)."""
    text = str(raw).strip()
    _, action = split_completion(text)
    return normalize_command(action) or text


def parse_log(d: dict[str, Any], n: int = 0) -> AgentLog:
    """An `AgentLog` from a `Trajectory` dict (has ``turns``) or a ReAct dict (has ``steps``).

    Raises:
        ValueError: neither format, or a step without an action.
    """
    if "turns" in d:
        env_turns = [t for t in d["turns"] if t.get("kind") == "env"]
        steps = []
        for i, t in enumerate(env_turns):
            nxt = env_turns[i + 1].get("admissible_commands") if i + 1 < len(env_turns) else None
            steps.append(
                LogStep(
                    log_action(t["action"]), t.get("feedback", ""), t.get("admissible_commands") or None, nxt or None
                )
            )
        return AgentLog(
            episode_id=d.get("episode_id") or f"{d.get('task_id', 'episode')}#{n}",
            goal=d.get("goal", ""),
            initial_observation=d.get("initial_observation", ""),
            steps=steps,
            won=bool(d.get("won")),
            task_id=d.get("task_id", ""),
            task_type=d.get("task_type", ""),
            split=d.get("split", ""),
            admissible_start=steps[0].admissible_before if steps else None,
            source=d.get("policy", "trajectory"),
            wording=_recorded_wording((d.get("info") or {}).get("wording"), steps),
        )
    if "steps" in d:
        steps = []
        for s in d["steps"]:
            if "action" not in s:
                raise ValueError("a ReAct step needs an 'action'")
            steps.append(
                LogStep(
                    log_action(s["action"]), str(s.get("observation", "")).strip(), None, s.get("admissible_commands")
                )
            )
        prev = d.get("admissible_commands")
        for s in steps:  # a step's admissible-before is the previous step's admissible-after
            s.admissible_before, prev = prev, s.admissible_after
        tid = d.get("task_id", "")
        return AgentLog(
            episode_id=d.get("episode_id") or f"{tid or 'episode'}#{n}",
            goal=d.get("goal", ""),
            initial_observation=d.get("initial_observation", ""),
            steps=steps,
            won=bool(d.get("won")),
            task_id=tid,
            task_type=d.get("task_type", ""),
            split=d.get("split", ""),
            admissible_start=d.get("admissible_commands"),
            source=d.get("agent", "react"),
            wording=_recorded_wording(d.get("wording"), steps),
        )
    raise ValueError("a log line needs 'turns' (Trajectory) or 'steps' (ReAct format)")


_PLACED_RE = re.compile(r"^You (put|move) the [a-z]+ \d+ (?:in/on|to) the ", re.M)


def log_wording(steps: list[LogStep]) -> str:
    """``put`` or ``move`` as the steps' own place commands and observations use it;
    ``native`` when they never place anything (then the wording does not matter);
    ``mixed`` when they use both (such a log is dropped: no game speaks both)."""
    seen = set()
    for st in steps:
        if (m := re.match(r"^(put|move) ", st.action)) and parse_place(st.action):
            seen.add(m.group(1))
        if m := _PLACED_RE.search(st.observation):
            seen.add(m.group(1))
    if len(seen) > 1:
        return "mixed"
    return seen.pop() if seen else "native"


def _recorded_wording(recorded: Any, steps: list[LogStep]) -> str:
    """The wording a log records (``put``/``move``), else the one its steps use."""
    return recorded if recorded in ("put", "move") else log_wording(steps)


def load_logs(path: str | Path) -> list[AgentLog]:
    """Every episode of a log JSONL (either format; torn lines skipped)."""
    return [parse_log(d, i) for i, d in enumerate(read_jsonl(path))]


# ----------------------------------------------------------------- cleaning

_NAME = r"[a-z]+ \d+"
_PICK_RE = re.compile(rf"You pick up the ({_NAME}) from the ({_NAME})\.")
_PUT_RE = re.compile(rf"You (?:put the ({_NAME}) in/on the|move the ({_NAME}) to the) ({_NAME})\.")
_OPEN_RE = re.compile(rf"You open the ({_NAME})\.")
_CLOSE_RE = re.compile(rf"You close the ({_NAME})\.")
_TRANSFORM_RE = re.compile(rf"You (heat|cool|clean) the ({_NAME}) using the ({_NAME})\.")
_TOGGLE_RE = re.compile(rf"You turn (on|off) the ({_NAME})\.")
_STATE = {"heat": "hot", "cool": "cold", "clean": "clean"}


def is_invalid(observation: str) -> bool:
    """The engine refused the command."""
    return observation.strip().startswith("Nothing happens") or not observation.strip()


@dataclass
class _World:
    """What the agent knows of the initial world, learnt along the log:
    where each object it took first lay, whether each receptacle it opened or
    closed was open at the start, whether each device it toggled was on."""

    origin: dict[str, str] = field(default_factory=dict)
    open0: dict[str, bool] = field(default_factory=dict)
    on0: dict[str, bool] = field(default_factory=dict)


State = tuple  # (place, held, opened-differences, object states, moved objects, toggled-differences)


def advance(state: State, world: _World, action: str, observation: str) -> State:
    """The agent-changed physical state after one step (observations only, no PDDL).

    Only what differs from the initial world is recorded, so undoing a change
    (closing what was opened, putting an object back) returns to the same state.
    """
    place, held, opened, states, moved, toggled = state
    opened, states, moved, toggled = dict(opened), set(states), dict(moved), dict(toggled)
    obs = observation.strip()
    if is_invalid(obs):
        return state
    if action.startswith("go to ") and obs.startswith("You arrive"):
        place = action[len("go to ") :]
    if m := _PICK_RE.search(obs):
        obj, rec = m.groups()
        world.origin.setdefault(obj, rec)
        held, moved[obj] = obj, "held"
    if m := _PUT_RE.search(obs):
        obj, rec = (m.group(1) or m.group(2)), m.group(3)
        held = None if held == obj else held
        if world.origin.get(obj) == rec:
            moved.pop(obj, None)
        else:
            moved[obj] = rec
    for pat, now in ((_OPEN_RE, True), (_CLOSE_RE, False)):
        if m := pat.search(obs):
            rec = m.group(1)
            world.open0.setdefault(rec, not now)
            if world.open0[rec] == now:
                opened.pop(rec, None)
            else:
                opened[rec] = now
    if m := _TRANSFORM_RE.search(obs):
        verb, obj = m.group(1), m.group(2)
        states.add((obj, _STATE[verb]))
        if verb == "heat":
            states.discard((obj, "cold"))
        elif verb == "cool":
            states.discard((obj, "hot"))
    if m := _TOGGLE_RE.search(obs):
        now, dev = m.group(1) == "on", m.group(2)
        world.on0.setdefault(dev, not now)
        if world.on0[dev] == now:
            toggled.pop(dev, None)
        else:
            toggled[dev] = now
    return (
        place,
        held,
        frozenset(opened.items()),
        frozenset(states),
        frozenset(moved.items()),
        frozenset(toggled.items()),
    )


INITIAL_STATE: State = (None, None, frozenset(), frozenset(), frozenset(), frozenset())


@dataclass
class Cleaned:
    """A log's steps after cleaning, and what was removed (``invalid``, ``loop``)."""

    steps: list[LogStep]
    removed: Counter = field(default_factory=Counter)


def clean_steps(steps: list[LogStep]) -> Cleaned:
    """Drop invalid steps and cut every loop (a return to an earlier state).

    A state revisited at step j after step i means steps i+1..j changed
    nothing in the end: they are removed. What remains never visits a state
    twice. The world is deterministic, so the remaining steps stay valid.
    """
    world = _World()
    path: list[tuple[State, LogStep | None]] = [(INITIAL_STATE, None)]
    seen: dict[State, int] = {INITIAL_STATE: 0}
    removed: Counter = Counter()
    for step in steps:
        if is_invalid(step.observation):
            removed["invalid"] += 1
            continue
        state = advance(path[-1][0], world, step.action, step.observation)
        if state in seen:
            k = seen[state]
            removed["loop"] += len(path) - k  # the steps since state k, and this one
            for s, _ in path[k + 1 :]:
                del seen[s]
            del path[k + 1 :]
            continue
        seen[state] = len(path)
        path.append((state, step))
    return Cleaned([s for _, s in path[1:]], removed)


def state_trace(actions_and_obs: list[tuple[str, str]]) -> list[State]:
    """The agent-changed state after each step (for tests: a loop-free trace has no repeats)."""
    world, state, out = _World(), INITIAL_STATE, []
    for a, o in actions_and_obs:
        state = advance(state, world, a, o)
        out.append(state)
    return out


# ----------------------------------------------------------------- verification


class DistillError(ValueError):
    """An episode that cannot be distilled; the message says why."""


def replay(env, actions: list[str]) -> tuple[StepResult, list[StepResult]]:
    """Play `actions` in a fresh `env`: (reset result, step results).

    Raises:
        DistillError: an action not admissible or answered ``Nothing happens.``,
            the episode ending early, or not won at the end.
    """
    first = env.reset()
    results, last = [], first
    for i, a in enumerate(actions):
        if last.done:
            raise DistillError(f"the episode ended before step {i + 1}")
        if a not in last.admissible_commands:
            raise DistillError(f"step {i + 1} '{a}' is not admissible on replay")
        last = env.step(a)
        if is_invalid(last.observation):
            raise DistillError(f"step {i + 1} '{a}': Nothing happens on replay")
        results.append(last)
    if not last.won:
        raise DistillError("the cleaned actions do not win on replay")
    return first, results


def _log_results(log: AgentLog, steps: list[LogStep]) -> tuple[StepResult, list[StepResult]]:
    """Step results from the log itself (no game to replay)."""
    if log.admissible_start is None or any(s.admissible_after is None for s in steps[:-1]):
        raise DistillError("no game to replay and the log lacks admissible commands")
    first = StepResult(log.initial_observation, list(log.admissible_start), goal=log.goal)
    out = []
    for i, s in enumerate(steps):
        last = i == len(steps) - 1
        out.append(
            StepResult(s.observation, list(s.admissible_after or []), done=last, won=last and log.won, goal=log.goal)
        )
    return first, out


# ----------------------------------------------------------------- rebuilding the BPE turns


def _reason(view, action: str) -> str:
    """A short reason for a log action the teacher would not have chosen."""
    g = view.goal
    sub = current_subgoal(view)
    if action.startswith("go to "):
        rec = action[len("go to ") :]
        if sub.startswith("find"):
            return f"I have not found the {g.obj} yet; I search the {rec}."
        if sub.startswith("use"):
            return f"I hold the {g.obj}; I look for the {g.light} at the {rec}."
        if g.transform and sub.startswith(g.transform):
            return f"I go to the {rec} to {g.transform} the {g.obj}."
        return f"I carry the {g.obj} to the {rec}."
    if action.startswith("open "):
        return f"I open the {action[5:]} to see inside."
    if m := re.match(r"^take (.+) from (.+)$", action):
        return f"There is a {m.group(1)} on the {m.group(2)}; I take it."
    if p := parse_place(action):
        return f"I put the {p[0]} in/on the {p[1]}."
    if m := re.match(r"^(heat|cool|clean) (.+) with (.+)$", action):
        return f"I {m.group(1)} the {m.group(2)} with the {m.group(3)}."
    if action.startswith("use "):
        return f"I turn on the {action[4:]} while holding the {g.obj}."
    return f"I {action}."


def _turn(h, n: int, completion: str, parsed, feedback: str, result: StepResult, messages, views) -> TurnRecord:
    return TurnRecord(
        turn=n,
        messages=messages,
        completion=completion,
        kind=parsed.kind,
        action=parsed.text,
        feedback=feedback,
        views=views,
        admissible_commands=list(h.admissible),
        won=result.won,
        done=result.done,
        prompt_tokens=sum(estimate_tokens(m["content"]) for m in messages),
        completion_tokens=estimate_tokens(completion),
    )


def rebuild(
    task: TaskSpec,
    first: StepResult,
    results: list[StepResult],
    actions: list[str],
    store,
    harness: HarnessConfig | None = None,
) -> list[TurnRecord]:
    """Replay `actions` (with their verified `results`) through a fresh BPE
    harness built from `harness` (default `HarnessConfig()`), inserting the
    meta-actions the teacher would place."""
    harness = harness or HarnessConfig()
    if harness.kind != "bpe":
        raise ValueError(f"distillation rebuilds BPE turns; harness.kind must be 'bpe', got {harness.kind!r}")
    h = make_harness(harness, experience=store)
    h.reset(task, first)
    turns: list[TurnRecord] = []
    last = first
    for action, result in zip(actions, results):
        inserted = 0
        while True:
            messages, views = h.messages(), h.views()
            t_action, t_think = decide(parse_prompt(messages[-1]["content"]))
            if t_action.split(" ", 1)[0] not in META_VERBS:
                break
            if inserted == MAX_META_RUN:
                raise DistillError("the teacher kept asking for meta-actions")
            completion = format_action(t_action, t_think)
            parsed = h.parse(completion)
            if parsed.kind != "meta":
                raise DistillError(f"teacher meta-action not parsed: {t_action!r}")
            turns.append(_turn(h, len(turns), completion, parsed, h.run_meta(parsed), last, messages, views))
            inserted += 1
        think = t_think if t_action == action else _reason(parse_prompt(messages[-1]["content"]), action)
        completion = format_action(action, think)
        parsed = h.parse(completion)
        if parsed.kind != "env":
            raise DistillError(f"'{action}' is not admissible in the rebuilt prompt")
        h.after_env_step(parsed, result)
        turns.append(_turn(h, len(turns), completion, parsed, result.observation, result, messages, views))
        last = result
    return turns


# ----------------------------------------------------------------- the driver


@dataclass
class DistillStats:
    """Counts over one `distill` call."""

    episodes: int = 0
    won: int = 0
    distilled: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> episodes
    steps_in: int = 0
    steps_out: int = 0
    removed: Counter = field(default_factory=Counter)  # invalid / loop -> steps
    meta: Counter = field(default_factory=Counter)  # verb -> inserted meta-actions
    pairs: int = 0


def find_tasks(
    splits: tuple[str, ...] = ("train", "valid_seen", "valid_unseen"), data_path: str | None = None
) -> dict[str, TaskSpec]:
    """task_id -> TaskSpec over the splits that exist (bundled pack by default)."""
    from evoharness.envs.alfworld.games import GameDataError, discover_games

    out: dict[str, TaskSpec] = {}
    for split in splits:
        try:
            for t in discover_games(split, data_path):
                out.setdefault(t.task_id, t)
        except GameDataError:
            continue
    return out


def distill(
    logs: list[AgentLog],
    make_env: Callable[[TaskSpec, str], Any] | None = None,
    tasks: dict[str, TaskSpec] | None = None,
    store=None,
    batch_size: int = 16,
    max_steps: int = 50,
    harness: HarnessConfig | None = None,
    progress: bool = False,
) -> tuple[list[Trajectory], DistillStats]:
    """Distil won episodes of `logs` into BPE trajectories (steps in the module docstring).

    Args:
        logs: parsed logs (`load_logs`).
        make_env: ``(task, wording) -> Env`` for replay/verification, in the log's
            wording (None: use the logs' own text).
        tasks: task_id -> TaskSpec to replay (`find_tasks`); logs whose task is
            unknown fall back to their own observations and admissible commands.
        store: the shared `ExperienceStore` (None: a fresh seeded one).
        batch_size: episodes per frozen-store batch; consolidated after each.
        max_steps: distilled episodes longer than this (meta-actions included)
            are dropped: a student could not finish them within the budget.
        harness: the BPE harness configuration the prompts are rendered with:
            the one ``eval`` and ``rl`` use (default `HarnessConfig()`).

    Returns:
        (distilled trajectories, `DistillStats`).
    """
    from evoharness.harness.bpe import ExperienceStore

    store = store if store is not None else ExperienceStore()
    tasks = tasks or {}
    stats = DistillStats(episodes=len(logs))
    out: list[Trajectory] = []
    for i in tqdm(range(0, len(logs), batch_size), desc="distill", disable=not progress):
        store.freeze()
        for log in logs[i : i + batch_size]:
            if not log.won:
                stats.dropped["not won"] += 1
                continue
            stats.won += 1
            stats.steps_in += len(log.steps)
            try:
                traj = _distill_one(log, make_env, tasks, store, max_steps, harness, stats)
            except DistillError as e:
                stats.dropped[str(e).split(":")[0][:60]] += 1
                continue
            out.append(traj)
        store.consolidate()
        store.unfreeze()
    return out, stats


def _distill_one(
    log: AgentLog, make_env, tasks, store, max_steps: int, harness: HarnessConfig | None, stats: DistillStats
) -> Trajectory:
    if log.wording == "mixed":
        raise DistillError("the log uses both 'put X in/on Y' and 'move X to Y'")
    cleaned = clean_steps(log.steps)
    actions = [s.action for s in cleaned.steps]
    if not actions:
        raise DistillError("no step left after cleaning")
    task = tasks.get(log.task_id)
    if task is not None and make_env is not None:
        env = make_env(task, log.wording)
        try:
            first, results = replay(env, actions)
        finally:
            env.close()
    else:
        task = TaskSpec(log.task_id or log.episode_id, log.task_type, log.split, "")
        first, results = _log_results(log, cleaned.steps)
    if log.goal and first.goal and log.goal.strip().rstrip(".") != first.goal.strip().rstrip("."):
        raise DistillError(f"goal mismatch on replay ({first.goal!r})")
    turns = rebuild(task, first, results, actions, store, harness)
    if len(turns) > max_steps:
        raise DistillError(f"too long after distillation ({len(turns)} > {max_steps} steps)")
    traj = Trajectory(
        episode_id=log.episode_id,
        task_id=task.task_id,
        task_type=log.task_type or task.task_type,
        split=log.split or task.split,
        harness="bpe",
        policy=f"distill:{log.source}",
        goal=first.goal or log.goal,
        initial_observation=first.observation,
        turns=turns,
        won=results[-1].won,
        stop_reason="won",
        max_steps=max_steps,
        info={
            "source_steps": len(log.steps),
            "removed": dict(cleaned.removed),
            "replayed": bool(task.path),
            "wording": log.wording,
        },
    )
    stats.distilled += 1
    stats.steps_out += len(actions)
    stats.removed.update(cleaned.removed)
    stats.meta.update(traj.meta_calls)
    stats.pairs += len(turns)
    return traj


def distill_file(
    in_path: str | Path,
    out_jsonl: str | Path,
    sft_out: str | Path | None = None,
    engine: str = "fast",
    data_path: str | None = None,
    **kw,
) -> DistillStats:
    """Distil a log JSONL: distilled trajectories to `out_jsonl`, SFT pairs to `sft_out`.

    Games are looked up in the bundled pack (or `data_path`) and replayed on
    `engine`. Both outputs are written atomically.
    """
    from evoharness.envs.alfworld import make_env

    trajs, stats = distill(
        load_logs(in_path),
        make_env=lambda t, wording: make_env(t, engine=engine, wording=wording),
        tasks=find_tasks(data_path=data_path),
        **kw,
    )
    write_jsonl_atomic(out_jsonl, [t.to_dict() for t in trajs])
    if sft_out is not None:
        traces_to_sft([t.to_dict() for t in trajs], sft_out)
    return stats


def run_distill(cfg: DistillConfig) -> dict[str, Any]:
    """``evoharness distill``: `distill_file` with `cfg`'s settings; the SFT examples get their recipe
    beside them (`config.recipe.write_examples_recipe`). Returns the stats as a JSON-able dict.

    Raises:
        FileNotFoundError: the logs file does not exist.
    """
    from evoharness.config.recipe import ExamplesRecipe, write_examples_recipe

    if not Path(cfg.logs).is_file():
        raise FileNotFoundError(f"logs file not found: {cfg.logs}")
    st = distill_file(
        cfg.logs,
        cfg.out,
        cfg.sft,
        engine=cfg.env.engine,
        data_path=cfg.env.data_path,
        max_steps=cfg.max_steps,
        harness=cfg.harness,
        progress=True,
    )
    if cfg.sft:
        write_examples_recipe(cfg.sft, ExamplesRecipe(harness=cfg.harness))
    return {
        "episodes": st.episodes,
        "won": st.won,
        "distilled": st.distilled,
        "dropped": dict(st.dropped),
        "steps_in": st.steps_in,
        "steps_out": st.steps_out,
        "removed": dict(st.removed),
        "meta": dict(st.meta),
        "pairs": st.pairs,
    }
