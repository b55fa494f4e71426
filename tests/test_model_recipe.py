"""The harness recipe saved with a model applies only where the user set nothing: a config file's
key and a --set both win over it, a whole section named counts for its keys."""

from evoharness.config.base import load_config
from evoharness.config.eval import EvalConfig
from evoharness.config.harness import HarnessConfig
from evoharness.config.recipe import (
    EVAL_KEYS,
    ModelRecipe,
    explicit_keys,
    read_recipe,
    recipe_overrides,
    write_recipe,
)


def test_recipe_round_trip_and_precedence(tmp_path):
    store = tmp_path / "store.json"
    store.write_text("{}")
    model = tmp_path / "model"
    model.mkdir()
    recipe = ModelRecipe(
        harness=HarnessConfig(kind="bpe", system_prompt="compact", experience_path=str(store)),
        max_prompt_tokens=1024,
        max_new_tokens=48,
        constrained=True,
    )
    write_recipe(model, recipe, store)
    back = read_recipe(model)
    assert back.harness.experience_path == str((model / "experience.json").resolve())  # a copy travels along
    assert (model / "experience.json").read_text() == "{}"

    toml = tmp_path / "eval.toml"
    toml.write_text("[policy]\nmax_prompt_tokens = 2048\n")
    user = ["policy.kind=hf", f"policy.model_path={model}", "policy.constrained=false"]
    taken = recipe_overrides(back, EVAL_KEYS, explicit_keys(toml, user))
    cfg = load_config(EvalConfig, toml, taken + user)
    assert cfg.policy.max_prompt_tokens == 2048  # the file's key wins
    assert cfg.policy.constrained is False  # --set wins
    assert cfg.harness.system_prompt == "compact" and cfg.policy.max_tokens == 48  # the recipe fills the rest
    assert recipe_overrides(back, EVAL_KEYS, {"harness"}) == [
        t for t in recipe_overrides(back, EVAL_KEYS, set()) if not t.startswith("harness.")
    ]
    assert read_recipe(tmp_path) is None
