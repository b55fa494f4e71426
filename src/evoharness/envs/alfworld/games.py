"""ALFWorld game discovery: the official layout, ALFWorld's own filter, the bundled pack.

Layout (what ``$ALFWORLD_DATA`` holds after ALFWorld's download)::

    json_2.1.1/<split>/<task_type-Object-MRecep-Recep-Scene>/<trial_id>/{game.tw-pddl,traj_data.json}

A game counts (ALFWorld's ``AlfredTWEnv.collect_game_files``) when its
``traj_data.json`` task type is one of the 6 types, its path has neither
``movable`` nor ``Sliced``, and ``game.tw-pddl`` says ``"solvable": true``.

The bundled pack (``evoharness/data/alfworld/pack.tar.xz``, MIT, see LICENSE
beside it) holds the 140 valid_seen games and a train subset in that layout; it
is unpacked once into a cache directory so a fresh machine needs no download.
Beside it, ``scene_heldout.tar.xz`` holds split ``valid_unseen_scenes``
(`SCENE_HELDOUT_SPLIT`): ALFWorld train games of whole floor plans (scenes) the
main job never trains or develops on (built by scripts/build_scene_panel.py). It is
unpacked into the same directory; with another data path that lacks the split, the
bundled one is played. Not ``valid_unseen``: that is ALFWorld's own held-out test.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from importlib import resources
from pathlib import Path

from evoharness.config.env import TASK_TYPES
from evoharness.envs.base import TaskSpec

# Short names used in tables (the papers' Pick/Look/Clean/Heat/Cool/Pick2 columns).
TASK_SHORT = dict(zip(TASK_TYPES, ("pick", "look", "clean", "heat", "cool", "pick2")))

# ALFWorld train games of floor plans the main job never trains or develops on (the bundled panel)
SCENE_HELDOUT_SPLIT = "valid_unseen_scenes"
SPLITS = ("train", "valid_seen", "valid_unseen", SCENE_HELDOUT_SPLIT)
SPLIT_ALIASES = {"eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}


class GameDataError(RuntimeError):
    """Game data missing or malformed; the message says where and what to do."""


def pack_path() -> Path:
    return Path(str(resources.files("evoharness") / "data" / "alfworld" / "pack.tar.xz"))


def scene_panel_path() -> Path:
    """The bundled scene-held-out panel (split `SCENE_HELDOUT_SPLIT`)."""
    return Path(str(resources.files("evoharness") / "data" / "alfworld" / "scene_heldout.tar.xz"))


def scene_of(task_id: str) -> int | None:
    """The floor plan (ALFRED scene number) of a game: the last dash field of its task folder
    (``pick_and_place_simple-Book-None-Sofa-229/trial_...`` -> 229; None when it is not a number).
    Kitchens are 1-30, living rooms 201-230, bedrooms 301-330, bathrooms 401-430."""
    last = task_id.split("/")[0].rsplit("-", 1)[-1]
    return int(last) if last.isdigit() else None


def default_cache_dir() -> Path:
    return Path(os.environ.get("EVOHARNESS_CACHE", Path.home() / ".cache" / "evoharness"))


def bundled_data_root(cache_dir: Path | None = None) -> Path:
    """Unpack the bundled pack and scene panel (once, atomically) and return their ALFWORLD_DATA root."""
    archives = [pack_path(), scene_panel_path()]
    for a in archives:
        if not a.is_file():
            raise GameDataError(f"bundled ALFWorld games missing at {a}; reinstall evoharness")
    sha = hashlib.sha256()
    for a in archives:
        sha.update(hashlib.sha256(a.read_bytes()).digest())
    digest = sha.hexdigest()[:12]
    root = (cache_dir or default_cache_dir()) / f"alfworld-pack-{digest}"
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for a in archives:
        with tarfile.open(a) as tf:
            tf.extractall(tmp, filter="data")
    (tmp / ".complete").write_text(digest)
    try:
        os.replace(tmp, root)
    except OSError:  # another process won the race; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return root


def resolve_data_root(data_path: str | None) -> Path:
    """``None``/``"bundled"`` -> the bundled pack; else a directory holding
    ``json_2.1.1/`` (or that directory itself). ``$ALFWORLD_DATA`` is used when
    ``data_path`` is ``"env"``."""
    if data_path in (None, "", "bundled"):
        return bundled_data_root()
    if data_path == "env":
        data_path = os.environ.get("ALFWORLD_DATA")
        if not data_path:
            raise GameDataError("data_path='env' but $ALFWORLD_DATA is not set")
    root = Path(os.path.expandvars(os.path.expanduser(data_path)))
    if not root.is_dir():
        raise GameDataError(f"ALFWorld data path not found: {root}")
    if root.name == "json_2.1.1":
        root = root.parent
    if not (root / "json_2.1.1").is_dir():
        raise GameDataError(f"{root} has no json_2.1.1/ folder (expected $ALFWORLD_DATA layout)")
    return root


def discover_games(
    split: str, data_path: str | None = None, task_types: tuple[str, ...] = TASK_TYPES
) -> list[TaskSpec]:
    """All games of a split that pass ALFWorld's filter, sorted by task id.

    Args:
        split: ``train``, ``valid_seen``, ``valid_unseen`` (or ALFWorld's
            ``eval_in_distribution`` / ``eval_out_of_distribution``), or
            ``valid_unseen_scenes`` (`SCENE_HELDOUT_SPLIT`: the bundled one when the data
            path has none).
        data_path: see `resolve_data_root`.
        task_types: keep only these task types.

    Raises:
        GameDataError: unknown split, missing folder, or no game passes.
    """
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise GameDataError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    root = resolve_data_root(data_path)
    split_dir = root / "json_2.1.1" / split
    if split == SCENE_HELDOUT_SPLIT and not split_dir.is_dir():  # the bundled panel, whatever the data path
        split_dir = bundled_data_root() / "json_2.1.1" / split
    if not split_dir.is_dir():
        raise GameDataError(f"split {split!r} not found under {root / 'json_2.1.1'}")
    games: list[TaskSpec] = []
    for traj_path in sorted(split_dir.glob("*/*/traj_data.json")):
        folder = traj_path.parent
        rel = folder.relative_to(split_dir).as_posix()
        if "movable" in rel or "Sliced" in rel:
            continue
        game_file = folder / "game.tw-pddl"
        if not game_file.is_file():
            continue
        try:
            task_type = json.loads(traj_path.read_text())["task_type"]
            solvable = json.loads(game_file.read_text()).get("solvable")
        except (json.JSONDecodeError, KeyError, OSError) as e:
            raise GameDataError(f"malformed game files in {folder}: {e}") from e
        if task_type not in task_types or solvable is not True:
            continue
        games.append(TaskSpec(task_id=rel, task_type=task_type, split=split, path=str(game_file)))
    if not games:
        raise GameDataError(f"no playable games in {split_dir}")
    return games


def count_by_type(tasks: list[TaskSpec]) -> dict[str, int]:
    return {t: sum(x.task_type == t for x in tasks) for t in TASK_TYPES}
