"""The action is the model's final answer (issue 10 fault 5), for both harnesses and every output shape.

Each shape is parsed by a real harness (ReAct and BPE) reset on a real bundled game, so the
admissible commands and meta verbs are the ones an episode sees.
"""

from __future__ import annotations

import pytest
from engines import pick_engine

from evoharness.envs.alfworld import make_env
from evoharness.harness.base import MULTIPLE_ACTIONS, split_completion
from evoharness.harness.bpe import BPEHarness
from evoharness.harness.react import ReActHarness


@pytest.fixture(scope="module", params=["react", "bpe"])
def harness(request, one_per_type):
    task = one_per_type[0]
    env = make_env(task, engine=pick_engine(task))
    first = env.reset()
    env.close()
    h = ReActHarness() if request.param == "react" else BPEHarness()
    h.reset(task, first)
    assert "look" in h.admissible and any(c.startswith("go to ") for c in h.admissible)
    return h


def goto(h) -> str:
    return next(c for c in h.admissible if c.startswith("go to "))


# (completion, expected action text or None for invalid); "{go}" is a real "go to …" command.
SHAPES = [
    # the format the harnesses ask for
    ("<think>plan</think><action>{go}</action>", "{go}"),
    # an action quoted inside the reasoning never counts (the example)
    ("<think>answer like <action>look</action></think><action>{go}</action>", "{go}"),
    ("<think>I could <action>look</action> or <action>inventory</action></think>\n<action>{go}</action>", "{go}"),
    # Qwen3's template may open <think> itself: text before a lone </think> is reasoning
    ("maybe <action>look</action> first</think><action>{go}</action>", "{go}"),
    # a hallucinated observation after the answer is ignored
    ("<think>go</think><action>{go}</action>\nObservation: You arrive at loc 3. Nothing here.", "{go}"),
    # ... but a second answer block is not a choice we can make for the model
    ("<think>go</think><action>{go}</action>\nObservation: ...\n<action>look</action>", None),
    ("<action>look</action><action>{go}</action>", None),
    # an unclosed final block (server stripped the stop string) is the answer
    ("<think>go</think><action>{go}", "{go}"),
    # still thinking when cut: no answer, whatever the reasoning quotes
    ("<think>I will <action>{go}</action> next", None),
    ("<think>I will go", None),
    # no tag format (a frozen model prompted ReAct-style)
    ("Thought: the desk\nAction: {go}", "{go}"),
    ("Thought: the desk\nAction: {go}\nObservation: You arrive.\nAction: look", None),
    ("> {go}", "{go}"),
    ("{go}", "{go}"),
    ("<think>x</think>\n{go}", "{go}"),
    ("", None),
    # shapes real Qwen3 / DeepSeek-style models and servers produce (review)
    ("<THINK>x <ACTION>look</ACTION></THINK>\n<Action>{go}</Action>", "{go}"),  # upper/mixed-case tags
    ("<think>x</think><action >{go}</ action>", "{go}"),  # spaces inside the brackets
    ("< think >I could <action>look</action></think ><action>{go}</action>", "{go}"),
    ("<think>\n\n</think>\n\n<action>\n  {go}  \n</action>\n", "{go}"),  # Qwen3 non-thinking: empty block
    ("<think>x</think>\n```\n<action>{go}</action>\n```", "{go}"),  # answer in a code fence
    ("<think>x</think><action>\n```text\n{go}\n```\n</action>", "{go}"),  # a fenced action
    ("<think>x</think><action>**{go}**</action>", "{go}"),  # markdown emphasis
    ("Thought: the desk\n**Action:** {go}", "{go}"),
    ("Thought: the desk\n**Action:**\n{go}\n", "{go}"),  # the command on the line below the marker
    ("```\n{go}\n```", "{go}"),  # bare answer in a code fence: the fence is not the last line
    # unclosed final block followed by a hallucinated observation: the block's first line is the answer
    ("<think>go</think><action>{go}\nObservation: You arrive at loc 3.\nlook", "{go}"),
    # tool-call JSON is not an accepted shape (the harness offers no tools): invalid, never guessed
    ('<think>x</think>\n<tool_call>\n{"name": "act", "arguments": {"command": "{go}"}}\n</tool_call>', None),
]


@pytest.mark.parametrize("shape,expected", SHAPES)
def test_each_output_shape(harness, shape, expected):
    go = goto(harness)
    completion = shape.replace("{go}", go)
    p = harness.parse(completion)
    if expected is None:
        assert p.kind == "invalid", (completion, p)
        assert p.error
    else:
        assert (p.kind, p.command) == ("env", expected.replace("{go}", go)), completion


def test_multiple_answers_are_invalid_and_say_why(harness):
    p = harness.parse(f"<action>look</action><action>{goto(harness)}</action>")
    assert p.kind == "invalid" and p.error == MULTIPLE_ACTIONS


def test_meta_action_quoted_in_reasoning_is_not_run(harness):
    go = goto(harness)
    p = harness.parse(f"<think>I could <action>track apple</action></think><action>{go}</action>")
    assert (p.kind, p.command) == ("env", go)
    p = harness.parse("<think>or <action>" + go + "</action></think><action>track world</action>")
    if harness.meta_verbs:
        assert (p.kind, p.command, p.argument) == ("meta", "track", "world")
    else:
        assert p.kind == "invalid"


def test_reasoning_is_kept_for_logs():
    think, action = split_completion("a</think><think>b</think><action>look</action><think>c")
    assert (think, action) == ("a\nb\nc", "look")
