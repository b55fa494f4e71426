"""The `evoharness` command: one entry point, one subcommand per job."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="EvoHarness: train and evaluate LLM agents on long-horizon tasks.")


@app.callback()
def _root() -> None:
    """EvoHarness: train and evaluate LLM agents on long-horizon tasks."""


def fail(msg: str) -> None:
    """Print a one-line error (no traceback) and exit with status 2."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command("eval")
def eval_cmd(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file (EvalConfig)."),
    split: Optional[str] = typer.Option(None, help="train | valid_seen | valid_unseen"),
    harness: Optional[str] = typer.Option(None, help="react | bpe"),
    policy: Optional[str] = typer.Option(None, help="expert | noisy_expert | random | teacher | openai | hf"),
    base_url: Optional[str] = typer.Option(None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1"),
    model: Optional[str] = typer.Option(None, help="Model name at the endpoint."),
    model_path: Optional[Path] = typer.Option(None, help="Local Hugging Face model directory (policy hf)."),
    protocol: Optional[str] = typer.Option(None, help="panel (cap 50) | evoharness (cap 70) | random128"),
    max_steps: Optional[int] = typer.Option(None, help="Step cap (overrides the protocol's)."),
    workers: Optional[int] = typer.Option(None, help="Worker processes."),
    limit: Optional[int] = typer.Option(None, help="Play only the first N episodes of the panel."),
    engine: Optional[str] = typer.Option(None, help="textworld | fast"),
    data_path: Optional[str] = typer.Option(None, help="ALFWORLD_DATA root; default: the bundled pack."),
    out: Optional[Path] = typer.Option(None, help="Output directory."),
    set_: list[str] = typer.Option([], "--set", help="Override any config key: --set policy.temperature=0.7"),
) -> None:
    """Evaluate a policy with a harness on a fixed ALFWorld panel."""
    from evoharness.config import ConfigError, load_config
    from evoharness.envs.alfworld.games import GameDataError
    from evoharness.eval.evaluate import EvalConfig, evaluate
    from evoharness.eval.report import markdown_table

    flags = {
        "split": split, "harness.kind": harness, "policy.kind": policy, "policy.base_url": base_url,
        "policy.model": model, "policy.model_path": model_path and str(model_path), "protocol": protocol,
        "max_steps": max_steps, "workers": workers, "limit": limit, "env.engine": engine,
        "env.data_path": data_path, "out_dir": out and str(out),
    }
    overrides = [f"{k}={_toml(v)}" for k, v in flags.items() if v is not None] + list(set_)
    try:
        cfg = load_config(EvalConfig, config, overrides)
        summary = evaluate(cfg)
    except (ConfigError, GameDataError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(markdown_table(summary))
    typer.echo(f"report: {Path(cfg.out_dir) / 'report.md'}")


def _toml(v) -> str:
    """A CLI value as a TOML literal for `load_config` overrides."""
    import json

    return json.dumps(v)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
