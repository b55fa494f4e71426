"""The harness recipe a model was trained with, saved beside its weights (``harness_recipe.json``).

A model trained through the BPE harness acts well only under the prompt it was trained on: the
system prompt variant, the history window, the prompt token budget, constrained decoding, the
completion cap, the placing-command wording and the experience store. `rl` writes the recipe into
every model directory it exports, `sft` into its final model and the main job into its SFT and RL
models; `eval`, `serve`, `rl` and `sft` read it from ``--model-path`` and use it wherever the
command line and config file do not set a key (`recipe_overrides`), printing what they took.

SFT examples carry the part of the recipe their prompts were rendered with (`ExamplesRecipe`,
``<examples>.recipe.json``, written by `collect` and `distill`); `sft` completes it with its own
prompt budget and completion cap into the model's recipe.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any, Literal

from evoharness.config.base import Strict, parse_override
from evoharness.config.harness import HarnessConfig

RECIPE_FILE = "harness_recipe.json"
EXPERIENCE_FILE = "experience.json"


class ModelRecipe(Strict):
    """What a model's prompts and actions looked like in training (module docstring)."""

    # the harness (kind, system prompt variant, history window); its experience store is the model
    # directory's experience.json when the recipe was written with one
    harness: HarnessConfig
    max_prompt_tokens: int  # the prompt token budget the model was trained with
    max_new_tokens: int  # the completion cap of its training rollouts (tokens)
    constrained: bool  # trained acting through the action grammar
    wording: Literal["native", "put", "move"] = "native"  # the placing-command wording it played


class ExamplesRecipe(Strict):
    """The harness an SFT examples file was rendered with (``<examples>.recipe.json``)."""

    harness: HarnessConfig  # kind, system prompt variant, history window
    wording: Literal["native", "put", "move"] = "native"  # the placing-command wording played
    experience: str | None = None  # the experience store the prompts recalled from (a path), if any


def examples_recipe_path(examples: str | Path) -> Path:
    """``runs/traces/sft.jsonl`` -> ``runs/traces/sft.recipe.json``."""
    return Path(examples).with_suffix(".recipe.json")


def write_examples_recipe(examples: str | Path, recipe: ExamplesRecipe) -> Path:
    """Write `recipe` beside the examples file (atomically); the experience path is made absolute."""
    if recipe.experience:
        recipe = recipe.model_copy(update={"experience": str(Path(recipe.experience).resolve())})
    path = examples_recipe_path(examples)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(recipe.model_dump_json(indent=2))
    tmp.replace(path)
    return path


def read_examples_recipe(examples: str | Path) -> ExamplesRecipe | None:
    """The recipe beside an examples file, or None when it has none."""
    path = examples_recipe_path(examples)
    return ExamplesRecipe.model_validate_json(path.read_text()) if path.is_file() else None


def write_recipe(model_dir: str | Path, recipe: ModelRecipe, experience: str | Path | None = None) -> Path:
    """Write `recipe` into `model_dir` (and copy the `experience` store there unless it is already
    its ``experience.json``); returns the recipe file."""
    d = Path(model_dir)
    harness = recipe.harness.model_copy(update={"experience_path": None})
    if experience is not None:
        target = d / EXPERIENCE_FILE
        if Path(experience).resolve() != target.resolve():
            shutil.copyfile(experience, target)
        harness = harness.model_copy(update={"experience_path": EXPERIENCE_FILE})
    path = d / RECIPE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(recipe.model_copy(update={"harness": harness}).model_dump_json(indent=2))
    tmp.replace(path)
    return path


def read_recipe(model_dir: str | Path | None) -> ModelRecipe | None:
    """The recipe saved in `model_dir` (its experience path made absolute), or None."""
    if not model_dir or not (Path(model_dir) / RECIPE_FILE).is_file():
        return None
    r = ModelRecipe.model_validate_json((Path(model_dir) / RECIPE_FILE).read_text())
    if r.harness.experience_path:
        r.harness.experience_path = str((Path(model_dir) / r.harness.experience_path).resolve())
    return r


def explicit_keys(config: str | Path | None, overrides: list[str]) -> set[str]:
    """The dotted keys a config file and ``--set`` overrides name (each section's keys, flattened)."""

    def flat(d: dict[str, Any], prefix: str = "") -> set[str]:
        out: set[str] = set()
        for k, v in d.items():
            out |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
        return out

    keys = flat(tomllib.loads(Path(config).read_text())) if config and Path(config).is_file() else set()
    return keys | {".".join(parse_override(o)[0]) for o in overrides}


def recipe_overrides(recipe: ModelRecipe, mapping: dict[str, str], explicit: set[str]) -> list[str]:
    """``--set`` items that apply `recipe` to the keys of a command's config the user left unset.

    Args:
        recipe: the model's recipe.
        mapping: recipe field (dotted: ``harness.system_prompt``) -> the command's config key.
        explicit: keys the user set (`explicit_keys`); a section named whole counts for its keys.
    """
    data = json.loads(recipe.model_dump_json())
    out = []
    for field, key in mapping.items():
        value: Any = data
        for part in field.split("."):
            value = value[part]
        taken = key in explicit or any(key.startswith(f"{e}.") for e in explicit)
        if value is not None and not taken:
            out.append(f"{key}={json.dumps(value)}")
    return out


# recipe field -> EvalConfig key (evoharness eval --policy hf) / RLConfig key (evoharness rl) /
# SFTJobConfig key (evoharness sft: the budget a model trained further keeps)
EVAL_KEYS = {
    "harness.kind": "harness.kind",
    "harness.system_prompt": "harness.system_prompt",
    "harness.history_window": "harness.history_window",
    "harness.experience_path": "harness.experience_path",
    "max_prompt_tokens": "policy.max_prompt_tokens",
    "max_new_tokens": "policy.max_tokens",
    "constrained": "policy.constrained",
    "wording": "env.wording",
}
RL_KEYS = {
    "harness.kind": "harness.kind",
    "harness.system_prompt": "harness.system_prompt",
    "harness.history_window": "harness.history_window",
    "harness.experience_path": "harness.experience_path",
    "max_prompt_tokens": "max_prompt_tokens",
    "max_new_tokens": "max_new_tokens",
    "constrained": "constrained",
    "wording": "wording",
}
SFT_KEYS = {"max_prompt_tokens": "max_prompt_tokens"}
