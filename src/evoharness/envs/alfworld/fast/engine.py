"""One episode of a compiled game: state, admissible commands, steps, text.

Mirrors ``textworld.envs.pddl.PddlEnv`` step by step:

- admissible commands: every ground action copy whose precondition holds in the
  planner state and that Fast Downward keeps (see ``reach.py``); operators are
  de-duplicated by name (the first copy wins), each command is the action's
  template derived by the grammar, and the list is ``sorted(set(...))``;
- a command is looked up verbatim after ``strip()`` (case and spacing
  matter); anything else, ``help`` included, answers ``Nothing happens.`` and
  changes nothing;
- applying an operator: the planner state takes the effects whose conditions
  held before the step (the last one on an atom wins); the text facts take
  every listed effect (see ``facts.py``); the feedback is the action's feedback
  rule derived in the new text facts with the action's own bindings;
- ``won`` is the goal evaluated on the planner state after every step; the
  stock engine does not stop a won game, and neither does this one.
"""

from __future__ import annotations

from evoharness.envs.alfworld.fast.facts import FactStore, TextFacts
from evoharness.envs.alfworld.fast.game import Game
from evoharness.envs.alfworld.fast.reach import Op

NOTHING_HAPPENS = "Nothing happens."


class Episode:
    """The live state of one game (cheap to reset: the game is compiled once)."""

    __slots__ = ("game", "state", "text", "admissible", "_cmd_ops", "won")

    def __init__(self, game: Game) -> None:
        self.game = game
        self.state: FactStore = game.init_fluent
        self.text: TextFacts = game.text_init
        self.admissible: list[str] = []
        self._cmd_ops: dict[str, Op] = {}
        self.won = False

    def reset(self) -> str:
        g = self.game
        self.state = g.init_fluent.clone()
        self.text = g.text_init.clone_dynamic()
        if g.initial is None:
            intro = g.grammar.derive("#intro#", {}, self.text)
            self._refresh()
            g.initial = (intro, self.admissible, self._cmd_ops, self.won)
        intro, self.admissible, self._cmd_ops, self.won = g.initial
        return intro

    def step(self, command: str) -> str:
        op = self._cmd_ops.get(command.strip())
        if op is None:
            return NOTHING_HAPPENS  # the state is unchanged, and so are the commands
        self._apply(op)
        feedback = self.game.grammar.derive(self.game.actions[op.name[0]].feedback, dict(op.mapping), self.text)
        self._refresh()
        return feedback

    def _apply(self, op: Op) -> None:
        state, text = self.state, self.text
        fired = []
        effects = self.game.effects(op)
        for atom, post, conds in effects:
            if all((a in state) == (v == 0) for a, v in conds):
                fired.append((atom, post))
        for atom, post, _ in effects:
            if post == 0:
                text.discard("not_" + atom[0], atom[1:])
                text.add(atom[0], atom[1:])
            else:
                text.discard(atom[0], atom[1:])
                text.add("not_" + atom[0], atom[1:])
        for atom, post in fired:
            if post == 0:
                state.add(atom)
            else:
                state.discard(atom)

    def _refresh(self) -> None:
        """Recompute the admissible commands and the goal in the current state."""
        g = self.game
        cd = g.cd
        state, static, types = self.state, g.static, g.types
        cmd_ops: dict[str, Op] = {}
        seen: set = set()
        for copy, join in zip(cd.domain.copies, g.copy_joins):
            for binding in join(state, static, None, types):
                op = g.op(copy, binding)
                if op is None or op.name in seen:
                    continue
                seen.add(op.name)
                cmd = self._command(op)
                if cmd not in cmd_ops:
                    cmd_ops[cmd] = op
        self._cmd_ops = cmd_ops
        self.admissible = sorted(cmd_ops)
        self.won = any(j(state, static, None, types) for j in g.goal_joins)

    def _command(self, op: Op) -> str:
        if op.command is not None:
            return op.command
        g = self.game
        key = g.command_key(op)
        if key is not None:
            cmd = g.commands.get(key)
            if cmd is not None:
                op.command = cmd
                return cmd
        cmd = g.grammar.derive(g.actions[op.name[0]].template, dict(op.mapping), self.text)
        if "{" in cmd or "}" in cmd:
            cmd = cmd.format(**g.names)
        if key is not None:
            g.commands[key] = op.command = cmd
        return cmd

    def facts(self) -> list[tuple[str, tuple[str, ...]]]:
        """The text facts with demangled names (what ``TextWorldAlfredEnv.facts`` returns)."""
        names = self.game.names
        return [(p, tuple((names.get(a) or a).strip() for a in args)) for p, args in self.text.all()]
