"""Rollout engines behind one interface: ``generate(requests, max_new_tokens,
temperature, top_p) -> list[GenResult]`` plus ``grammar(commands, meta_verbs)``
and ``stop_ids``.

- ``static`` (`StaticEngine`, the default): lean Qwen3-family forward over a
  pre-allocated KV cache; the fast in-process engine.
- ``hf`` (`evoharness.engines.hf.Engine`): the module-forward engine with a
  transformers `DynamicCache`; runs any HF causal LM.

`make_engine` builds one by name; ``auto`` is ``static`` where the model is
supported, else ``hf``.
"""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evoharness.engines.decoder import StaticKVDecoder
from evoharness.engines.hf import Engine
from evoharness.engines.static import StaticEngine

ENGINES = ("auto", "static", "hf")


def make_engine(
    kind: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, stop_ids: list[int] | None = None
) -> StaticEngine | Engine:
    """An in-process engine by name (`ENGINES`).

    Raises:
        ValueError: an unknown name, or ``static`` for a model it cannot run.
    """
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r}; choose from {ENGINES}")
    if kind == "auto":
        kind = "hf" if StaticKVDecoder.unsupported(model) else "static"
    return StaticEngine(model, tokenizer, stop_ids) if kind == "static" else Engine(model, tokenizer, stop_ids)


__all__ = ["ENGINES", "Engine", "StaticEngine", "make_engine"]
