"""`LocalHFPolicy`: a local Hugging Face causal LM served by the project's engine.

Each `act` call renders every request's messages with the model's chat
template (``add_generation_prompt=True``), fits it to ``max_prompt_tokens``
as SFT fits its examples (`harness.prompt.fit_prompt_ids`: oldest history
first, never the system prompt or OBJECTIVE), and decodes the whole batch at
once with an in-process engine (`engines.make_engine`: the static-KV engine for
Qwen/Llama-family models, else the module-forward `engines.hf.Engine`). Sampling
seeds are derived from (policy seed, episode id, turn), so an episode's samples
do not depend on which other episodes share the batch. With
``constrained=True`` the action is restricted to the request's admissible
commands and the harness's meta verbs (`engines.grammar.ActionGrammar`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from evoharness.config.harness import DEFAULT_MAX_PROMPT_TOKENS
from evoharness.engines import make_engine
from evoharness.engines.grammar import GenRequest
from evoharness.harness.base import META_VERBS
from evoharness.harness.prompt import fit_prompt_ids
from evoharness.models.init import load_model, load_tokenizer
from evoharness.policies.base import Completion, PolicyRequest


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with `n` torch CPU threads (None: unchanged)."""
    if not n:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def request_seed(seed: int, episode_id: str, turn: int) -> int:
    """A stable 63-bit seed for one (policy seed, episode, turn)."""
    digest = hashlib.sha256(f"{seed}:{episode_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


DEFAULT_ENGINE = "auto"  # `evoharness.engines.make_engine` name used when a policy is built without one


class LocalHFPolicy:
    """A local HF model directory as a `Policy` (token ids and behaviour log-probs included).

    Args:
        model_path: local HF causal-LM directory (weights, tokenizer, chat template).
        device / dtype: where and how to load it (dtype default: bf16 on CUDA, fp32 on CPU).
        temperature: 0 for greedy; log-probs are of ``softmax(logits / temperature)``.
        top_p: nucleus mass when sampling.
        max_new_tokens: completion cap (finish_reason ``length`` when hit).
        max_prompt_tokens: prompt budget; a longer prompt drops its oldest history
            first and never loses the system prompt or OBJECTIVE (`harness.prompt.fit_prompt_ids`);
            a fitted prompt is reported in ``Completion.extra["prompt_fit"]``.
        constrained: restrict the action to admissible commands / meta-actions.
        seed: base sampling seed.
        policy_version: version stamped on completions; `update_weights` bumps it.
        meta_verbs: meta verbs allowed under `constrained` when a request has no
            harness (else the harness's ``meta_verbs``).
        num_threads: torch CPU threads while decoding (None: leave as is). A
            tiny model's decode step is too small to split: with 2 threads and
            any other busy process, OpenMP spin-waiting made a step 30x slower
            here (456 ms vs 14.7 ms with 1 thread).
        engine: in-process decoder, ``auto`` / ``static`` / ``hf`` (`evoharness.engines.make_engine`;
            None: `DEFAULT_ENGINE`). ``static`` is the fast one; ``hf`` the module-forward engine.
            Or a built engine with the same interface that holds weights of its own
            (`engines.vllm_engine.VLLMEngine`): keeping them equal to `model`'s is the caller's job.
        chat_template_kwargs: arguments of the tokenizer's chat template (e.g. Qwen3's
            ``enable_thinking``).
    """

    name = "local"

    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        dtype: str | torch.dtype | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        constrained: bool = False,
        seed: int = 0,
        policy_version: int = 0,
        meta_verbs: tuple[str, ...] = META_VERBS,
        num_threads: int | None = None,
        engine: str | Any | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        self.model_path = str(model_path)
        self.model = load_model(model_path, device, dtype)
        self.tokenizer = load_tokenizer(model_path)
        is_name = engine is None or isinstance(engine, str)
        self.engine = make_engine(engine or DEFAULT_ENGINE, self.model, self.tokenizer) if is_name else engine
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.constrained, self.seed, self.policy_version = constrained, seed, policy_version
        self.meta_verbs = tuple(meta_verbs)
        self.num_threads = num_threads
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._fits: dict[tuple[str, int], dict[str, int]] = {}  # (episode, turn) -> PromptFit, until `act` reports it
        self._drop = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, *self.engine.stop_ids} - {
            self.tokenizer.convert_tokens_to_ids("</action>")
        }

    def _prompt_ids(self, req: PolicyRequest) -> list[int]:
        """The request's prompt ids within ``max_prompt_tokens``, fitted exactly as SFT
        fits its examples (one prompt recipe); a fit is kept for `act` to report.

        Raises:
            PromptTooLong: the system prompt and OBJECTIVE alone exceed the budget.
        """
        ids, fit = fit_prompt_ids(self.tokenizer, req.messages, self.max_prompt_tokens, self.chat_template_kwargs)
        if fit.fitted:
            self._fits[(req.episode_id, req.turn)] = fit.as_dict()
        return ids

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        """Answer the requests together; a request that cannot be rendered gets an error completion."""
        out: list[Completion | None] = [None] * len(requests)
        gen: list[tuple[int, GenRequest]] = []
        self._fits.clear()
        for i, req in enumerate(requests):
            try:
                grammar = None
                if self.constrained:
                    verbs = (
                        getattr(req.harness, "meta_verbs", self.meta_verbs)
                        if req.harness is not None
                        else self.meta_verbs
                    )
                    grammar = self.engine.grammar(list(req.admissible_commands), tuple(verbs))
                gen.append(
                    (i, GenRequest(self._prompt_ids(req), request_seed(self.seed, req.episode_id, req.turn), grammar))
                )
            except Exception as e:  # noqa: BLE001 -- one bad request must not sink the batch
                out[i] = Completion(
                    text="", finish_reason="error", error=f"{type(e).__name__}: {e}", policy_version=self.policy_version
                )
        try:
            with torch_threads(self.num_threads):
                results = self.engine.generate([g for _, g in gen], self.max_new_tokens, self.temperature, self.top_p)
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory: every pending request fails
            results = None
            err = f"{type(e).__name__}: {e}"
        for k, (i, g) in enumerate(gen):
            if results is None:
                out[i] = Completion(
                    text="",
                    prompt_token_ids=g.prompt_ids,
                    prompt_tokens=len(g.prompt_ids),
                    finish_reason="error",
                    error=err,
                    policy_version=self.policy_version,
                )
                continue
            r = results[k]
            text_ids = r.token_ids[:-1] if r.token_ids and r.token_ids[-1] in self._drop else r.token_ids
            # The constraint travels with the turn so a trainer can rebuild the masks the
            # behaviour log-probs were taken under (engine module docstring).
            constraint = g.grammar.constraint(self.max_new_tokens) if g.grammar is not None else None
            out[i] = Completion(
                text=self.tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                prompt_token_ids=g.prompt_ids,
                completion_token_ids=r.token_ids,
                logprobs=r.logprobs,
                policy_version=self.policy_version,
                prompt_tokens=len(g.prompt_ids),
                completion_tokens=len(r.token_ids),
                finish_reason=r.finish_reason,
                extra={
                    "seed": g.seed,
                    "constraint": constraint,
                    "prompt_fit": self._fits.pop((requests[i].episode_id, requests[i].turn), None),
                },
            )
        return out  # type: ignore[return-value]

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> int:
        """Load new weights in place (RL weight sync); returns the new policy version
        (`version`, or the old one + 1).

        A tied weight (``lm_head.weight`` sharing the embedding) may be left out.

        Raises:
            KeyError: unexpected keys, or missing keys that are not tied weights.
        """
        own = self.model.state_dict()
        res = self.model.load_state_dict(state_dict, strict=False)
        given = {own[k].data_ptr() for k in state_dict if k in own}
        missing = [k for k in res.missing_keys if own[k].data_ptr() not in given]
        if missing or res.unexpected_keys:
            raise KeyError(
                f"state_dict does not fit the model: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}"
            )
        self.policy_version = self.policy_version + 1 if version is None else version
        return self.policy_version

    def close(self) -> None:
        self.engine = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
