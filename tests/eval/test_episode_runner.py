"""The episode runner on real games: step costs, garbage output, crashed environments."""

from evoharness.envs.alfworld import make_env
from evoharness.harness.react import ReActHarness
from evoharness.policies.base import Completion
from evoharness.policies.scripted import ExpertPolicy
from evoharness.rollout.episode import EpisodeSpec, run_episodes


class GarbagePolicy:
    name = "garbage"

    def act(self, requests):
        outs = ["", "!!!###", "x" * 20_000, "<think>" * 50, "<action>fly to the moon</action>"]
        return [Completion(text=outs[r.turn % len(outs)]) for r in requests]

    def close(self):
        pass


class CrashingEnv:
    """A real environment that crashes on its third step."""

    def __init__(self, task):
        self.inner = make_env(task)
        self.task = task
        self.n = 0

    def reset(self):
        return self.inner.reset()

    def step(self, action):
        self.n += 1
        if self.n == 3:
            raise RuntimeError("engine crashed")
        return self.inner.step(action)

    def facts(self):
        return self.inner.facts()

    def close(self):
        self.inner.close()


def test_garbage_ends_cleanly_with_invalid_counts(one_per_type):
    specs = [EpisodeSpec(one_per_type[0], "g#0"), EpisodeSpec(one_per_type[1], "g#1")]
    trajs = run_episodes(specs, make_env, ReActHarness, GarbagePolicy(), max_steps=7)
    for t in trajs:
        assert t.stop_reason == "max_steps" and not t.won
        assert t.steps == 7 and t.invalid_actions == 7 and t.env_steps == 0
        assert all(turn.feedback for turn in t.turns)
    # invalid feedback reaches the model next turn
    assert "Invalid action" in trajs[0].turns[1].messages[-1]["content"]


def test_crashed_env_is_a_failed_episode_and_others_go_on(one_per_type):
    specs = [EpisodeSpec(one_per_type[0], "crash#0"), EpisodeSpec(one_per_type[0], "ok#0")]
    made = []

    def factory(task):
        made.append(task)
        return CrashingEnv(task) if len(made) == 1 else make_env(task)

    trajs = run_episodes(specs, factory, ReActHarness, ExpertPolicy(), max_steps=50)
    crashed, ok = trajs
    assert crashed.stop_reason == "error" and "engine crashed" in crashed.error and not crashed.won
    assert crashed.steps == 3
    assert ok.won and ok.stop_reason == "won"


def test_unloadable_game_is_recorded(one_per_type, tmp_path):
    from dataclasses import replace

    bad = replace(one_per_type[0], path=str(tmp_path / "missing" / "game.tw-pddl"), task_id="missing")
    trajs = run_episodes(
        [EpisodeSpec(bad, "m#0"), EpisodeSpec(one_per_type[0], "k#0")],
        make_env,
        ReActHarness,
        ExpertPolicy(),
        max_steps=50,
    )
    assert trajs[0].stop_reason == "error" and trajs[0].steps == 0
    assert trajs[1].won
