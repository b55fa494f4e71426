"""mkdocs hook: the configuration reference (docs/config.md), generated from the pydantic models.

Every field of every config section: its TOML key, type, default and description. The description
is the field's ``Field(description=...)``, else the comment on its line or the comment block just
above it in the source (the project documents most settings as comments beside them).
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing

from pydantic import BaseModel

PLACEHOLDER = "{{ config_reference }}"


def _sections() -> list[tuple[str, type[BaseModel]]]:
    from evoharness.config.collect import CollectConfig, DistillConfig
    from evoharness.config.env import AgentConfig, EnvConfig, RepoTasksConfig
    from evoharness.config.eval import EvalConfig, RepoEvalConfig, RepoPolicyConfig
    from evoharness.config.harness import HarnessConfig
    from evoharness.config.policy import PolicyConfig
    from evoharness.config.rl import (
        AdvantageConfig,
        Branch,
        GRPOConfig,
        LLMConsolidatorConfig,
        RewardConfig,
        RLConfig,
        RuntimeConfig,
    )
    from evoharness.config.run import RunConfig
    from evoharness.config.scale import LoRAConfig, ShardConfig
    from evoharness.config.sft import SFTAnchorConfig, SFTConfig, SFTJobConfig

    return [
        ("`evoharness run` (the main job): top level", RunConfig),
        ("`evoharness eval`: top level", EvalConfig),
        ("`[env]`", EnvConfig),
        ("`[harness]`", HarnessConfig),
        ("`[policy]`", PolicyConfig),
        ("`evoharness sft` / `[sft]`", SFTConfig),
        ("`evoharness sft`: the job's inputs (beside every `[sft]` key)", SFTJobConfig),
        ("`evoharness collect`: top level", CollectConfig),
        ("`evoharness distill`: top level", DistillConfig),
        ("`evoharness rl` / `[rl]`", RLConfig),
        ("`[grpo]`", GRPOConfig),
        ("`[grpo.reward]`", RewardConfig),
        ("`[grpo.advantage]`", AdvantageConfig),
        ("`[runtime]`", RuntimeConfig),
        ("`[lora]` (sft and rl)", LoRAConfig),
        ("`[shard]` (sft and rl)", ShardConfig),
        ("`[sft_anchor]`", SFTAnchorConfig),
        ("`[[branches]]`", Branch),
        ("`[llm_consolidator]`", LLMConsolidatorConfig),
        ("`[repo]` (eval and rl --env repo)", RepoTasksConfig),
        ("`evoharness eval --env repo`: top level", RepoEvalConfig),
        ("`[policy]` (eval --env repo)", RepoPolicyConfig),
        ("`[repo.agent]`", AgentConfig),
    ]


def _comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, or the comment block right above it."""
    src = textwrap.dedent(inspect.getsource(cls))
    line_comment: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            line_comment[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = src.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(src).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = [line_comment[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in line_comment]
        above, n = [], node.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#"):
            above.insert(0, line_comment.get(n, ""))
            n -= 1
        out[node.target.id] = " ".join(above + own)
    return out


def _type(ann: typing.Any) -> str:
    if typing.get_origin(ann) is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(ann))
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in typing.get_args(ann))
    if typing.get_origin(ann) in (list, tuple, dict):
        return f"{typing.get_origin(ann).__name__}[{', '.join(_type(a) for a in typing.get_args(ann))}]"
    if ann is type(None):
        return "None"
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _default(field: typing.Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section)"
    else:
        value = field.default
    if value is None:
        return "None"
    if isinstance(value, BaseModel):
        return "(section)"
    try:
        return json.dumps(value) if not isinstance(value, str) else f'"{value}"'
    except TypeError:
        return str(value)


def render() -> str:
    """The reference as Markdown: one table per section."""
    parts = []
    for title, cls in _sections():
        notes = _comments(cls)
        doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "").split("\n\n")[0].replace("\n", " ")
        rows = ["| key | type | default | what |", "|---|---|---|---|"]
        inherited = {n for base in cls.__bases__ for n in getattr(base, "model_fields", {})}
        for name, field in cls.model_fields.items():
            if name in inherited:  # a subclass's table lists what it adds (its base has its own table)
                continue
            what = field.description or notes.get(name, "")
            cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
            rows.append(f"| `{name}` | {_type(field.annotation)} | `{cell(_default(field))}` | {cell(what)} |")
        parts += [f"## {title}", "", f"`{cls.__name__}`: {doc}", "", *rows, ""]
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs hook
    return markdown.replace(PLACEHOLDER, render()) if PLACEHOLDER in markdown else markdown
