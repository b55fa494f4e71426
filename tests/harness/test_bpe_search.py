"""Search order: the harness lists unsearched receptacles likeliest first — on real games."""

from __future__ import annotations

from engines import pick_engine

from evoharness.envs.alfworld import make_env
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.harness.bpe.search import receptacle_type, search_order
from evoharness.policies.teacher import parse_prompt


def test_hints_first_big_closed_families_in_their_generic_place_demoted_last():
    receps = [f"cabinet {i}" for i in range(1, 7)] + [
        "countertop 2",
        "countertop 1",
        "fridge 1",
        "sinkbasin 1",
        "toaster 1",
    ]
    order = search_order(receps, ["cabinet", "fridge"])
    # six cabinets: the cabinet hint loses its priority; fridge (hinted) first, then open types, then closed
    assert order[0] == "fridge 1"
    assert order[1:3] == ["countertop 1", "countertop 2"]
    assert order.index("sinkbasin 1") < order.index("cabinet 1")
    assert order[-6:] == [f"cabinet {i}" for i in range(1, 7)]
    few = search_order(receps[:3] + ["countertop 1"], ["cabinet"])
    assert few[:3] == ["cabinet 1", "cabinet 2", "cabinet 3"]
    # the family's size is the scene's: three cabinets left of six keep their generic place
    assert search_order(receps[:3] + ["countertop 1"], ["cabinet"], counts_from=receps)[0] == "countertop 1"
    demoted = search_order(receps, ["countertop"], demote_types=["countertop"])
    assert demoted[-2:] == ["countertop 1", "countertop 2"] and sorted(demoted) == sorted(receps)
    assert search_order(["sinkbasin 1", "desk 1"], ["sink"])[0] == "sinkbasin 1"  # the store's short name


def _track(game, query: str, store: ExperienceStore | None = None) -> tuple[BPEHarness, tuple[str, str]]:
    env = make_env(game, engine=pick_engine(game))
    try:
        h = BPEHarness(store or ExperienceStore())
        h.reset(game, env.reset())
        h.run_meta(h.parse(f"<action>track {query}</action>"))
        return h, parse_prompt(h.messages()[1]["content"]).track
    finally:
        env.close()


def test_goal_object_track_lists_recalled_types_first_and_the_target_last(valid_seen):
    checked = 0
    for game in [g for g in valid_seen if g.task_type in ("pick_and_place_simple", "pick_two_obj_and_place")][:12]:
        h, (query, text) = _track(game, game.task_id.split("-")[1].lower())
        assert query == h.goal.obj
        listed = text.split("Unsearched (", 1)[1].split("): ", 1)[1].split("\n", 1)[0].rstrip(".").split(", ")
        assert sorted(listed) == sorted(h.belief.receptacles)  # nothing searched yet: every receptacle, once
        types = [receptacle_type(r) for r in listed]
        hinted = [
            receptacle_type(e.recep)
            for e in h.hints
            if receptacle_type(e.recep) in types
            and receptacle_type(e.recep) not in ("cabinet", "drawer", h.goal.target)
        ]
        # the hinted open types lead, in hint order
        assert [t for t in dict.fromkeys(types)][: len(hinted)] == hinted, (game.task_id, hinted, types)
        if h.goal.target in types:  # ALFWorld never starts a pick task's object in its target: last
            assert types[-types.count(h.goal.target) :] == [h.goal.target] * types.count(h.goal.target)
        checked += 1
    assert checked == 12


def test_a_lamp_track_is_ordered_by_the_stores_priors_for_the_lamp(valid_seen):
    game = next(g for g in valid_seen if g.task_type == "look_at_obj_in_light")
    h, (_, natural) = _track(game, "desklamp")  # the seed store knows no lamp prior: the fixed prior alone
    listed = natural.split("): ", 1)[1].split("\n", 1)[0].rstrip(".").split(", ")
    assert listed == search_order(h.belief.receptacles)
    # a prior learnt for the lamp (a consolidated note) moves its type to the front; big
    # cabinet/drawer families keep their place (each visit costs go + open)
    late = next(receptacle_type(r) for r in reversed(listed) if receptacle_type(r) not in ("cabinet", "drawer"))
    store = ExperienceStore()
    store.record_pickup("desklamp", late)
    h, (_, text) = _track(game, "desklamp", store)
    first = text.split("): ", 1)[1].split("\n", 1)[0].rstrip(".").split(", ")[0]
    assert receptacle_type(first) == late and listed.index(first) > 0
