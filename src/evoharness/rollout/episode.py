"""Run episodes (env x harness x policy) in lock-step so a policy answers them as a batch.

Every turn costs one step of the budget, whatever it is: an environment
action, a meta-action or an invalid action (EvoHarness-RL §3). A crashed or
hung environment ends its own episode with ``stop_reason="error"``; the others
go on.
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from evoharness.envs.base import Env, StepResult, TaskSpec
from evoharness.harness.base import Harness, ParsedAction
from evoharness.policies.base import Completion, Policy, PolicyRequest
from evoharness.policies.guard import PolicyFailure
from evoharness.rollout.records import Trajectory, TurnRecord


class EnvTimeout(TimeoutError):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `EnvTimeout` if the block runs longer than `seconds` (main thread, POSIX only;
    elsewhere it is a no-op)."""
    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    try:
        old = signal.signal(signal.SIGALRM, _raise_timeout)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _raise_timeout(signum, frame):  # noqa: ARG001
    raise EnvTimeout("environment call timed out")


@dataclass
class EpisodeSpec:
    """One episode to play: a task, a unique id and a seed; with a `prefix`, a branch: its first
    turns replay these completions (an earlier episode's, e.g. up to the state where it
    looped) before the policy acts, so a GRPO group of branches shares that state."""

    task: TaskSpec
    episode_id: str
    seed: int = 0
    prefix: tuple[str, ...] = ()


@dataclass
class LiveEpisode:
    """An episode in play: its env and harness, the trajectory so far, the last env
    step (`StepResult`) and its start time (`time.perf_counter`, for ``wall_s``).
    `advance` moves it one turn; `run_episodes` and the runtime's agent loops
    (`recipes.alfworld.AlfworldWorkload`) hold one per episode."""

    spec: EpisodeSpec
    env: Env
    harness: Harness
    traj: Trajectory
    last: StepResult
    t0: float


def error_trajectory(spec: EpisodeSpec, harness: str, policy: str, max_steps: int, err: str) -> Trajectory:
    """The trajectory of an episode that could not start (its game failed to load or
    reset): no turns, ``stop_reason = "error"`` and the error text `err`."""
    return Trajectory(
        episode_id=spec.episode_id,
        task_id=spec.task.task_id,
        task_type=spec.task.task_type,
        split=spec.task.split,
        harness=harness,
        policy=policy,
        stop_reason="error",
        error=err,
        max_steps=max_steps,
        seed=spec.seed,
    )


def run_episodes(
    specs: list[EpisodeSpec],
    make_env: Callable[[TaskSpec], Env],
    make_harness: Callable[[], Harness],
    policy: Policy,
    max_steps: int = 50,
    env_timeout_s: float = 120.0,
    on_finish: Callable[[Trajectory], None] | None = None,
    stop_repeats: int = 0,
) -> list[Trajectory]:
    """Play `specs` concurrently in lock-step; return trajectories in `specs` order.

    Args:
        specs: episodes to play (all are live at once: size this batch to memory).
        make_env / make_harness: factories; each episode gets fresh instances.
        policy: answers all live episodes' requests in one `act` call per turn.
        max_steps: step budget per episode (T_max; meta and invalid turns count).
        env_timeout_s: a reset or step taking longer ends the episode as an error.
        on_finish: called with each trajectory as soon as it ends (for streaming
            JSONL writes and progress bars).
        stop_repeats: K > 0 ends an episode as ``stop_reason="hopeless"`` (a
            failure) once the same (prompt, completion) pair has occurred K
            times in it: the harness state, observation and action repeat, so a
            greedy policy is in a loop it cannot leave (the prompt carries no
            step counter). 0: never.
    """
    hname = make_harness().name
    done: dict[str, Trajectory] = {}

    def finish(traj: Trajectory) -> None:
        done[traj.episode_id] = traj
        if on_finish:
            on_finish(traj)

    live: list[LiveEpisode] = []
    seen: dict[str, dict[int, int]] = {}  # episode id -> hash(prompt, completion) -> count
    for spec in specs:
        t0 = time.perf_counter()
        env = None
        try:
            with time_limit(env_timeout_s):
                env = make_env(spec.task)
                first = env.reset()
            harness = make_harness()
            harness.reset(spec.task, first)
        except Exception as e:  # a game that cannot load is a failed episode, not a crashed run
            if env is not None:
                close_quietly(env)
            traj = error_trajectory(spec, hname, policy.name, max_steps, describe_error(e))
            traj.wall_s = time.perf_counter() - t0
            finish(traj)
            continue
        traj = Trajectory(
            episode_id=spec.episode_id,
            task_id=spec.task.task_id,
            task_type=spec.task.task_type,
            split=spec.task.split,
            harness=harness.name,
            policy=policy.name,
            goal=first.goal,
            initial_observation=first.observation,
            max_steps=max_steps,
            seed=spec.seed,
        )
        live.append(LiveEpisode(spec, env, harness, traj, first, t0))

    while live:
        requests = [
            PolicyRequest(
                messages=lv.harness.messages(),
                episode_id=lv.spec.episode_id,
                turn=len(lv.traj.turns),
                admissible_commands=list(lv.harness.admissible),
                env=lv.env,
                harness=lv.harness,
            )
            for lv in live
        ]
        completions = [replayed(lv) for lv in live]
        asked = [i for i, c in enumerate(completions) if c is None]
        try:
            answers = policy.act([requests[i] for i in asked]) if asked else []
        except PolicyFailure:
            raise  # the run stops (`policies.guard`): a policy that cannot answer scores nothing
        except Exception as e:  # the policy's own failure: every live episode it was asking for records it
            answers = [Completion(text="", finish_reason="error", error=describe_error(e)) for _ in asked]
        for i, c in zip(asked, answers, strict=True):
            completions[i] = c
        still: list[LiveEpisode] = []
        for lv, req, comp in zip(live, requests, completions):
            if advance(lv, req, comp, env_timeout_s, max_steps) and not _hopeless(lv, req, comp, seen, stop_repeats):
                still.append(lv)
            else:
                lv.traj.wall_s = time.perf_counter() - lv.t0
                close_quietly(lv.env)
                finish(lv.traj)
        live = still
    return [done[s.episode_id] for s in specs]


def replayed(lv: LiveEpisode) -> Completion | None:
    """The completion of `lv`'s branch prefix for its next turn (text only: no token ids, so no
    gradient; the trajectory counts it in ``info["replayed_turns"]``); None once the policy acts."""
    n = len(lv.traj.turns)
    if n >= len(lv.spec.prefix):
        return None
    lv.traj.info["replayed_turns"] = n + 1
    return Completion(text=lv.spec.prefix[n], finish_reason="replayed")


def advance(lv: LiveEpisode, req: PolicyRequest, comp: Completion, timeout_s: float, max_steps: int) -> bool:
    """Apply the policy's answer `comp` to request `req` of episode `lv`: parse it with the
    harness, run an env command (at most `timeout_s` s) or a meta-action, append the
    `TurnRecord`. Returns False when the episode has ended (won, done, `max_steps` turns,
    or an env error, recorded as ``stop_reason = "error"``); the caller closes the env."""
    h = lv.harness
    views = h.views()
    if fit := comp.extra.get("prompt_fit"):  # the policy shortened this turn's prompt to its budget
        count_prompt_fit(lv.traj.info, fit)
    if comp.error:
        parsed = ParsedAction("invalid", "", error=f"(policy error) {comp.error}")
    else:
        parsed = h.parse(comp.text)
    result = lv.last
    if parsed.kind == "env":
        try:
            with time_limit(timeout_s):
                result = lv.env.step(parsed.command)
        except Exception as e:
            lv.traj.stop_reason, lv.traj.error = "error", describe_error(e)
            lv.traj.turns.append(_turn(lv, req, comp, parsed, "", views, result))
            return False
        h.after_env_step(parsed, result)
        feedback = result.observation
        lv.last = result
    elif parsed.kind == "meta":
        feedback = h.run_meta(parsed)
    else:
        h.after_invalid(parsed)
        feedback = parsed.error
    lv.traj.turns.append(_turn(lv, req, comp, parsed, feedback, views, result))
    if result.won:
        lv.traj.won, lv.traj.stop_reason = True, "won"
        return False
    if result.done:
        lv.traj.stop_reason = "done"
        return False
    if len(lv.traj.turns) >= max_steps:
        lv.traj.stop_reason = "max_steps"
        return False
    return True


def _hopeless(lv: LiveEpisode, req: PolicyRequest, comp: Completion, seen: dict[str, dict[int, int]], k: int) -> bool:
    """True (and the trajectory marked ``hopeless``) when this turn's (prompt, completion)
    pair has now occurred `k` times in the episode."""
    if k <= 0:
        return False
    counts = seen.setdefault(lv.spec.episode_id, {})
    key = _pair_key(req.messages, comp.text)
    counts[key] = counts.get(key, 0) + 1
    if counts[key] < k:
        return False
    lv.traj.stop_reason = "hopeless"
    return True


def _pair_key(messages: list[dict[str, str]], completion: str) -> int:
    return hash((tuple((m["role"], m["content"]) for m in messages), completion))


def first_repeated_pair(traj: Trajectory) -> int | None:
    """The first turn whose (prompt, completion) pair an earlier turn of `traj` already had: the
    policy met the same state and answered the same, so from there it cycles (the pairs
    ``stop_repeats`` counts; a cycle of any length, where `train.rewards.spam_turns` sees only an
    action repeated at once). None when no pair repeats."""
    seen: set[int] = set()
    for i, t in enumerate(traj.turns):
        key = _pair_key(t.messages, t.completion)
        if key in seen:
            return i
        seen.add(key)
    return None


def _turn(
    lv: LiveEpisode,
    req: PolicyRequest,
    comp: Completion,
    parsed: ParsedAction,
    feedback: str,
    views: dict[str, str],
    result: StepResult,
) -> TurnRecord:
    return TurnRecord(
        turn=req.turn,
        messages=req.messages,
        completion=comp.text,
        kind=parsed.kind,
        action=parsed.text,
        feedback=feedback,
        views=views,
        admissible_commands=req.admissible_commands,
        won=result.won,
        done=result.done,
        prompt_token_ids=comp.prompt_token_ids,
        completion_token_ids=comp.completion_token_ids,
        logprobs=comp.logprobs,
        policy_version=comp.policy_version,
        prompt_tokens=comp.prompt_tokens,
        completion_tokens=comp.completion_tokens,
        error=comp.error,
        constraint=comp.extra.get("constraint"),
    )


def count_prompt_fit(info: dict, fit: dict[str, int]) -> None:
    """Add one fitted prompt (`harness.prompt.PromptFit`) to a trajectory's
    ``info["prompt_fit"]``: ``{"turns", "history_dropped", "tokens_cut"}`` totals."""
    acc = info.setdefault("prompt_fit", {"turns": 0, "history_dropped": 0, "tokens_cut": 0})
    acc["turns"] += 1
    acc["history_dropped"] += fit.get("history_dropped", 0)
    acc["tokens_cut"] += fit.get("tokens_cut", 0)


def describe_error(e: BaseException) -> str:
    """`e` as one line of text for a trajectory's ``error`` (type and message, at most 2,000 chars)."""
    tb = traceback.format_exception_only(type(e), e)
    return "".join(tb).strip()[-2000:]


def close_quietly(env: Env) -> None:
    """Close `env`, ignoring its errors (an env that failed may fail to close too)."""
    try:
        env.close()
    except Exception:
        pass
