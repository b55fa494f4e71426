"""On-policy teacher labels in the SFT anchor: DAgger inside the GRPO update (lost; JOURNAL.md).

The SFT anchor's rows (`evoharness.train.sft_anchor`) are states the teacher reached, not the ones
the RL policy reaches when it errs. The scripted teacher decides from the rendered message alone
(`evoharness.policies.teacher`), so it can label the step's own rollout states, as DAgger does
(Ross et al. 2011, Alg. 3.1; `evoharness.train.dagger`), here inside the RL update as KDRL does with
a model teacher (Xu et al. 2025, arXiv:2506.02208, "KDRL: Post-Training Reasoning LLMs via Unified
Knowledge Distillation and Reinforcement Learning"). `relabel_states` keeps the states of lost
episodes where the teacher would act in the world and the policy did something else
(``on_policy_filter = "lost_env"``; in a won episode another action is another route, and a note
where the teacher commits is usually fine too), or every disagreement (``"all"``). Each update j
then also descends

    on_policy_coef · (1/M_j) Σ_{k ∈ D_j} −log π_θ(y*_k | s_k)      (the teacher's completion y*)

over its share D_j of those states (M_j completion tokens), after the anchor's own term
(`OnPolicyAnchor.for_step`).

Measured from the main job's SFT model (`benchmarks/results/student/rl_levers_relabel.md`), it pulls
the policy away from SFT (KL 0.11-0.16 at step 8 instead of 0.02) and loses games SFT won on
valid_seen at weight 0.25 as at 1.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, Literal

from pydantic import Field

from evoharness.config.sft import SFTAnchorConfig
from evoharness.harness.base import META_VERBS, split_completion
from evoharness.train.dagger import state_key, teacher_label
from evoharness.train.sft import collate, completion_loss, plan_epoch, tokenize_examples
from evoharness.train.sft_anchor import SFTAnchor


class OnPolicyAnchorConfig(SFTAnchorConfig):
    """`SFTAnchorConfig` with the on-policy term's settings (the fields the product once carried)."""

    on_policy_coef: float = Field(
        0.0,
        ge=0.0,
        description="weight of the NLL of the teacher's labels at the "
        "step's rollout states where the policy acted otherwise (0: off)",
    )
    on_policy_states: int = Field(64, gt=0, description="most relabelled states per RL step (a seeded sample)")
    on_policy_filter: Literal["lost_env", "all"] = Field(
        "lost_env", description="which disagreements: lost episodes' where the teacher acts in the world, or all"
    )


def relabel_states(
    trajectories: list, seed: int, step: int, limit: int, which: Literal["lost_env", "all"] = "lost_env"
) -> list[dict[str, Any]]:
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
            if split_completion(turn.completion)[1].strip() != action and (
                which == "all" or action.split(" ", 1)[0] not in META_VERBS
            ):
                out.append({"messages": turn.messages, "completion": label})
    if len(out) > limit:
        keep = sorted(random.Random(f"relabel:{seed}:{step}").sample(range(len(out)), limit))
        out = [out[i] for i in keep]
    return out


class OnPolicyAnchor(SFTAnchor):
    """The SFT anchor plus the on-policy term (``cfg``: an `OnPolicyAnchorConfig`)."""

    cfg: OnPolicyAnchorConfig

    def for_step(
        self, model: Any, step: int, amp: Callable | None = None, relabelled: list[dict[str, Any]] | None = None
    ) -> Callable[[int], dict[str, float]]:
        """`SFTAnchor.for_step`'s update j, then ``on_policy_coef ·`` the mean completion NLL of its
        share (every U-th) of `relabelled` (`relabel_states`). Returns the anchor's metrics plus
        ``on_policy_nll`` and ``on_policy_states`` when update j has relabelled states."""
        base = super().for_step(model, step, amp)
        extra = (
            tokenize_examples(self.tokenizer, relabelled, self.cfg.max_prompt_tokens, self.cfg.max_completion_tokens)
            if relabelled
            else []
        )

        def nll_of(rows: list) -> tuple[Any, int]:
            with (amp or nullcontext)():
                ids, labels = collate(rows, self.pad_id)
                return completion_loss(model, ids.to(model.device), labels.to(model.device))

        def anchor(j: int) -> dict[str, float]:
            m = base(j)
            if mine := extra[j :: self.updates_per_step]:
                # padded-token batches, one backward each, weighted to one mean over all M_j tokens
                total, m_sum = sum(len(ids) - n_prompt for ids, n_prompt in mine), 0.0
                for idx in plan_epoch([len(r[0]) for r in mine], self.cfg.batch_tokens, self.seed, step):
                    s, _ = nll_of([mine[i] for i in idx])
                    (self.cfg.on_policy_coef * s / total).backward()
                    m_sum += float(s.detach())
                m.update(on_policy_nll=m_sum / total, on_policy_states=float(len(mine)))
            return m

        return anchor
