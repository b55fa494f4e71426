"""An SFT anchor for GRPO: each update also descends the SFT loss on teacher rows.

InstructGPT's PPO-ptx (Ouyang et al. 2022, Eq. 2) mixes the pre-training
log-likelihood into the RL objective so RL does not unlearn what it was not
rewarded for. Here the data is the SFT stage's own teacher examples: update
``j`` adds the gradient of

    coef · (1/N_j) Σ_{k ∈ batch j} −log π_θ(y_k | context)      (completion tokens only)

to the GRPO gradient before clipping (`train.grpo.grpo_step`'s ``anchor``).
``N_j`` is the batch's completion-token count; the batch is `sft.plan_epoch`'s
length-bucketed batch number ``j`` of the SFT examples (``batch_tokens`` padded
tokens), so a resumed run draws the same batches as an uninterrupted one. The
log-likelihood is of the raw model (T = 1, no action grammar), as SFT trained it.

On-policy teacher labels (``on_policy_coef`` > 0, off by default): the teacher
rows are states the teacher reached, not the ones the RL policy reaches when it
errs. The scripted teacher decides from the rendered message alone
(`policies.teacher`), so it can label the step's own rollout states, as DAgger
does (Ross et al. 2011, Alg. 3.1; `train.dagger`), here inside the RL update as
KDRL does with a model teacher (Xu et al. 2025, arXiv:2506.02208, "KDRL: Post-Training Reasoning
LLMs via Unified Knowledge Distillation and Reinforcement Learning"). `relabel_states`
keeps the states of lost episodes where the teacher would act in the world and the
policy did something else (``on_policy_filter = "lost_env"``; in a won episode
another action is another route, and a note where the teacher commits is usually
fine too), or every disagreement (``"all"``). Each update j also descends

    on_policy_coef · (1/M_j) Σ_{k ∈ D_j} −log π_θ(y*_k | s_k)      (the teacher's completion y*)

over its share D_j of those states (M_j completion tokens). Measured from the main
job's SFT model (`benchmarks/results/student/rl_levers_relabel.md`), it pulls the
policy away from SFT (KL 0.11-0.16 at step 8 instead of 0.02) and loses games
SFT won on valid_seen at weight 0.25 as at 1.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal


from evoharness.harness.base import META_VERBS, split_completion
from evoharness.train.dagger import state_key, teacher_label
from evoharness.train.sft import collate, completion_loss, load_examples, plan_epoch, tokenize_examples
from evoharness.config.sft import SFTAnchorConfig


def relabel_states(trajectories: list, seed: int, step: int, limit: int,
                   which: Literal["lost_env", "all"] = "lost_env") -> list[dict[str, Any]]:
    """The scripted teacher's labels at the lost episodes' states where it would take an environment
    action and the policy took another action (module docstring).

    Args:
        trajectories: one RL step's `rollout.records.Trajectory`s (BPE harness); replayed
            branch-prefix turns count (they are states the policy reached at screening).
        seed, step: key the sample when more than `limit` states qualify.
        limit: most states returned.
        which: ``all`` keeps every state where the two actions differ.

    Returns:
        SFT examples (``messages``, ``completion``: the teacher's whole completion), one per
        distinct prompt, in rollout order.

    Raises:
        ValueError: a prompt without the BPE harness's PLAN view (the teacher reads only those).
    """
    out, seen = [], set()
    for traj in trajectories:
        for turn in [] if traj.won and which == "lost_env" else traj.turns:
            if (key := state_key(turn.messages)) in seen:
                continue
            seen.add(key)
            label = teacher_label(turn.messages)
            action = split_completion(label)[1].strip()
            if split_completion(turn.completion)[1].strip() != action and \
                    (which == "all" or action.split(" ", 1)[0] not in META_VERBS):
                out.append({"messages": turn.messages, "completion": label})
    if len(out) > limit:
        keep = sorted(random.Random(f"relabel:{seed}:{step}").sample(range(len(out)), limit))
        out = [out[i] for i in keep]
    return out


class SFTAnchor:
    """The anchor batches of one run; `for_step` gives `grpo_step`'s ``anchor``.

    Raises:
        FileNotFoundError: no file at ``cfg.data_path`` (or none set); ValueError: a malformed example,
            or no example that fits the token budgets.
    """

    def __init__(self, cfg: SFTAnchorConfig, tokenizer: Any, seed: int, updates_per_step: int):
        if not Path(cfg.data_path).is_file():
            raise FileNotFoundError(f"sft_anchor.data_path {cfg.data_path!r} is not a file")
        self.cfg, self.seed, self.updates_per_step, self.tokenizer = cfg, seed, updates_per_step, tokenizer
        self.rows = tokenize_examples(tokenizer, load_examples(cfg.data_path), cfg.max_prompt_tokens,
                                      cfg.max_completion_tokens)
        if not self.rows:
            raise ValueError(f"sft_anchor: no example of {cfg.data_path} fits the token budgets")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._lengths = [len(r[0]) for r in self.rows]
        self._plans = {0: plan_epoch(self._lengths, cfg.batch_tokens, seed, 0)}

    def batch(self, i: int) -> list[tuple[list[int], int]]:
        """Rows of global anchor batch `i`: epochs of `sft.plan_epoch` batches, in order (every
        epoch has as many batches: the cuts depend on the sorted lengths only)."""
        epoch, k = divmod(i, len(self._plans[0]))
        if epoch not in self._plans:
            self._plans[epoch] = plan_epoch(self._lengths, self.cfg.batch_tokens, self.seed, epoch)
        return [self.rows[r] for r in self._plans[epoch][k]]

    def for_step(self, model: Any, step: int, amp: Callable | None = None,
                 relabelled: list[dict[str, Any]] | None = None) -> Callable[[int], dict[str, float]]:
        """`grpo_step`'s ``anchor`` for RL step `step` (0-based): update j backpropagates
        ``coef ·`` the mean completion NLL of batch ``step · updates_per_step + j``, and
        ``on_policy_coef ·`` that of its share (every U-th) of `relabelled` (`relabel_states`).
        Returns ``{"anchor_nll": nats per token, "anchor_tokens": N_j}`` per update, plus
        ``on_policy_nll`` and ``on_policy_states`` when update j has relabelled states."""
        extra = tokenize_examples(self.tokenizer, relabelled, self.cfg.max_prompt_tokens,
                                  self.cfg.max_completion_tokens) if relabelled else []

        def nll_of(rows: list) -> tuple[Any, int]:
            with (amp or nullcontext)():
                ids, labels = collate(rows, self.pad_id)
                return completion_loss(model, ids.to(model.device), labels.to(model.device))

        def anchor(j: int) -> dict[str, float]:
            loss_sum, n = nll_of(self.batch(step * self.updates_per_step + j))
            nll = loss_sum / max(1, n)
            (self.cfg.coef * nll).backward()
            m = {"anchor_nll": float(nll.detach()), "anchor_tokens": float(n)}
            if mine := extra[j::self.updates_per_step]:
                # padded-token batches, one backward each, weighted to one mean over all M_j tokens
                total, m_sum = sum(len(ids) - n_prompt for ids, n_prompt in mine), 0.0
                for idx in plan_epoch([len(r[0]) for r in mine], self.cfg.batch_tokens, self.seed, step):
                    s, _ = nll_of([mine[i] for i in idx])
                    (self.cfg.on_policy_coef * s / total).backward()
                    m_sum += float(s.detach())
                m.update(on_policy_nll=m_sum / total, on_policy_states=float(len(mine)))
            return m

        return anchor
