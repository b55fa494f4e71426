"""Evaluations that cannot silently lie: an endpoint checked before the first episode, and a run
stopped when its policy keeps failing.

A policy error (a refused connection, a timeout, an HTTP 500) becomes an invalid turn of its
episode (`rollout.episode.advance`), which is right for a one-off failure and wrong for a dead
server: every turn of every episode then "fails", and a panel scores 0% after burning hours.
`probe_policy` asks an OpenAI-compatible endpoint for its model list before anything is played;
`ErrorGuard` wraps a policy and raises `PolicyFailure` after ``limit`` errored calls in a row,
which `rollout.episode.run_episodes` lets through (it stops the run instead of becoming turns).
"""

from __future__ import annotations

import difflib
from typing import Any

from evoharness.policies.base import Completion, PolicyRequest


class PolicyFailure(RuntimeError):
    """The policy cannot answer: the run stops (completed episodes are kept)."""


def probe_policy(policy: Any, timeout_s: float = 10.0) -> None:
    """Check that `policy`'s endpoint answers and serves its model; other policies pass as they are.

    Args:
        policy: a built policy (`policies.openai_policy.OpenAIPolicy` is probed).
        timeout_s: seconds the endpoint has to list its models (one try, no retries).

    Raises:
        PolicyFailure: the endpoint does not answer (the message names the URL), refuses the model
            list (e.g. HTTP 401: a wrong key), or lists models and the policy's is not among them (with
            the nearest names). An endpoint without a model list (404) passes.
    """
    client = getattr(policy, "client", None)
    if client is None or not hasattr(policy, "model"):
        return
    import openai

    url = str(client.base_url)
    try:
        served = [m.id for m in client.with_options(timeout=timeout_s, max_retries=0).models.list()]
    except openai.APIStatusError as e:
        if e.status_code in (404, 405, 501):  # it answers HTTP but lists no models: reachable is all we can check
            return
        raise PolicyFailure(f"the endpoint at {url} refused its model list: HTTP {e.status_code} {e.message}") from e
    except Exception as e:  # noqa: BLE001 -- any other failure means the endpoint cannot be used
        raise PolicyFailure(
            f"no OpenAI-compatible endpoint answers at {url} ({type(e).__name__}: {e}); start the server "
            "(e.g. `evoharness serve --model-path DIR`) or fix policy.base_url"
        ) from e
    if served and policy.model not in served:
        near = difflib.get_close_matches(policy.model, served, n=3) or served[:3]
        raise PolicyFailure(f"{url} does not serve model {policy.model!r}; it serves {', '.join(map(repr, near))}")


class ErrorGuard:
    """`policy` with a limit on consecutive errored calls (module docstring).

    Args:
        policy: any policy (``act(requests) -> completions``).
        limit: errored completions in a row that stop the run (0: no limit). A batch's
            completions count in order; any answered call resets the count.

    Attributes:
        errors: errored completions so far (all, not only consecutive).
    """

    def __init__(self, policy: Any, limit: int):
        self.policy, self.limit = policy, limit
        self.name = policy.name
        self.errors = 0
        self._run = 0

    def act(self, requests: list[PolicyRequest]) -> list[Completion]:
        out = self.policy.act(requests)
        for c in out:
            if c.error:
                self.errors += 1
                self._run += 1
            else:
                self._run = 0
        if self.limit and self._run >= self.limit:
            raise PolicyFailure(
                f"{self._run} policy calls in a row failed (policy.max_consecutive_errors = {self.limit}); "
                f"the last: {next(c.error for c in reversed(out) if c.error)}"
            )
        return out

    def __getattr__(self, name: str) -> Any:  # the wrapped policy's other attributes (model, tokenizer, close...)
        return getattr(self.policy, name)
