"""What Fast Downward's translator decides about each ground action.

The stock engine's set of admissible actions and the effect atoms it reports
come out of ``fast_downward.pddl2sas`` (translator options: no invariant
synthesis, one binary variable per fluent atom). Two parts of it are visible
in the text and the facts, and are reproduced here:

1. **Relaxed reachability** (`relaxed_model`): the translator grounds only the
   atoms reachable when negative conditions are ignored. An effect that
   deletes an atom outside that set is dropped, a negative condition on one is
   dropped, and a positive condition on one makes the operator impossible.
   Computed once per game by semi-naive forward chaining over the domain's
   action copies (the same Datalog program FD builds).

2. **Operator translation** (`translate_op`, FD's ``translate_strips_operator``
   for binary variables): preconditions on fluent atoms become ``var = value``
   conditions; add effects win over unconditional deletes of the same atom; a
   delete becomes ``var := false`` guarded by "the atom holds and no add effect
   fires"; an effect that cannot change its variable (it equals the
   precondition's value) is dropped; conditions implied by the precondition
   are dropped, contradicted ones drop the effect; FD's "stupid effect
   condition" pruning applies; an operator left with no effect is a **no-op
   and does not exist** — which is why ``go to`` a receptacle at the location
   the agent already stands at is never admissible. The surviving effects,
   sorted as FD writes them, are what the engine reports after the operator
   applies (see ``facts.py`` for how the text view uses them).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from evoharness.envs.alfworld.fast.facts import FactStore
from evoharness.envs.alfworld.fast.joins import JoinSpec
from evoharness.envs.alfworld.fast.pddl import ActionCopy, Domain, Literal

# ---------------------------------------------------------------- relaxed exploration


@dataclass
class RelaxedRule:
    """Body (positive literals of an action copy and of an effect condition) -> heads.

    ``specs[None]`` evaluates the whole body; ``specs[i]`` takes body literal
    ``i`` from the delta of the last round (semi-naive evaluation).
    """

    specs: dict
    seed_preds: dict[int, str]


def build_relaxed_rules(domain: Domain) -> list[RelaxedRule]:
    rules: list[RelaxedRule] = []
    fluent = domain.fluent_predicates
    for copy in domain.copies:
        groups: dict[tuple, list[Literal]] = {}
        for eff in copy.effects:
            if eff.literal.negated:
                continue
            cond = tuple(lit for lit in eff.condition if not lit.negated)
            groups.setdefault((tuple(eff.params), cond), []).append(eff.literal)
        for (eparams, cond), heads in groups.items():
            params = tuple(copy.params) + eparams
            body = tuple(lit for lit in copy.precondition if not lit.negated) + cond
            specs = {None: JoinSpec(params, body, (), relaxed=True, heads=tuple(heads))}
            seed_preds = {}
            for i, lit in enumerate(body):
                if lit.pred in fluent:
                    specs[i] = JoinSpec(params, body, (), relaxed=True, seed=i, heads=tuple(heads))
                    seed_preds[i] = lit.pred
            rules.append(RelaxedRule(specs, seed_preds))
    return rules


def relaxed_model(rules: list[RelaxedRule], compiled, static: FactStore, init_fluent: FactStore, types) -> FactStore:
    """All fluent atoms reachable when negative conditions are ignored.

    ``compiled(spec)`` returns the compiled join of a rule's spec.
    """
    model = init_fluent.clone()
    new: list[tuple] = []
    for rule in rules:
        new.extend(compiled(rule.specs[None])(model, static, None, types))
    while True:
        delta = FactStore()
        by_pred = model.by_pred
        for atom in new:
            s = by_pred.get(atom[0])
            if s is None or atom not in s:
                model.add(atom)
                delta.add(atom)
        if not len(delta):
            return model
        new = []
        for rule in rules:
            for i, pred in rule.seed_preds.items():
                if delta.by_pred.get(pred):
                    new.extend(compiled(rule.specs[i])(model, static, delta, types))


# ---------------------------------------------------------------- operator translation


@dataclass
class Op:
    """One ground operator as the stock engine sees it.

    Attributes:
        name: (action name, external arguments): FD's operator name.
        copy: the action copy; binding: its parameter values.
        mapping: grammar placeholders -> variables, ((name, type), (object, type)).
        effects: FD's sorted effect list: (atom, new value 0=true/1=false,
            conditions), translated when the operator is first applied.
    """

    name: tuple
    copy: ActionCopy
    binding: tuple
    mapping: tuple
    effects: tuple | None = None
    command: str | None = None  # cached when the template reads only static facts


def make_op(copy: ActionCopy, binding: tuple, effects: tuple | None = None) -> Op:
    n = copy.n_external
    name = (copy.name,) + tuple(binding[:n])
    mapping = tuple(((v[1:], t), (b, t)) for (v, t), b in zip(copy.params[:n], binding[:n]))
    return Op(name, copy, binding, mapping, effects)


def surely_kept(copy: ActionCopy, binding: tuple) -> bool:
    """Fast sufficient test that FD keeps an operator applicable in a reachable
    state: an unconditional add effect on an atom its precondition does not
    already require true survives the translation, so it is no no-op."""
    plan = copy.memo.get("quick")
    if plan is None:
        pos = {v: i for i, (v, _) in enumerate(copy.params)}

        def ref(args):
            return tuple((pos[a], None) if a in pos else (None, a) for a in args)

        adds = tuple(
            (e.literal.pred, ref(e.literal.args))
            for e in copy.effects
            if not e.literal.negated and not e.params and not e.condition
        )
        pres = tuple(
            (lit.pred, ref(lit.args))
            for lit in copy.precondition
            if not lit.negated and lit.pred != "=" and not lit.pred.startswith("type@")
        )
        plan = copy.memo["quick"] = (adds, pres)
    adds, pres = plan
    if not adds:
        return False

    def ground(pred, refs):
        return (pred,) + tuple(binding[i] if i is not None else c for i, c in refs)

    required = {ground(p, r) for p, r in pres}
    return any(ground(p, r) not in required for p, r in adds)


class _Impossible(Exception):
    pass


def _instantiate(lit: Literal, var: dict, is_fluent, init: set, types, out: list) -> None:
    """FD's Literal.instantiate: fluent literals go to `out`; static ones are checked."""
    args = tuple(var.get(a, a) for a in lit.args)
    if lit.pred == "=":
        if (args[0] == args[1]) == lit.negated:
            raise _Impossible
        return
    if lit.pred.startswith("type@"):
        if (args[0] in types[lit.pred[5:]]) == lit.negated:
            raise _Impossible
        return
    atom = (lit.pred,) + args
    if is_fluent(atom):
        out.append((atom, lit.negated))
    elif (atom in init) != lit.negated:
        return
    else:
        raise _Impossible


def _conditions(lits) -> dict | None:
    """FD's translate_strips_conditions for binary variables (None: contradictory)."""
    cond: dict = {}
    for atom, neg in lits:
        if not neg:
            if cond.get(atom, 0) != 0:
                return None
            cond[atom] = 0
    for atom, neg in lits:
        if neg:
            if atom in cond and cond[atom] != 1:
                return None
            cond[atom] = 1
    return cond


def _negate_and_translate(conds_list: list[list]) -> list[dict] | None:
    if any(not c for c in conds_list):
        return None
    out = []
    for combo in product(*conds_list):
        t = _conditions([(a, not n) for a, n in combo])
        if t is not None:
            out.append(t)
    return out or None


def _prune_stupid(atom, val: int, conds: list[list], effects_on_var: dict) -> None:
    if conds == [[]]:
        return
    dual = (atom, 1 - val)
    if 1 - val in effects_on_var:
        return
    for c in conds:
        while dual in c:
            c.remove(dual)
        if not c:
            conds[:] = [[]]
            break


def translate_op(copy: ActionCopy, binding: tuple, is_fluent, init: set, types) -> tuple | None:
    """The effects of the SAS operator FD makes of `copy` grounded with
    `binding`, or None (impossible, contradictory or a no-op: then the stock
    engine never offers it)."""
    var = {v: b for (v, _), b in zip(copy.params, binding)}
    try:
        pre: list = []
        for lit in copy.precondition:
            _instantiate(lit, var, is_fluent, init, types, pre)
    except _Impossible:
        return None
    cond = _conditions(pre)
    if cond is None:
        return None
    effects: list = []
    for eff in copy.effects:
        groundings = [{}]
        if eff.params:
            groundings = [
                dict(zip((v for v, _ in eff.params), objs))
                for objs in product(*(sorted(types[t]) for _, t in eff.params))
            ]
        for extra in groundings:
            v2 = {**var, **extra} if extra else var
            econd: list = []
            try:
                for lit in eff.condition:
                    _instantiate(lit, v2, is_fluent, init, types, econd)
            except _Impossible:
                continue
            atom = (eff.literal.pred,) + tuple(v2.get(a, a) for a in eff.literal.args)
            if is_fluent(atom):
                effects.append((econd, atom, eff.literal.negated))
    if not effects:
        return None
    adds = [(c, a) for c, a, neg in effects if not neg]
    dels = [(c, a) for c, a, neg in effects if neg and (c, a) not in adds]

    by_var: dict = {}
    add_conds: dict = {}
    for c, a in adds:
        t = _conditions(c)
        if t is None:
            continue
        by_var.setdefault(a, {}).setdefault(0, []).append(t)
        add_conds.setdefault(a, []).append(c)
    del_by_var: dict = {}
    for c, a in dels:
        t = _conditions(c)
        if t is None:
            continue
        del_by_var.setdefault(a, []).append(t)
    for a, dconds in del_by_var.items():
        no_add = _negate_and_translate(add_conds.get(a, []))
        if no_add is None:
            continue
        for dc in dconds:
            if a in dc and dc[a] != 0:
                continue
            dc[a] = 0
            for na in no_add:
                new = dict(dc)
                ok = True
                for v, val in na.items():
                    if v in new and new[v] != val:
                        ok = False
                        break
                    new[v] = val
                if ok:
                    by_var.setdefault(a, {}).setdefault(1, []).append(new)

    prevail_and_pre = dict(cond)
    pre_post = set()
    for a, effs in by_var.items():
        orig_pre = cond.get(a, -1)
        for post, econds in effs.items():
            if orig_pre == post:
                continue
            lists = [sorted(c.items()) for c in econds]
            _prune_stupid(a, post, lists, effs)
            for ec in lists:
                filtered = []
                contra = False
                for v, val in ec:
                    if v in prevail_and_pre:
                        if prevail_and_pre[v] != val:
                            contra = True
                            break
                    else:
                        filtered.append((v, val))
                if not contra:
                    pre_post.add((a, post, tuple(filtered)))
    if not pre_post:
        return None
    return tuple(sorted(pre_post))
