"""Build the bundled ALFWorld pack (src/evoharness/data/alfworld/pack.tar.xz).

Usage: python scripts/build_pack.py [--shared ../shared/data/alfworld] [--train-per-type 100]

Takes every valid_seen game and an evenly spaced, deterministic subset of the
train games per task type (ALFWorld's filter applied first), in the official
json_2.1.1 layout.
"""

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[1].parent / "shared/data/alfworld"))
ap.add_argument("--train-per-type", type=int, default=100)
ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "src/evoharness/data/alfworld/pack.tar.xz"))
args = ap.parse_args()

TYPES = [
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
]

with tempfile.TemporaryDirectory() as tmp:
    for split in ("valid_seen", "train"):
        with tarfile.open(Path(args.shared) / f"alfworld-json_2.1.1-{split}.tar.xz") as tf:
            tf.extractall(tmp, filter="data")
    root = Path(tmp) / "json_2.1.1"
    members = []
    for split in ("valid_seen", "train"):
        by_type = {t: [] for t in TYPES}
        for traj in sorted((root / split).glob("*/*/traj_data.json")):
            rel = traj.parent.relative_to(root / split).as_posix()
            if "movable" in rel or "Sliced" in rel:
                continue
            tt = json.loads(traj.read_text())["task_type"]
            if tt in by_type and json.loads((traj.parent / "game.tw-pddl").read_text()).get("solvable") is True:
                by_type[tt].append(traj.parent)
        for tt, dirs in by_type.items():
            if split == "train" and len(dirs) > args.train_per_type:
                step = len(dirs) / args.train_per_type
                dirs = [dirs[int(i * step)] for i in range(args.train_per_type)]
            members += dirs
            print(split, tt, len(dirs))
    with tarfile.open(args.out, "w:xz", preset=9) as out:
        for d in members:
            for name in ("traj_data.json", "game.tw-pddl"):
                p = d / name
                info = out.gettarinfo(str(p), arcname=p.relative_to(Path(tmp)).as_posix())
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(p, "rb") as f:
                    out.addfile(info, f)
print("wrote", args.out, Path(args.out).stat().st_size // 1024, "KiB")
