"""Helpers shared by the model tests: real ALFWorld text and a micro Qwen3 shape."""

from __future__ import annotations

import json
from pathlib import Path

REACT = Path(__file__).resolve().parents[3] / "shared/data/react/alfworld_3prompts.json"
# 2 layers, hidden 64: a real Qwen3 forward in milliseconds.
MICRO = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def alfworld_corpus() -> list[str]:
    """The ReAct ALFWorld prompts (../shared/data), or generated ALFWorld-like text when absent."""
    if REACT.is_file():
        return list(json.loads(REACT.read_text()).values())
    objs = ["apple", "fridge", "cabinet", "countertop", "microwave", "sinkbasin", "mug", "drawer"]
    return [
        f"You are in the middle of a room. You see a {o} {i}. > go to {o} {i}\nYou arrive at {o} {i}. "
        f"> take {p} {i} from {o} {i}\nYou pick up the {p} {i}."
        for i in range(1, 20)
        for o in objs
        for p in objs
    ]
