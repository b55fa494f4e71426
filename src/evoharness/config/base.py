"""The config base: `Strict` models loaded from TOML, overridable from the CLI.

Every section rejects unknown keys (``extra="forbid"``), so a typo in a TOML
file or a ``--set`` override is an error that names the key, not a silent
default.

A section given in part (``[sft]`` with one key, ``--set sft.lr=1e-3``) keeps
the parent's defaults for the keys it does not name: the main job's ``sft``
and ``rl`` defaults are not the standalone commands', and naming one key must
not swap in the others.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message says why."""


def _tracker_list(v: Any) -> Any:
    return [t.strip() for t in v.replace("|", ",").split(",") if t.strip()] if isinstance(v, str) else v


# experiment trackers beside metrics.jsonl (`evoharness.tracking`): a list, or "tensorboard,wandb" from --set
Trackers = Annotated[list[Literal["tensorboard", "wandb", "mlflow"]], BeforeValidator(_tracker_list)]


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=3`` -> (["a", "b"], 3). The value is read as TOML when it parses
    (numbers, booleans, quoted strings, lists), else taken as a bare string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [k for k in key.strip().split(".") if k], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for k in path[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a section")
        node[path[-1]] = value
    return data


def complete_sections(default: BaseModel, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with every nested section it gives in part completed from `default`'s value
    of that section (recursively); other keys are left as given."""
    out = dict(data)
    for k, v in data.items():
        cur = getattr(default, k, None)
        if isinstance(v, dict) and isinstance(cur, BaseModel):
            out[k] = {**cur.model_dump(), **complete_sections(cur, v)}
    return out


def load_config(
    model: type[T],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> T:
    """Build a config of type `model` from defaults, a TOML file and overrides.

    Raises:
        ConfigError: missing or malformed file, unknown key, wrong type.
    """
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data.update(tomllib.loads(p.read_text()))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from e
    apply_overrides(data, overrides or [])
    try:
        data = complete_sections(model(), data)
    except ValidationError:  # a model with required fields has no default instance: nothing to complete from
        pass
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msg = _unknown_key(model, err["loc"]) if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {loc}: {msg}")
        raise ConfigError(f"invalid config{f' {path}' if path else ''}:\n" + "\n".join(lines)) from None


def _unknown_key(model: type[BaseModel], loc: tuple) -> str:
    """``unknown key``, with the nearest keys of its section (did you mean ...?)."""
    import difflib

    section: Any = model
    for part in loc[:-1]:  # walk to the section that holds the key (lists: their item model)
        field = section.model_fields.get(part) if isinstance(part, str) and hasattr(section, "model_fields") else None
        if field is None:
            continue
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
        section = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else (args[0] if args else section)
    fields = getattr(section, "model_fields", {})
    near = difflib.get_close_matches(str(loc[-1]), list(fields), n=3, cutoff=0.6)
    if not near:  # a key of one of the section's own sections, e.g. `tasks` for `repo.tasks`
        near = [
            f"{name}.{loc[-1]}"
            for name, f in fields.items()
            if isinstance(f.annotation, type)
            and issubclass(f.annotation, BaseModel)
            and loc[-1] in f.annotation.model_fields
        ]
    return f"unknown key (did you mean {' or '.join(map(repr, near))}?)" if near else "unknown key"
