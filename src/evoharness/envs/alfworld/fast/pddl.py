"""PDDL parsing and normalisation, as Fast Downward's translator reads the game files.

The stock engine hands the game's PDDL to Fast Downward's Python translator
(``fast_downward.pddl2sas``); every visible behaviour follows from how that
translator reads the text, so this module reads it the same way:

- tokens: ``;`` starts a comment, ``(``/``)`` are tokens, a ``?`` starts a new
  token, everything else splits on whitespace and is **lower-cased** (object
  names in facts are therefore lower case, e.g. ``desk_bar__plus_02...``);
- typed lists: ``a b - t`` gives ``a`` and ``b`` the type ``t``; the type is the
  next whitespace token verbatim. Oddity matched: the ALFWorld domain writes
  ``(exists (?l - location, ?r - receptacle) ...)`` so ``?l`` gets the type
  ``location,`` which no object has: that disjunct of ``examineObject`` (look
  at an object lying in the receptacle in front of you) can never fire, and
  ``examine X`` is only admissible for the held object;
- every declared type without a parent derives from ``object``, and ``object``
  is the root (a ``?o - object`` parameter accepts agents and locations too);
- conditions are put in negation normal form, then in disjunctive normal form;
  each disjunct becomes one *copy* of the action whose existential variables
  are extra, unnamed parameters (Fast Downward's ``split_disjunctions`` and
  ``eliminate_existential_quantifiers``); effects are flattened into
  ``(forall-params, condition literals, literal)`` with add-after-delete;
- the goal is a condition like any other (a list of conjunctive disjuncts).

Only what the ALFWorld domain and problems use needs to work, but nothing here
knows ALFWorld: a domain with other actions or predicates is read the same way.
Universal quantifiers in conditions are not supported (Fast Downward compiles
them into axioms; no ALFWorld game has one) and raise ``PddlError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class PddlError(ValueError):
    """The PDDL text uses a construct this reader does not support, or is malformed."""


# ---------------------------------------------------------------- tokens / lists


_COMMENT = re.compile(r";[^\n]*")
_TOKEN = re.compile(r"[()]|\?[^\s()?]*|[^\s()?]+")


def parse_nested(text: str) -> list:
    """Fast Downward's ``lisp_parser``: the text as nested lists of lower-case tokens."""
    tokens = _TOKEN.findall(_COMMENT.sub("", text).lower())
    if not tokens or tokens[0] != "(":
        raise PddlError("PDDL text must start with '('")
    stack: list[list] = [[]]
    for tok in tokens[1:]:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                # closing the outermost list: anything after it is an error
                done = stack.pop()
                stack = [done]
                break
            inner = stack.pop()
            stack[-1].append(inner)
        else:
            stack[-1].append(tok)
    else:
        raise PddlError("missing ')' in PDDL text")
    return stack[0]


def typed_list(items: list, default: str = "object") -> list[tuple[str, str]]:
    """``[a, b, -, t, c]`` -> ``[(a, t), (b, t), (c, default)]`` (FD's ``parse_typed_list``)."""
    out: list[tuple[str, str]] = []
    items = list(items)
    while items:
        try:
            sep = items.index("-")
        except ValueError:
            out.extend((x, default) for x in items)
            break
        typ = items[sep + 1]
        out.extend((x, typ) for x in items[:sep])
        items = items[sep + 2 :]
    return out


# ---------------------------------------------------------------- formulas

# A literal is (predicate, args, negated); args are variable names (``?x``) or
# object names. Formulas before normalisation are tuples:
#   ("lit", literal) | ("and", [f]) | ("or", [f]) | ("exists", params, f)


@dataclass(frozen=True)
class Literal:
    pred: str
    args: tuple[str, ...]
    negated: bool = False

    def negate(self) -> Literal:
        return Literal(self.pred, self.args, not self.negated)


def _parse_condition(alist: list, negated: bool, preds: dict[str, int], types: dict[str, str | None]):
    """NNF on the fly, as FD's ``parse_condition_aux``."""
    if not alist:
        return ("and", [])
    tag = alist[0]
    if tag == "not":
        if len(alist) != 2:
            raise PddlError(f"'not' takes one argument: {alist}")
        return _parse_condition(alist[1], not negated, preds, types)
    if tag in ("and", "or", "imply"):
        args = alist[1:]
        if tag == "imply":
            parts = [
                _parse_condition(args[0], not negated, preds, types),
                _parse_condition(args[1], negated, preds, types),
            ]
            tag = "or"
        else:
            parts = [_parse_condition(a, negated, preds, types) for a in args]
        conj = (tag == "and") != negated
        return ("and" if conj else "or", parts)
    if tag in ("exists", "forall"):
        params = typed_list(alist[1])
        if len(alist) != 3:
            raise PddlError(f"quantifier takes one formula: {alist}")
        body = _parse_condition(alist[2], negated, preds, types)
        existential = (tag == "exists") != negated
        if not existential:
            raise PddlError("universal quantifiers in conditions are not supported")
        return ("exists", params, body)
    # a literal
    name = tag
    if name not in preds:
        if name in types:
            name = "type@" + name
        else:
            raise PddlError(f"undeclared predicate: {tag}")
    return ("lit", Literal(name, tuple(alist[1:]), negated))


def _rename(formula, renames: dict[str, str]):
    kind = formula[0]
    if kind == "lit":
        lit = formula[1]
        return ("lit", Literal(lit.pred, tuple(renames.get(a, a) for a in lit.args), lit.negated))
    if kind in ("and", "or"):
        return (kind, [_rename(f, renames) for f in formula[1]])
    return ("exists", [(renames.get(n, n), t) for n, t in formula[1]], _rename(formula[2], renames))


def _uniquify(formula, taken: set[str]):
    """FD's ``uniquify_variables``: a quantified variable that clashes with a
    name already in scope is renamed ``?x1``, ``?x2``, ..."""
    kind = formula[0]
    if kind == "lit":
        return formula
    if kind in ("and", "or"):
        return (kind, [_uniquify(f, taken) for f in formula[1]])
    params, body = formula[1], formula[2]
    renames: dict[str, str] = {}
    new_params = []
    for name, typ in params:
        if name in taken:
            i = 1
            while f"{name}{i}" in taken:
                i += 1
            renames[name] = f"{name}{i}"
            name = f"{name}{i}"
        taken.add(name)
        new_params.append((name, typ))
    if renames:
        body = _rename(body, renames)
    return ("exists", new_params, _uniquify(body, taken))


def to_dnf(formula) -> list[tuple[list[tuple[str, str]], list[Literal]]]:
    """Disjunctive normal form: a list of (existential params, literals)."""
    kind = formula[0]
    if kind == "lit":
        return [([], [formula[1]])]
    if kind == "or":
        out = []
        for f in formula[1]:
            out.extend(to_dnf(f))
        return out
    if kind == "exists":
        return [(list(formula[1]) + p, lits) for p, lits in to_dnf(formula[2])]
    # and: distribute
    result: list[tuple[list, list]] = [([], [])]
    for f in formula[1]:
        parts = to_dnf(f)
        result = [(p1 + p2, l1 + l2) for p1, l1 in result for p2, l2 in parts]
    return result


# ---------------------------------------------------------------- domain


@dataclass
class Effect:
    """One ground-able effect: for all `params`, when `condition` holds, `literal`."""

    params: list[tuple[str, str]]
    condition: list[Literal]
    literal: Literal


@dataclass
class ActionCopy:
    """One disjunct of an action's precondition (FD splits actions at disjunctions).

    ``params[:n_external]`` are the action's own parameters (they name the
    operator and the command); the rest are the disjunct's existential variables.
    """

    name: str
    params: list[tuple[str, str]]
    n_external: int
    precondition: list[Literal]
    effects: list[Effect]
    index: int = 0  # position among all copies (FD's task.actions order)
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # derived data (reach.py)


@dataclass
class Domain:
    name: str
    types: dict[str, str | None]  # type -> declared parent (None for the root "object")
    supertypes: dict[str, list[str]]
    predicates: dict[str, int]
    copies: list[ActionCopy]
    fluent_predicates: set[str] = field(default_factory=set)
    constants: list[tuple[str, str]] = field(default_factory=list)


def _parse_effect(alist: list, params: list, cond: list, out: list, preds: dict[str, int]) -> None:
    if not alist:
        return
    tag = alist[0]
    if tag == "and":
        for a in alist[1:]:
            _parse_effect(a, params, cond, out, preds)
    elif tag == "forall":
        _parse_effect(alist[2], params + typed_list(alist[1]), cond, out, preds)
    elif tag == "when":
        c = _parse_condition(alist[1], False, preds, {})
        dnf = to_dnf(c)
        # FD splits a disjunctive effect condition into several effects; an
        # existential one becomes extra forall parameters.
        for eparams, lits in dnf:
            _parse_effect(alist[2], params + eparams, cond + lits, out, preds)
    elif tag in ("increase", "decrease", "assign", "scale-up", "scale-down"):
        return  # action costs: no effect on the state
    else:
        negated = False
        if tag == "not":
            alist = alist[1]
            negated = True
        if alist[0] not in preds:
            raise PddlError(f"undeclared predicate in effect: {alist[0]}")
        lit = Literal(alist[0], tuple(alist[1:]), negated)
        eff = Effect(list(params), list(cond), lit)
        contra = Effect(list(params), list(cond), lit.negate())
        if contra in out:
            # add-after-delete: keep the positive effect
            if contra.literal.negated:
                out.remove(contra)
                out.append(eff)
        else:
            out.append(eff)


def _set_supertypes(declared: list[tuple[str, str | None]]) -> dict[str, list[str]]:
    parent: dict[str, str | None] = {}
    for name, base in declared:
        parent[name] = base
    sup: dict[str, list[str]] = {}
    for name in parent:
        chain, seen, cur = [], {name}, parent.get(name)
        while cur is not None and cur not in seen:
            chain.append(cur)
            seen.add(cur)
            cur = parent.get(cur)
        if parent.get(name) == name:  # "object - object": FD lists it as its own supertype
            chain = [name]
        sup[name] = chain
    return sup


def parse_domain(text: str) -> Domain:
    tree = parse_nested(text)
    if tree[:1] != ["define"] or tree[1][0] != "domain":
        raise PddlError("not a PDDL domain")
    name = tree[1][1]
    declared: list[tuple[str, str | None]] = [("object", None)]
    constants: list[tuple[str, str]] = []
    preds: dict[str, int] = {}
    action_lists = []
    for opt in tree[2:]:
        tag = opt[0]
        if tag == ":types":
            declared.extend((n, t) for n, t in typed_list(opt[1:]))
        elif tag == ":predicates":
            for entry in opt[1:]:
                preds[entry[0]] = len(typed_list(entry[1:]))
            preds["="] = 2
        elif tag == ":constants":
            constants.extend(typed_list(opt[1:]))
        elif tag in (":requirements", ":functions"):
            pass
        elif tag == ":action":
            action_lists.append(opt)
        elif tag == ":derived":
            raise PddlError("derived predicates are not supported")
    types: dict[str, str | None] = {}
    for n, t in declared:
        types.setdefault(n, t)
    supertypes = _set_supertypes(declared)

    base_copies: list[ActionCopy] = []
    split_copies: list[ActionCopy] = []
    for alist in action_lists:
        it = iter(alist[1:])
        aname = next(it)
        params: list[tuple[str, str]] = []
        pre_formula = ("and", [])
        eff_list: list = []
        rest = list(it)
        i = 0
        while i < len(rest):
            key = rest[i]
            val = rest[i + 1] if i + 1 < len(rest) else []
            if key == ":parameters":
                params = typed_list(val)
            elif key == ":precondition":
                pre_formula = _parse_condition(val, False, preds, types) if val else ("and", [])
            elif key == ":effect":
                eff_list = val
            i += 2
        effects: list[Effect] = []
        _parse_effect(eff_list, [], [], effects, preds)
        if not effects:
            continue  # FD drops actions without effects
        pre_formula = _uniquify(pre_formula, {p for p, _ in params})
        dnf = to_dnf(pre_formula)
        copies = [ActionCopy(aname, params + ep, len(params), lits, effects) for ep, lits in dnf]
        if len(copies) == 1:
            base_copies.append(copies[0])
        else:
            split_copies.extend(copies)
    copies = base_copies + split_copies
    for i, c in enumerate(copies):
        c.index = i
    fluent = {e.literal.pred for c in copies for e in c.effects}
    return Domain(name, types, supertypes, preds, copies, fluent, constants)


# ---------------------------------------------------------------- problem


@dataclass
class Problem:
    name: str
    objects: dict[str, str]  # name -> type
    init: list[tuple[str, ...]]  # atoms as (pred, *args), without "=" and numeric fluents
    goal: list[tuple[list[tuple[str, str]], list[Literal]]]  # DNF


def parse_problem(text: str, domain: Domain) -> Problem:
    tree = parse_nested(text)
    if tree[:1] != ["define"] or tree[1][0] != "problem":
        raise PddlError("not a PDDL problem")
    objects: dict[str, str] = dict(domain.constants)
    init: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    goal = [([], [])]
    for opt in tree[2:]:
        tag = opt[0]
        if tag == ":objects":
            for n, t in typed_list(opt[1:]):
                objects[n] = t
        elif tag == ":init":
            for fact in opt[1:]:
                if fact[0] == "=":
                    continue  # numeric fluents (total-cost): no state fact
                if fact[0] == "not":
                    continue
                atom = tuple(fact)
                if atom not in seen:
                    seen.add(atom)
                    init.append(atom)
        elif tag == ":goal":
            formula = _parse_condition(opt[1], False, domain.predicates, domain.types)
            goal = to_dnf(_uniquify(formula, set()))
    return Problem(tree[1][1], objects, init, goal)
