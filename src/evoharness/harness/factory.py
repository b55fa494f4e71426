"""Build a harness from its config."""

from __future__ import annotations

from evoharness.config.harness import HarnessConfig


def make_harness(cfg: HarnessConfig, experience=None):
    """A fresh harness for one episode. `experience` (an `ExperienceStore`)
    overrides ``cfg.experience_path`` so that many episodes share one frozen store."""
    if cfg.kind == "react":
        from evoharness.harness.react import ReActHarness

        return ReActHarness(**_window(cfg))
    from evoharness.harness.bpe import BPEHarness

    if experience is None:
        experience = load_experience(cfg.experience_path)
    return BPEHarness(experience=experience, system_prompt=cfg.system_prompt, **_window(cfg))


def _window(cfg: HarnessConfig) -> dict:
    return {} if cfg.history_window is None else {"history_window": cfg.history_window}


_STORES: dict[str | None, object] = {}


def load_experience(path: str | None):
    """The experience store at `path` (cached per process; frozen for evaluation)."""
    from evoharness.harness.bpe import ExperienceStore

    if path not in _STORES:
        store = ExperienceStore.load(path) if path else ExperienceStore()
        store.freeze()
        _STORES[path] = store
    return _STORES[path]
