"""The `evoharness` command: one entry point, one subcommand per job."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="EvoHarness: train and evaluate LLM agents on long-horizon tasks."
)


def _version(show: bool) -> None:
    if show:
        import torch

        from evoharness import __version__

        typer.echo(f"evoharness {__version__} (torch {torch.__version__})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """EvoHarness: train and evaluate LLM agents on long-horizon tasks."""


def fail(msg: str) -> None:
    """Print a one-line error (no traceback) and exit with status 2."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


# commands with --set take further key=value pairs after it: --set a=1 b=2 (= --set a=1 --set b=2)
_PAIRS = {"allow_extra_args": True}
_SET_HELP = "Override config keys: --set key=value section.key=value (repeatable; any key of --config, docs/config.md)"


def _overrides(ctx: typer.Context, flags: dict, set_: list[str]) -> list[str]:
    """``--set`` items: the options given on the command line (as their config keys), then every
    ``--set`` pair, trailing pairs included; a stray argument that is not ``key=value`` is refused."""
    stray = [a for a in ctx.args if "=" not in a or a.startswith("-")]
    if stray:
        fail(f"unexpected argument {stray[0]!r} (config keys go as --set key=value)")
    return [f"{k}={_toml(v)}" for k, v in flags.items() if v is not None] + list(set_) + list(ctx.args)


@app.command("eval", context_settings=_PAIRS)
def eval_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (EvalConfig, or RepoEvalConfig with --env repo)."
    ),
    env: str = typer.Option("alfworld", "--env", help="alfworld | repo (repository-building tasks)."),
    tasks: str | None = typer.Option(None, help="--env repo: 'pack', a task directory, or a directory of tasks."),
    split: str | None = typer.Option(
        None, help="train | valid_seen | valid_unseen_scenes (unseen rooms, bundled) | valid_unseen (needs --data-path)"
    ),
    harness: str | None = typer.Option(None, help="react | bpe"),
    policy: str | None = typer.Option(
        None, help="expert | noisy_expert | random | teacher | openai | hf; repo: reference | empty | openai"
    ),
    base_url: str | None = typer.Option(None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1"),
    model: str | None = typer.Option(None, help="Model name at the endpoint."),
    model_path: Path | None = typer.Option(None, help="Local Hugging Face model directory (policy hf)."),
    protocol: str | None = typer.Option(None, help="panel (cap 50) | evoharness (cap 70) | random128"),
    max_steps: int | None = typer.Option(None, help="Step cap (overrides the protocol's)."),
    workers: int | None = typer.Option(None, help="Worker processes."),
    limit: int | None = typer.Option(None, help="Play only the first N episodes of the panel."),
    engine: str | None = typer.Option(None, help="textworld | fast"),
    data_path: str | None = typer.Option(None, help="ALFWORLD_DATA root; default: the bundled pack."),
    out: Path | None = typer.Option(None, help="Output directory."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Evaluate a policy with a harness on a fixed ALFWorld panel, or on repository tasks (--env repo)."""
    from evoharness.config.base import ConfigError, load_config

    if env == "repo":
        alf_only = {
            "--split": split,
            "--harness": harness,
            "--model-path": model_path,
            "--protocol": protocol,
            "--max-steps": max_steps,
            "--engine": engine,
            "--data-path": data_path,
        }
        if used := [k for k, v in alf_only.items() if v is not None]:
            fail(f"{', '.join(used)}: only for --env alfworld")
        from evoharness.eval.repo_eval import run_cli

        flags = {
            "repo.tasks": tasks,
            "policy.kind": policy,
            "policy.base_url": base_url,
            "policy.model": model,
            "workers": workers,
            "limit": limit,
            "out_dir": out and str(out),
        }
        overrides = _overrides(ctx, flags, set_)
        try:
            typer.echo(run_cli(config, overrides))
        except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as e:
            fail(str(e))
        return
    if env != "alfworld":
        fail(f"unknown --env {env!r} (alfworld | repo)")
    if tasks is not None:
        fail("--tasks applies to --env repo only")
    from evoharness.config.eval import EvalConfig
    from evoharness.config.recipe import EVAL_KEYS
    from evoharness.envs.alfworld.games import GameDataError
    from evoharness.eval.evaluate import evaluate
    from evoharness.eval.report import markdown_table
    from evoharness.policies.guard import PolicyFailure

    flags = {
        "split": split,
        "harness.kind": harness,
        "policy.kind": policy,
        "policy.base_url": base_url,
        "policy.model": model,
        "policy.model_path": model_path and str(model_path),
        "protocol": protocol,
        "max_steps": max_steps,
        "workers": workers,
        "limit": limit,
        "env.engine": engine,
        "env.data_path": data_path,
        "out_dir": out and str(out),
    }
    overrides = _overrides(ctx, flags, set_)
    try:
        cfg = load_config(EvalConfig, config, overrides)
        if cfg.policy.kind == "hf" and (taken := _model_recipe(cfg.policy.model_path, EVAL_KEYS, config, overrides)):
            cfg = load_config(EvalConfig, config, taken + overrides)
        summary = evaluate(cfg)
    except (ConfigError, GameDataError, ValueError, FileNotFoundError, PolicyFailure) as e:
        fail(str(e))
    typer.echo(markdown_table(summary))
    typer.echo(f"report: {Path(cfg.out_dir) / 'report.md'}")


@app.command("run", context_settings=_PAIRS)
def run_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="TOML file (RunConfig); default: the main job, configs/main_job.toml of this checkout.",
    ),
    preset: str | None = typer.Option(
        None, help="A shipped config by name: smoke (the pipeline in about a minute), main_job (the default)."
    ),
    budget_minutes: float | None = typer.Option(
        None,
        help=(
            "Optional wall-clock cap (minutes) on the training stages; the default step budgets give the same "
            "model on any machine."
        ),
    ),
    out: Path | None = typer.Option(None, help="Output directory (default runs/main); a rerun resumes."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """The main job: teacher traces, tokenizer + model, SFT, GRPO, evaluation, report."""
    from evoharness.config.base import ConfigError
    from evoharness.config.run import load_run_config, preset_path
    from evoharness.envs.alfworld.games import GameDataError
    from evoharness.pipeline import run_pipeline

    if preset is not None:
        if config is not None:
            fail("--preset and --config both name a config: give one")
        try:
            config = preset_path(preset)
        except ConfigError as e:
            fail(str(e))
    overrides = _overrides(ctx, {"budget_minutes": budget_minutes, "out_dir": out and str(out)}, set_)
    try:
        cfg = load_run_config(config, overrides)
        report = run_pipeline(cfg, log=lambda m: typer.secho(m, fg=typer.colors.CYAN))
    except (ConfigError, GameDataError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo((report.parent / "report.md").read_text().split("## Stage 1")[0])
    typer.secho(f"report: {report}", bold=True)


@app.command("sft", context_settings=_PAIRS)
def sft_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (SFTJobConfig: any of its keys: docs/config.md)."
    ),
    examples: Path | None = typer.Option(None, help="SFT examples JSONL ({messages, completion} per line)."),
    model_path: Path | None = typer.Option(None, help="HF model directory to fine-tune."),
    out: Path | None = typer.Option(None, help="Output directory (default runs/sft; resumes from its checkpoints)."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
    no_plan_check: bool = typer.Option(
        False, "--no-plan-check", help="Start even when the memory planner says the run does not fit."
    ),
) -> None:
    """Stage 1 alone: supervised harness fine-tuning of any HF model directory."""
    from evoharness.config.base import ConfigError, load_config
    from evoharness.config.recipe import SFT_KEYS
    from evoharness.config.sft import SFTJobConfig

    flags = {
        "examples": examples and str(examples),
        "model_path": model_path and str(model_path),
        "out_dir": out and str(out),
    }
    overrides = _overrides(ctx, flags, set_)
    try:
        cfg = load_config(SFTJobConfig, config, overrides)
        if taken := _model_recipe(cfg.model_path, SFT_KEYS, config, overrides):
            cfg = load_config(SFTJobConfig, config, taken + overrides)
        for key in ("examples", "model_path"):
            if not getattr(cfg, key):
                raise ConfigError(f"{key}: required (--{key.replace('_', '-')}, or {key} = ... in --config)")
        if not Path(cfg.examples).is_file():
            raise FileNotFoundError(f"examples file not found: {cfg.examples}")
    except (ConfigError, FileNotFoundError) as e:
        fail(str(e))
    _cuda_check(cfg.device)
    if not no_plan_check:
        _plan_check(cfg, cfg.model_path)
    from evoharness.train.sft import run_sft_job

    try:
        final = run_sft_job(cfg, log=lambda m: typer.echo(m, err=True))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    typer.secho(f"model: {final}", bold=True)


@app.command("rl", context_settings=_PAIRS)
def rl_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (RLConfig), e.g. configs/rl_qwen3_0.6b_1gpu.toml."
    ),
    model_path: Path | None = typer.Option(None, help="The SFT model directory (policy init and KL reference)."),
    out: Path | None = typer.Option(None, help="Output directory (resumes from its checkpoints)."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
    schedule: str | None = typer.Option(None, help="colocate (default), async, elastic or elastic-async."),
    cells: int | None = typer.Option(None, help="Runtime cells K (default 1; more need --backend local or ray)."),
    backend: str | None = typer.Option(
        None,
        help="Where the cells run: inprocess (default: one cell, this "
        "process), local (a process per cell) or ray (Ray actors; "
        "needs the ray extra).",
    ),
    ray_address: str | None = typer.Option(
        None, help="With --backend ray: the Ray cluster to join (default: start a local head on 127.0.0.1)."
    ),
    env: str | None = typer.Option(None, "--env", help="alfworld (default) | repo (repository tasks)."),
    tasks: str | None = typer.Option(None, help="--env repo: 'pack', a task directory, or a directory of tasks."),
    no_plan_check: bool = typer.Option(
        False, "--no-plan-check", help="Start even when the memory planner says the run does not fit."
    ),
) -> None:
    """Stage 2 alone: cost-aware GRPO with the EvoHarness reward on any HF model directory."""
    from evoharness.config.base import ConfigError, load_config
    from evoharness.config.recipe import RL_KEYS
    from evoharness.config.rl import RLConfig
    from evoharness.envs.alfworld.games import GameDataError
    from evoharness.recipes.rl import train_rl

    if cells and cells > 1 and backend is None:
        backend = "local"  # K cells and no backend named: a process per cell
    flags = {
        "model_path": model_path and str(model_path),
        "out_dir": out and str(out),
        "runtime.schedule": schedule,
        "runtime.cells": cells,
        "runtime.backend": backend,
        "runtime.ray_address": ray_address,
        "env": env,
        "repo.tasks": tasks,
    }
    if tasks is not None and env != "repo":
        fail("--tasks applies to --env repo only")
    overrides = _overrides(ctx, flags, set_)
    from evoharness.envs.repo.sandbox import SandboxUnavailable

    try:
        cfg = load_config(RLConfig, config, overrides)
        if cfg.env == "alfworld" and (taken := _model_recipe(cfg.model_path, RL_KEYS, config, overrides)):
            cfg = load_config(RLConfig, config, taken + overrides)
    except ConfigError as e:
        fail(str(e))
    _cuda_check(cfg.device if cfg.runtime.gpus_per_cell == 0 else "cuda")
    if not no_plan_check:
        _plan_check(cfg)
    try:
        final = train_rl(cfg)
    except (ConfigError, GameDataError, ValueError, FileNotFoundError, SandboxUnavailable) as e:
        fail(str(e))
    typer.secho(f"model: {final}", bold=True)


def _model_recipe(model_path: str | Path | None, keys: dict[str, str], config: Path | None, overrides: list[str]):
    """``--set`` items applying the harness recipe saved with the model (`config.recipe`) to the keys
    the config file and the command line leave unset; what it takes is printed."""
    from evoharness.config.recipe import RECIPE_FILE, explicit_keys, read_recipe, recipe_overrides

    recipe = read_recipe(model_path)
    if recipe is None:
        return []
    taken = recipe_overrides(recipe, keys, explicit_keys(config, overrides))
    if taken:
        typer.echo(f"model recipe ({Path(model_path) / RECIPE_FILE}): {' '.join(taken)} (--set overrides)", err=True)
    return taken


def _cuda_check(device: str) -> None:
    """Refuse a CUDA device on a torch without CUDA, with the line that installs one."""
    if not device.startswith("cuda"):
        return
    import torch

    if torch.version.cuda is None:
        fail(
            f"device {device!r} needs a CUDA build of torch; this one is {torch.__version__}. Install one: "
            f"pip install torch=={torch.__version__.split('+')[0]} --index-url https://download.pytorch.org/whl/cu130"
        )
    if not torch.cuda.is_available():
        fail(f"device {device!r}: torch {torch.__version__} sees no CUDA device (driver? CUDA_VISIBLE_DEVICES?)")


def _plan_check(cfg, model_path: str | None = None) -> None:
    """Refuse (exit 2) a run the memory planner says does not fit on this machine's devices,
    printing the plan; a one-line summary otherwise (`plan.host.preflight`)."""
    from evoharness.plan.host import preflight
    from evoharness.plan.memory import GIB
    from evoharness.plan.render import render

    check = preflight(cfg, model_path)
    if check.plan is None:
        typer.echo(f"memory plan: not checked ({check.skipped})", err=True)
        return
    if check.refused:
        typer.echo(render(check.plan), err=True)
        fail(
            f"refused before loading anything: the memory plan above {check.plan.verdict}. Change the settings it "
            "names (micro_batch_size, capacity, max_prompt_tokens, lora, shard, runtime), or start anyway with "
            "--no-plan-check"
        )
    worst = max(check.plan.devices, key=lambda d: d.total / d.capacity)
    typer.echo(
        f"memory plan: fits ({worst.total / GIB:.1f} of {worst.capacity / GIB:.1f} GiB on {worst.label}; "
        "`evoharness plan` prints the table)",
        err=True,
    )


@app.command("plan", context_settings=_PAIRS)
def plan_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="An RL or SFT TOML file (which one is read from its keys, or --stage)."
    ),
    stage: str | None = typer.Option(None, help="rl | sft (default: detected from the config's keys)."),
    model_path: Path | None = typer.Option(
        None, help="Model directory whose config.json gives the architecture (default: the config's model_path)."
    ),
    devices: int | None = typer.Option(
        None, min=1, help="Devices to plan on (default: as many as the config places processes on)."
    ),
    device_memory: float | None = typer.Option(
        None, min=0.001, help="GiB per device, host RAM for a CPU run (default: this machine's)."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None, min=0.01, max=1.0, help="vLLM's share of each GPU (default: the engine sized to its need)."
    ),
    list_layouts: bool = typer.Option(False, "--list-layouts", help="List the named model layouts and exit."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Memory plan of an RL or SFT run per device and role; exit 0 if it fits, 1 if not."""
    from evoharness.config.base import ConfigError
    from evoharness.plan.host import cuda_memory_gib, host_available_gib, wants_cuda
    from evoharness.plan.layouts import LAYOUTS
    from evoharness.plan.planner import plan_run
    from evoharness.plan.render import render
    from evoharness.plan.stage import load_stage_config

    if list_layouts:
        typer.echo(f"{'layout':<12} {'params':>8} {'hidden':>6} {'layers':>6} {'heads':>5} {'kv':>3} {'head_dim':>8} "
                   f"{'mlp':>6} {'vocab':>7} tied")  # fmt: skip
        for name, lay in LAYOUTS.items():
            typer.echo(
                f"{name:<12} {lay.params() / 1e9:>7.3f}B {lay.hidden:>6} {lay.layers:>6} {lay.heads:>5} "
                f"{lay.kv_heads:>3} {lay.head_dim:>8} {lay.intermediate:>6} {lay.vocab:>7} "
                + ("yes" if lay.tied else "no")
            )
        return
    try:
        cfg = load_stage_config(config, _overrides(ctx, {}, set_), stage)
        if device_memory is not None:
            memory: float | list[float] = device_memory
        elif wants_cuda(cfg):
            memory = cuda_memory_gib()
            if not memory:
                raise ValueError("the config runs on CUDA and no CUDA device is visible here: pass --device-memory GiB")
            devices = devices or len(memory)
            memory = memory[:devices] if len(memory) >= devices else memory + [memory[-1]] * (devices - len(memory))
        else:
            memory = host_available_gib()
        plan = plan_run(cfg, memory, devices, model_path and str(model_path), gpu_memory_utilization)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    typer.echo(render(plan))
    raise typer.Exit(0 if plan.fits else 1)


def _toml(v) -> str:
    """A CLI value as a TOML literal for `load_config` overrides."""
    import json

    return json.dumps(v)


@app.command("collect", context_settings=_PAIRS)
def collect_cmd(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (CollectConfig: any of its keys: docs/config.md)."
    ),
    split: str | None = typer.Option(None, help="ALFWorld split (default train)."),
    per_type: int | None = typer.Option(None, help="The first N games of each task type (0: all)."),
    samples: int | None = typer.Option(None, help="Episodes per game."),
    policy: str | None = typer.Option(None, help="Who plays (default teacher): teacher | openai | hf | expert ..."),
    base_url: str | None = typer.Option(None, help="policy openai: the endpoint, e.g. http://localhost:8000/v1"),
    model: str | None = typer.Option(None, help="policy openai: the served model name."),
    engine: str | None = typer.Option(None, help="fast (default) | textworld"),
    data_path: str | None = typer.Option(None, help="ALFWORLD_DATA root; default: the bundled pack."),
    max_steps: int | None = typer.Option(None, help="Step cap per episode (default 50)."),
    out: Path | None = typer.Option(None, help="Trajectory JSONL (appended to: a rerun resumes)."),
    sft: Path | None = typer.Option(None, help="Also write SFT examples (and their harness recipe) here."),
    experience: Path | None = typer.Option(None, help="Experience store JSON (loaded on resume, saved per batch)."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Teacher traces and SFT examples: a policy plays ALFWorld games through the BPE harness."""
    from evoharness.config.base import ConfigError, load_config
    from evoharness.config.collect import CollectConfig
    from evoharness.envs.alfworld.games import GameDataError
    from evoharness.policies.guard import PolicyFailure
    from evoharness.rollout.collect import run_collect

    flags = {
        "split": split,
        "per_type": per_type,
        "samples": samples,
        "policy.kind": policy,
        "policy.base_url": base_url,
        "policy.model": model,
        "env.engine": engine,
        "env.data_path": data_path,
        "max_steps": max_steps,
        "out": out and str(out),
        "sft": sft and str(sft),
        "experience": experience and str(experience),
    }
    try:
        run_collect(load_config(CollectConfig, config, _overrides(ctx, flags, set_)), log=typer.echo)
    except (ConfigError, GameDataError, ValueError, FileNotFoundError, PolicyFailure) as e:
        fail(str(e))


@app.command("distill", context_settings=_PAIRS)
def distill_cmd(
    ctx: typer.Context,
    logs: Path | None = typer.Argument(None, help="Trajectory JSONL or ReAct-format JSONL (docs/distill.md)."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (DistillConfig: any of its keys: docs/config.md)."
    ),
    out: Path | None = typer.Option(None, help="Distilled trajectories (JSONL)."),
    sft: Path | None = typer.Option(None, help="Also write next-action SFT examples (and their recipe) here."),
    engine: str | None = typer.Option(None, help="fast (default) | textworld"),
    data_path: str | None = typer.Option(None, help="ALFWORLD_DATA root of the logged games; default: the pack."),
    max_steps: int | None = typer.Option(None, help="Step cap of the distilled episodes (default 50)."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """SFT examples from the logs of any imperfect agent (format: docs/distill.md)."""
    import json

    from evoharness.config.base import ConfigError, load_config
    from evoharness.config.collect import DistillConfig
    from evoharness.train.distill import run_distill

    flags = {
        "logs": logs and str(logs),
        "out": out and str(out),
        "sft": sft and str(sft),
        "env.engine": engine,
        "env.data_path": data_path,
        "max_steps": max_steps,
    }
    try:
        stats = run_distill(load_config(DistillConfig, config, _overrides(ctx, flags, set_)))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(json.dumps(stats, indent=1))


@app.command("simulate", context_settings=_PAIRS)
def simulate_cmd(
    ctx: typer.Context,
    workload: Path = typer.Option(..., "--workload", "-w", help="Workload TOML or JSONL trace of executions."),
    cells: int | None = typer.Option(None, "--cells", "-k", help="K cells (default: the workload's cluster)."),
    policies: str = typer.Option(
        "colocate,async,elastic,elastic-async",
        help="Comma-separated schedules: colocate, async, elastic, elastic-gated, elastic-async.",
    ),
    steps: int | None = typer.Option(None, help="RL steps to simulate."),
    seed: int | None = typer.Option(None, help="Seed of the workload draws."),
    out: Path | None = typer.Option(None, help="Write table.md, results.json and timeline.png here."),
    set_: list[str] = typer.Option([], "--set", help=_SET_HELP),
) -> None:
    """Simulate colocate / async / elastic / elastic-async rollout-train schedules of a workload on K cells."""
    from evoharness.runtime.sim_report import run_cli

    try:
        typer.echo(run_cli(workload, cells, policies, steps, seed, out, _overrides(ctx, {}, set_)))
    except (ValueError, RuntimeError) as e:  # ConfigError is a ValueError
        fail(str(e))


@app.command("serve")
def serve_cmd(
    model_path: Path | None = typer.Option(None, help="Local HF model directory served by the project's engine."),
    backend: list[str] = typer.Option(
        [], "--backend", help="OpenAI-compatible server (vLLM, SGLang), e.g. http://h:8000/v1; repeatable."
    ),
    workers: int = typer.Option(
        0, help="Run the engine in N worker processes instead of in-process (needs --model-path)."
    ),
    host: str = typer.Option("127.0.0.1", help="Bind address (admin endpoints are unauthenticated: keep loopback)."),
    port: int = typer.Option(8000, help="Port."),
    records: Path | None = typer.Option(
        None, help="Directory of per-execution call records (JSONL); default: in memory."
    ),
    served_model_name: str | None = typer.Option(
        None, help="Model name clients use (default: from the model path, e.g. runs/smoke/rl/final -> smoke-rl-final)."
    ),
    max_prompt_tokens: int | None = typer.Option(
        None,
        help="Prompt budget of engine backends: a longer prompt drops its oldest history first, as LocalHFPolicy does.",
    ),
    max_batch: int = typer.Option(64, help="Calls per engine batch at most."),
    threads: int | None = typer.Option(None, help="Torch CPU threads per engine."),
    wait_backends: float = typer.Option(
        60.0, help="Seconds to wait for each --backend server to answer /models before giving up."
    ),
    backend_grammar: str = typer.Option(
        "regex",
        help=(
            "How --backend servers get action_grammar: regex (vLLM structured_outputs; not the engine's token "
            "masks) | xargs (vllm_xargs for a vLLM server started with --logits-processors "
            "evoharness.engines.vllm_grammar:ActionGrammarLogitsProcessor: exact masks and contract log-probs)."
        ),
    ),
) -> None:
    """OpenAI-compatible gateway: routing, token-in/token-out records, transparent retry (QwenGyre)."""
    from evoharness.runtime.backends import BackendError, wait_for_server
    from evoharness.runtime.gateway import build_gateway, serve

    if workers and not model_path:
        fail("--workers needs --model-path")
    if model_path and max_prompt_tokens is None:
        from evoharness.config.recipe import read_recipe

        if recipe := read_recipe(model_path):  # the budget the model was trained with (config.recipe)
            max_prompt_tokens = recipe.max_prompt_tokens
            typer.echo(f"model recipe: --max-prompt-tokens {max_prompt_tokens}", err=True)
    try:
        gw = build_gateway(
            str(model_path) if model_path else None,
            list(backend),
            workers,
            records,
            served_model_name,
            max_prompt_tokens,
            max_batch,
            threads,
            log_dir=records,
            backend_grammar=backend_grammar,
        )
    except (ValueError, OSError) as e:
        fail(str(e))
    for url in backend:  # a clear error, not a lifespan traceback; a server still starting is waited for
        try:
            wait_for_server(url, 0)
        except BackendError:
            typer.echo(f"waiting up to {wait_backends:.0f} s for {url} to serve ...", err=True)
            try:
                wait_for_server(url, wait_backends)
            except BackendError as e:
                fail(f"backend {e}")
    typer.echo(
        f"serving model {gw.served_model!r} at http://{host}:{port}/v1 "
        f"({len(gw.backends)} backend(s); records: {records or 'in memory'})",
        err=True,
    )
    serve(gw, host, port)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
