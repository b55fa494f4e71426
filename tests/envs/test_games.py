import json
import shutil
from pathlib import Path

import pytest

from evoharness.envs.alfworld.games import GameDataError, count_by_type, discover_games


def test_bundled_pack_has_the_official_panel(valid_seen):
    assert len(valid_seen) == 140
    assert list(count_by_type(valid_seen).values()) == [35, 13, 27, 16, 25, 24]
    assert [t.task_id for t in valid_seen] == sorted(t.task_id for t in valid_seen)
    assert len(discover_games("train")) == 600
    # ALFWorld's own split alias
    assert [t.task_id for t in discover_games("eval_in_distribution")] == [t.task_id for t in valid_seen]


def _copy_game(src: Path, dst: Path, solvable=None, task_type=None):
    dst.mkdir(parents=True)
    game = json.loads((src / "game.tw-pddl").read_text())
    if solvable is not None:
        game["solvable"] = solvable
    (dst / "game.tw-pddl").write_text(json.dumps(game))
    traj = json.loads((src / "traj_data.json").read_text())
    if task_type:
        traj["task_type"] = task_type
    (dst / "traj_data.json").write_text(json.dumps(traj))


def test_filter_matches_alfworld(tmp_path, one_per_type):
    """A split assembled by hand: ALFWorld's filter drops movable/Sliced paths,
    unsolvable games, unknown task types and folders without a game file."""
    src = Path(one_per_type[0].path).parent
    split = tmp_path / "json_2.1.1" / "valid_unseen"
    _copy_game(src, split / "pick_and_place_simple-A-None-B-1" / "trial_1")
    _copy_game(src, split / "pick_and_place_with_movable_recep-A-B-C-1" / "trial_2")
    _copy_game(src, split / "pick_and_place_simple-ASliced-None-B-1" / "trial_3")
    _copy_game(src, split / "pick_and_place_simple-A-None-B-2" / "trial_4", solvable=False)
    _copy_game(src, split / "pick_and_place_simple-A-None-B-3" / "trial_5", task_type="pick_two_sliced")
    (split / "pick_and_place_simple-A-None-B-4" / "trial_6").mkdir(parents=True)
    shutil.copy(src / "traj_data.json", split / "pick_and_place_simple-A-None-B-4" / "trial_6")
    games = discover_games("valid_unseen", str(tmp_path))
    assert [g.task_id for g in games] == ["pick_and_place_simple-A-None-B-1/trial_1"]
    assert games[0].split == "valid_unseen"
    # the json_2.1.1 folder itself is accepted too
    assert len(discover_games("eval_out_of_distribution", str(tmp_path / "json_2.1.1"))) == 1


def test_clear_errors(tmp_path):
    with pytest.raises(GameDataError, match="unknown split"):
        discover_games("validation")
    with pytest.raises(GameDataError, match="not found"):
        discover_games("valid_seen", str(tmp_path / "nope"))
    with pytest.raises(GameDataError, match="json_2.1.1"):
        discover_games("valid_seen", str(tmp_path))
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(GameDataError, match="no playable games"):
        discover_games("train", str(tmp_path))
    with pytest.raises(GameDataError, match="split 'valid_seen' not found"):
        discover_games("valid_seen", str(tmp_path))
