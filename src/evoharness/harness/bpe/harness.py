"""The BPE harness: Belief / Progress / Experience with meta-actions (EvoHarness-RL).

EvoHarness-RL (arXiv 2608.05446) gives the policy a harness state
H_t = (B_t, P_t, E_t) and four meta-actions that share the action space with
environment commands and cost one step of the same budget each:

- ``track <object>`` / ``track world``: read the belief (`belief.py`, 48 edges);
- ``commit <subgoal update>``: write the plan (`progress.py`, 8 subgoals);
- ``recall <query>``: read experience (`experience.py`, 4 x 80 entries, top-3);
- ``note <insight>``: buffer an insight for consolidation.

Per-turn user message, in order: OBJECTIVE, OBSERVATION, ADMISSIBLE COMMANDS,
PREVIOUS ACTIONS, then the harness views PLAN, RECALLED HINTS (top-3
where-to-find priors for the objective's object, retrieved once at reset),
TRACK RESULT and RECALL RESULT (the latest of each, once there is one).

TRACK RESULT is live: the latest track query answered from the belief as it
is this turn (an object in the latest observation, or on the open receptacle
the agent is at, says "in view"; one the agent put somewhere, "placed by
you"), so a tracked goal object's line turns from "not seen yet" to "in/on R,
in view" the step the agent sees it; the receptacles not searched yet follow,
likeliest first (`search.py`: the object's recalled receptacle types, then a
fixed prior), so "where next" is the list's first entry and the search for a
second one (pick-two) reads the same view. Reading that line is
how a small student decides "the goal is here" without matching the goal's
name against every object listed (benchmarks/results/student/grounding.md: a
from-scratch 1M student does not learn that match). RECALL RESULT is the
snapshot of its turn.

OBSERVATION is always the latest *environment* observation: meta-actions and
invalid actions do not change the world. Their feedback is the newest
PREVIOUS ACTIONS entry, shown in full next turn (older entries are
shortened); track/recall results are shown in full in their views instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from evoharness.envs.base import StepResult, TaskSpec
from evoharness.harness.base import META_VERBS, Harness, ParsedAction
from evoharness.harness.bpe.belief import BELIEF_CAPACITY, Belief, track_subject, type_of
from evoharness.harness.bpe.experience import Entry, ExperienceStore, Recall
from evoharness.harness.bpe.goal import Goal, parse_goal
from evoharness.harness.bpe.progress import PLAN_CAPACITY, Progress
from evoharness.harness.bpe.search import search_order
from evoharness.harness.prompt import HISTORY_HEADER, history_entry, render_history

SYSTEM_PROMPT = (
    "You are an agent in a text-based household environment. Each turn you see the OBJECTIVE, the latest "
    "OBSERVATION, the ADMISSIBLE COMMANDS, your PREVIOUS ACTIONS and your harness views: PLAN (your subgoals), "
    "RECALLED HINTS (where the objective's object is usually found) and the latest TRACK RESULT and RECALL RESULT.\n"
    "Each turn, do exactly one of these; every one costs one step of your budget:\n"
    "- an admissible command, copied exactly;\n"
    "- track <object>: what you have seen of an object or receptacle, updated every turn (track apple: each "
    "apple seen, which are in view, and the receptacles not searched yet, likeliest first; track fridge 1); "
    "track world: a summary of everything seen so far;\n"
    "- commit <subgoal>: add a subgoal to PLAN; commit <subgoal>: <status> sets its status "
    "(pending, active, done, failed, drop); commit plan: <a>; <b>; <c> replaces the plan;\n"
    "- recall <query>: look up experience, e.g. recall where: apple, recall how: heat, recall mistakes: drawer;\n"
    "- note <insight>: save a lesson for future episodes.\n"
    "Reply as: <think>your reasoning</think><action>one command or meta-action</action>"
)
# For small models trained from scratch: the same contract in one line (the
# full prompt's ~230 tokens would be ~40% of every SFT row; EvoHarness-RL's
# models read the full one).
COMPACT_SYSTEM_PROMPT = (
    "Household agent. Act with one admissible command or a meta-action (track, commit, recall, "
    "note). Reply as: <think>reason</think><action>command</action>"
)
FEEDBACK_CHARS = 200  # older PREVIOUS ACTIONS feedback is cut to this


@dataclass
class Lookup:
    """The latest ``track`` or ``recall``: its query, result text, the turn it
    was made, (recall only) the structured `Recall` a teacher can read, and
    (track only) the receptacle types that order its unsearched list
    (`search.search_order`'s ``prior_types`` / ``demote_types``)."""

    query: str
    text: str
    turn: int
    recall: Recall | None = None
    prior_types: tuple[str, ...] = ()
    demote_types: tuple[str, ...] = ()


def _short(text: str, n: int = FEEDBACK_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


class BPEHarness(Harness):
    """EvoHarness-RL's BPE harness for ALFWorld.

    Args:
        experience: the shared `ExperienceStore` (None: recall/note answer
            that there is no store and no hints are shown).
        history_window: previous (action, feedback) pairs shown.
        hints_k: where-to-find hints retrieved at reset (top-3).
        belief_capacity: relation edges in the belief (48).
        plan_capacity: subgoals in the plan (8).
        learn_locations: feed successful pickups (and the receptacle types
            searched before the objective's object was found) to the store.
        system_prompt: ``full`` (explains every section and meta-action) or
            ``compact`` (one line, for small from-scratch models).

    Attributes a scripted teacher reads: ``goal`` (`Goal`), ``belief``
    (`Belief`), ``progress`` (`Progress`), ``experience``, ``hints`` (the
    recalled `Entry` list), ``last_track`` / ``last_recall`` (`Lookup`).
    """

    name = "bpe"
    meta_verbs = META_VERBS

    def __init__(
        self,
        experience: ExperienceStore | None = None,
        history_window: int = 4,
        hints_k: int = 3,
        belief_capacity: int = BELIEF_CAPACITY,
        plan_capacity: int = PLAN_CAPACITY,
        learn_locations: bool = True,
        system_prompt: str = "full",
    ) -> None:
        if system_prompt not in ("full", "compact"):
            raise ValueError(f"system_prompt must be 'full' or 'compact', got {system_prompt!r}")
        self.system_prompt = SYSTEM_PROMPT if system_prompt == "full" else COMPACT_SYSTEM_PROMPT
        self.experience = experience
        self.history_window = history_window
        self.hints_k = hints_k
        self.belief_capacity = belief_capacity
        self.plan_capacity = plan_capacity
        self.learn_locations = learn_locations
        self.goal = Goal("")
        self.belief = Belief(belief_capacity)
        self.progress = Progress(plan_capacity)
        self.hints: list[Entry] = []
        self.last_track: Lookup | None = None
        self.last_recall: Lookup | None = None
        self.history: list[tuple[str, str]] = []
        self.turn = 0
        self.task: TaskSpec | None = None
        self._obs = ""
        self._admissible: list[str] = []
        self._found_goal = False
        self._searched_types: set[str] = set()
        self._goal_seen_types: set[str] = set()
        self._hints_text = ""

    # ----- episode life cycle ------------------------------------------------
    def reset(self, task: TaskSpec, first: StepResult) -> None:
        self.task = task
        self.goal = parse_goal(first.goal or first.observation)
        self.belief = Belief(self.belief_capacity, focus=self.goal.keywords())
        self.belief.observe_scene(first.observation)
        self.progress = Progress(self.plan_capacity)
        self.history, self.turn = [], 0
        self.last_track = self.last_recall = None
        self._obs = first.observation
        self._admissible = list(first.admissible_commands)
        self._found_goal = False
        self._searched_types, self._goal_seen_types = set(), set()
        self.hints = []
        if self.experience is not None and self.goal.obj and self.hints_k > 0:
            self.hints = self.experience.where_to_find(self.goal.obj, k=self.hints_k)
        # Rendered once: the view must not change when the store learns mid-episode.
        if self.experience is None:
            self._hints_text = "(no experience store)"
        elif self.hints:
            self._hints_text = "\n".join(f"- {e.render()}" for e in self.hints)
        else:
            self._hints_text = (
                f"(no prior for {self.goal.obj or 'this objective'}; search receptacles you have not searched)"
            )

    @property
    def admissible(self) -> list[str]:
        return self._admissible

    def after_env_step(self, action: ParsedAction, result: StepResult) -> None:
        ev = self.belief.update(action.command, result.observation)
        if ev.contents_seen:
            rec, objs = ev.contents_seen
            self._searched_types.add(type_of(rec))
            if any(type_of(o) == self.goal.obj for o in objs):
                self._goal_seen_types.add(type_of(rec))
        if ev.picked and self.experience is not None and self.learn_locations:
            obj, rec = ev.picked
            if rec:
                self.experience.record_pickup(type_of(obj), type_of(rec))
            if type_of(obj) == self.goal.obj and not self._found_goal:
                self._found_goal = True
                for rtype in sorted(self._searched_types - self._goal_seen_types - {type_of(rec)}):
                    self.experience.record_miss(self.goal.obj, rtype)
        self.history.append((action.command, result.observation))
        self._obs = result.observation
        self._admissible = list(result.admissible_commands)
        self.turn += 1

    def run_meta(self, action: ParsedAction) -> str:
        verb, arg = action.command, action.argument.strip()
        text = f"{verb} {arg}".strip()
        if verb == "track":
            self.last_track = Lookup(arg or "world", "", self.turn, None, *self._search_priors(arg))
            result = self.last_track.text = self._track_text(self.last_track)
            shown = "(see TRACK RESULT)"
        elif verb == "commit":
            result = shown = self.progress.commit(arg)
        elif verb == "recall":
            if self.experience is None:
                rec, result = None, "No experience store in this run."
            else:
                rec = self.experience.recall(arg)
                result = rec.text
            self.last_recall = Lookup(arg, result, self.turn, rec)
            shown = "(see RECALL RESULT)"
        elif verb == "note":
            if self.experience is None:
                result = "No experience store in this run; note ignored."
            else:
                result = self.experience.note(arg, task_type=self.goal.task_type)
            shown = result
        else:
            result = shown = f"Unknown meta-action '{verb}'."
        self.history.append((text, shown))
        self.turn += 1
        return result

    def after_invalid(self, action: ParsedAction) -> None:
        self.history.append((action.command or "(empty)", f"Invalid action: {action.error}"))
        self.turn += 1

    def _search_priors(self, query: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Receptacle types that order a ``track <query>``'s unsearched list: the
        objective's object -> RECALLED HINTS (its target last in pick tasks, where
        ALFWorld never starts it); another object -> the store's priors for it, read
        once here (the order must not change when the store learns mid-episode)."""
        q = track_subject(query)
        if q in (self.goal.obj, f"{self.goal.obj}s") and self.goal.obj:
            last = (self.goal.target,) if self.goal.target and not self.goal.transform else ()
            return tuple(e.recep for e in self.hints), last
        if self.experience is None or not q or q[-1].isdigit() or self.hints_k <= 0:
            return (), ()
        return tuple(e.recep for e in self.experience.where_to_find(q, k=self.hints_k, count_use=False)), ()

    def _track_text(self, lookup: Lookup) -> str:
        """A track's result from the belief as it is now, unsearched receptacles likeliest first."""
        scene = self.belief.receptacles
        return self.belief.track(
            lookup.query,
            order=lambda todo: search_order(todo, lookup.prior_types, lookup.demote_types, counts_from=scene),
        )

    # ----- rendering ---------------------------------------------------------
    def _ago(self, turn: int) -> str:
        n = self.turn - turn
        return "last step" if n <= 1 else f"{n} steps ago"

    def views(self) -> dict[str, str]:
        out = {"PLAN": self.progress.render(), "RECALLED HINTS": self._hints_text}
        if self.last_track is not None:  # live: the belief as it is now, not when the track was made
            out["TRACK RESULT"] = f"(track {self.last_track.query}, live)\n{self._track_text(self.last_track)}"
        if self.last_recall is not None:
            out["RECALL RESULT"] = (
                f"(recall {self.last_recall.query}, {self._ago(self.last_recall.turn)})\n{self.last_recall.text}"
            )
        return out

    def format_history(self) -> str:
        """The last ``history_window`` entries, older feedback shortened, the newest in full.

        Rendering with window w-1 equals dropping the oldest entry of the
        window-w rendering (`prompt.drop_oldest_history` relies on it).
        """
        recent = self.history[-self.history_window :] if self.history_window > 0 else []
        entries = [history_entry(a, _short(f)) for a, f in recent[:-1]]
        entries += [history_entry(a, f) for a, f in recent[-1:]]
        return render_history(entries)

    def messages(self) -> list[dict[str, str]]:
        sections = [
            f"OBJECTIVE: {self.goal.text}",
            f"OBSERVATION: {self._obs}",
            f"ADMISSIBLE COMMANDS: {', '.join(self._admissible)}",
            f"{HISTORY_HEADER}\n{self.format_history()}",
        ]
        sections += [f"{name}:\n{text}" for name, text in self.views().items()]
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": "\n\n".join(sections)}]
