"""Build the scene-held-out panel (src/evoharness/data/alfworld/scene_heldout.tar.xz).

Usage: python scripts/build_scene_panel.py [--shared ../shared/data/alfworld] [--per-type 20] [--seed 0]
                                           [--dry-run]

Unseen rooms: ALFWorld's train games of whole floor plans (scenes, the last dash field of a task
folder's name) that the main job never trains, teaches, screens, runs RL or develops on. The main job
drops every game of these scenes from the bundled pack's train games (`evoharness.pipeline.dev_split`
reads the scenes from this panel), so the scenes are chosen to drop as few of them as possible:

1. every scene of the ALFWorld train release that no train game of the bundled pack uses (free);
2. the further scenes that give every task type at least ``--per-type`` games in the held-out
   scenes and each of the four room kinds (kitchens 1-30, living rooms 201-230, bedrooms 301-330,
   bathrooms 401-430) at least ``--scenes-per-kind`` floor plans (2: no task type is measured in one
   room only; heat and cool games happen in kitchens alone), chosen for the fewest pack train games
   dropped, then the fewest valid_seen games in the held-out scenes (valid_seen stays a seen-room
   panel), then the fewest scenes, then a ``--seed`` shuffle;
3. ``--per-type`` games of each task type drawn (``--seed``) from the held-out scenes' train games.

Written in the official json_2.1.1 layout as split ``valid_unseen_scenes``
(``json_2.1.1/valid_unseen_scenes/<task>/<trial>/{game.tw-pddl,traj_data.json}``; the shared archive's
traj_data.json is already slimmed to the fields the environment reads), plus
``scene_heldout.json`` (the scenes, the game ids, what the choice cost). Deterministic: the same
inputs and seed give byte-identical files.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLIT = "valid_unseen_scenes"
KINDS = {
    "kitchen": range(1, 31),
    "living room": range(201, 231),
    "bedroom": range(301, 331),
    "bathroom": range(401, 431),
}


def scene(task: str) -> int:
    return int(task.split("/")[0].rsplit("-", 1)[1])


def kind(s: int) -> str:
    return next(k for k, r in KINDS.items() if s in r)


def release_games(archive: Path, split: str) -> dict[str, tuple[str, bytes, bytes]]:
    """task id -> (task type, game.tw-pddl, traj_data.json) of the games passing ALFWorld's filter."""
    files: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(archive) as tf:
        for m in tf:
            p = m.name.split("/")
            if m.isfile() and len(p) == 5 and p[1] == split and p[4] in ("game.tw-pddl", "traj_data.json"):
                files[f"{p[2]}/{p[3]}"][p[4]] = tf.extractfile(m).read()
    out = {}
    for tid, f in sorted(files.items()):
        if "movable" in tid or "Sliced" in tid or len(f) < 2:
            continue
        tt = json.loads(f["traj_data.json"])["task_type"]
        if tt in TYPES and json.loads(f["game.tw-pddl"]).get("solvable") is True:
            out[tid] = (tt, f["game.tw-pddl"], f["traj_data.json"])
    return out


def pack_ids(pack: Path, split: str) -> list[str]:
    with tarfile.open(pack) as tf:
        return sorted(
            "/".join(n.split("/")[2:4])
            for n in tf.getnames()
            if n.split("/")[1:2] == [split] and n.endswith(".tw-pddl")
        )


def choose_scenes(
    games: dict[str, str], pack_train: list[str], valid_seen: list[str], per_type: int, per_kind: int, seed: int
) -> tuple[list[int], list[int]]:
    """(free scenes, further scenes): see the module docstring. `games`: task id -> task type."""
    per_scene: dict[int, Counter] = defaultdict(Counter)
    for tid, tt in games.items():
        per_scene[scene(tid)][tt] += 1
    cost = Counter(scene(t) for t in pack_train)
    seen = Counter(scene(t) for t in valid_seen)
    free = sorted(s for s in per_scene if not cost[s])
    have = Counter()
    for s in free:
        have.update(per_scene[s])
    cands = sorted(s for s in per_scene if cost[s])
    random.Random(f"scene_panel:{seed}").shuffle(cands)
    rank = {s: i for i, s in enumerate(cands)}
    cands.sort(key=lambda s: cost[s])  # cheap first: the search's bounds prune early
    # what is still missing: games per task type, then floor plans per room kind
    need0 = tuple(max(0, per_type - have[t]) for t in TYPES) + tuple(
        max(0, per_kind - sum(kind(s) == k for s in free)) for k in KINDS
    )
    gives = [tuple(per_scene[s][t] for t in TYPES) + tuple(int(kind(s) == k) for k in KINDS) for s in cands]
    # cheapest[i][x]: the least cost of a candidate at i or later that helps with need x (a lower bound)
    inf = float("inf")
    cheapest = [[inf] * len(need0) for _ in range(len(cands) + 1)]
    for i in range(len(cands) - 1, -1, -1):
        cheapest[i] = [cost[cands[i]] if g else c for g, c in zip(gives[i], cheapest[i + 1])]
    best: list = [None, None]  # (key, scenes)

    def search(i: int, chosen: list[int], need: tuple[int, ...], c: int, vs: int) -> None:
        if best[0] is not None and (c, vs) > best[0][:2]:
            return
        if not any(need):
            key = (c, vs, len(chosen), sorted(rank[s] for s in chosen))
            if best[0] is None or key < best[0]:
                best[:] = [key, list(chosen)]
            return
        bound = max(cheapest[i][x] for x, n in enumerate(need) if n)
        if best[0] is not None and c + bound > best[0][0] or bound == inf:
            return
        for j in range(i, len(cands)):
            s = cands[j]
            if best[0] is not None and c + cost[s] > best[0][0]:
                break  # sorted by cost: every later one costs as much or more
            if any(n and g for n, g in zip(need, gives[j])):
                left = tuple(max(0, n - g) for n, g in zip(need, gives[j]))
                search(j + 1, chosen + [s], left, c + cost[s], vs + seen[s])

    search(0, [], need0, 0, 0)
    if best[1] is None:
        raise SystemExit(f"no set of scenes gives {per_type} games of every type")
    return free, sorted(best[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data" / "alfworld"))
    ap.add_argument("--pack", default=str(ROOT / "src/evoharness/data/alfworld/pack.tar.xz"))
    ap.add_argument("--per-type", type=int, default=20)
    ap.add_argument("--scenes-per-kind", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "src/evoharness/data/alfworld/scene_heldout.tar.xz"))
    ap.add_argument("--dry-run", action="store_true", help="print the choice, write nothing")
    args = ap.parse_args()

    release = release_games(Path(args.shared) / "alfworld-json_2.1.1-train.tar.xz", "train")
    pack_train, valid_seen = pack_ids(Path(args.pack), "train"), pack_ids(Path(args.pack), "valid_seen")
    free, extra = choose_scenes(
        {t: g[0] for t, g in release.items()}, pack_train, valid_seen, args.per_type, args.scenes_per_kind, args.seed
    )
    held = set(free) | set(extra)
    rng = random.Random(f"scene_panel_games:{args.seed}")
    panel: list[str] = []
    for tt in TYPES:
        pool = sorted(t for t, g in release.items() if g[0] == tt and scene(t) in held)
        panel += sorted(rng.sample(pool, args.per_type))
    dropped = [t for t in pack_train if scene(t) in held]
    info = {
        "split": SPLIT,
        "seed": args.seed,
        "per_type": args.per_type,
        "scenes_per_kind": args.scenes_per_kind,
        "scenes": sorted(held),
        "free_scenes": free,
        "further_scenes": extra,
        "scenes_by_kind": {k: sorted(s for s in held if kind(s) == k) for k in KINDS},
        "release_games_in_scenes": sum(scene(t) in held for t in release),
        "pack_train_games_dropped": len(dropped),
        "valid_seen_games_in_scenes": sum(scene(t) in held for t in valid_seen),
        "games_by_type": {tt: sum(release[t][0] == tt for t in panel) for tt in TYPES},
        "games": sorted(panel),
    }
    print(json.dumps({k: v for k, v in info.items() if k != "games"}, indent=1))
    if args.dry_run:
        return
    with tarfile.open(args.out, "w:xz", preset=9) as out:

        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            out.addfile(ti, io.BytesIO(data))

        for tid in sorted(panel):
            _, game, traj = release[tid]
            add(f"json_2.1.1/{SPLIT}/{tid}/traj_data.json", traj)
            add(f"json_2.1.1/{SPLIT}/{tid}/game.tw-pddl", game)
        add(f"json_2.1.1/{SPLIT}/scene_heldout.json", (json.dumps(info, indent=1) + "\n").encode())
    print("wrote", args.out, Path(args.out).stat().st_size // 1024, "KiB")


if __name__ == "__main__":
    main()
