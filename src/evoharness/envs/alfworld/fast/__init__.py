"""The project's ALFWorld engine.

It reads the same ``game.tw-pddl`` files as the stock TextWorld PDDL engine
(PDDL domain, TWL2 grammar, PDDL problem) and reproduces it exactly: the same
observation text byte for byte, the same admissible commands in the same
order, the same ``won`` flag and the same facts, for any command sequence —
about 100-1000x faster (``benchmarks/bench_engine.py``). Nothing is specific to
the known games: the action schemas come from the domain, the commands and
texts from the grammar; Fast Downward's translation and textworld's text
generation are re-implemented, not special-cased
(``tests/envs/test_fast_engine_diff.py`` checks every ground operator against
Fast Downward's own output, and whole trajectories against the stock engine).

Modules, one job each: ``pddl`` (read domain/problem as Fast Downward does),
``reach`` (FD's relaxed reachability and operator translation), ``joins``
(compile conditions into enumerators), ``facts`` (indexed fact sets),
``grammar`` (TWL2 templates and text derivation), ``names`` (ALFWorld's
demangled names), ``game`` (compile and cache one game file), ``engine`` (one
episode), ``env`` (the `Env` interface), ``diff`` (the differential check).

Stock-engine oddities reproduced on purpose (each explained where it is done):

- ``examine X`` is only admissible for the object in hand: the domain's
  ``(exists (?l - location, ?r - receptacle) ...)`` gives ``?l`` the type
  ``location,`` (comma included) in Fast Downward, which no object has (pddl.py).
- ``go to`` the receptacle one stands at — or another one at the same
  location — is never admissible: FD drops that operator as a no-op (reach.py).
- The facts are textworld's copy of the state, updated with every effect atom
  an operator lists: they hold ``not_...`` facts (``not_inreceptacle``,
  ``not_holdsany``...) and after ``use`` a lamp ends with ``not_ison`` whatever
  the planner state says; the grammar reads these facts (facts.py).
- ``You arrive at loc 14.``: locations are named like objects; every article is
  "a" ("a apple"); numbers count down in sorted-id order ("a mug 2, a mug 1");
  names without ``_bar_`` keep a trailing space (names.py).
- Lists are sorted by the mangled ids; admissible commands are sorted as
  strings ("drawer 10" before "drawer 2"); ``help`` and anything not in the
  list, including a different case or inner spacing, gives "Nothing happens."
  (only leading/trailing spaces are stripped); a won game goes on (engine.py).
- TatSu's reading of the grammar: leading whitespace of a rule dropped, tabs
  before tokens dropped, quotes around terminals removed, and parsing stops
  silently at a character it cannot read (grammar.py).
- Of several operators with the same name the first wins, and of several with
  the same command the first in FD's successor order; in the ALFWorld data no
  name or command is produced twice, so the choice never shows.
"""

from evoharness.envs.alfworld.fast.env import FastAlfredEnv

__all__ = ["FastAlfredEnv"]
