import pytest

from taskqueue import CycleError, Run, Scheduler


def build():
    s = Scheduler()
    s.add("fetch", 3)
    s.add("lint", 1, priority=5)
    s.add("compile", 4, deps=["fetch"])
    s.add("docs", 2, priority=1, deps=["fetch"])
    s.add("test", 5, deps=["compile"])
    s.add("package", 1, deps=["test", "docs", "lint"])
    return s


def test_single_worker_order():
    assert build().order() == ["lint", "fetch", "docs", "compile", "test", "package"]


def test_single_worker_runs():
    runs = build().run()
    assert runs[0] == Run("lint", 0, 0, 1)
    assert runs[-1] == Run("package", 0, 15, 16)
    assert all(a.end == b.start for a, b in zip(runs, runs[1:]))


def test_two_workers():
    assert build().run(2) == [
        Run("lint", 0, 0, 1), Run("fetch", 1, 0, 3), Run("docs", 0, 3, 5), Run("compile", 1, 3, 7),
        Run("test", 0, 7, 12), Run("package", 0, 12, 13),
    ]


def test_makespan():
    s = build()
    assert s.makespan(1) == 16 and s.makespan(2) == 13 and s.makespan(10) == 13
    assert Scheduler().makespan(3) == 0


def test_run_is_a_namedtuple():
    r = build().run()[0]
    assert (r.name, r.worker, r.start, r.end) == tuple(r)


def test_priority_then_insertion_order():
    s = Scheduler()
    for name, prio in [("a", 0), ("b", 2), ("c", 2), ("d", 1)]:
        s.add(name, 1, priority=prio)
    assert s.order() == ["b", "c", "d", "a"]


def test_lowest_free_worker_and_no_preemption():
    s = Scheduler()
    s.add("long", 10)
    s.add("short1", 1)
    s.add("short2", 1)
    s.add("urgent", 1, priority=100, deps=["short1"])
    assert s.run(2) == [Run("long", 0, 0, 10), Run("short1", 1, 0, 1), Run("urgent", 1, 1, 2), Run("short2", 1, 2, 3)]


def test_worker_idles_while_waiting():
    s = Scheduler()
    s.add("a", 2)
    s.add("b", 1, deps=["a"])
    assert s.run(3) == [Run("a", 0, 0, 2), Run("b", 0, 2, 3)]


def test_simultaneous_finishes_free_workers_together():
    s = Scheduler()
    s.add("x", 2)
    s.add("y", 2)
    s.add("z", 1, priority=1, deps=["x"])
    s.add("w", 1, priority=2)
    assert s.run(2) == [Run("w", 0, 0, 1), Run("x", 1, 0, 2), Run("y", 0, 1, 3), Run("z", 1, 2, 3)]


def test_float_durations():
    s = Scheduler()
    s.add("a", 0.5)
    s.add("b", 1.25, deps=["a"])
    assert s.makespan() == pytest.approx(1.75)


def test_forward_references():
    s = Scheduler()
    s.add("b", 1, deps=["a"])
    s.add("a", 1)
    assert s.order() == ["a", "b"]


@pytest.mark.parametrize("duration", [0, -1, "3", None, True])
def test_bad_duration(duration):
    with pytest.raises(ValueError):
        Scheduler().add("a", duration)


def test_duplicate_and_self_dependency():
    s = Scheduler()
    s.add("a", 1)
    with pytest.raises(ValueError):
        s.add("a", 2)
    with pytest.raises(ValueError):
        s.add("b", 1, deps=["b"])
    assert len(s) == 1 and "b" not in s


def test_unknown_dependency():
    s = Scheduler()
    s.add("a", 1, deps=["ghost"])
    with pytest.raises(KeyError):
        s.run()
    with pytest.raises(KeyError):
        s.critical_path()


def test_cycle():
    s = Scheduler()
    s.add("a", 1, deps=["c"])
    s.add("b", 1, deps=["a"])
    s.add("c", 1, deps=["b"])
    s.add("free", 1)
    with pytest.raises(CycleError) as info:
        s.run(2)
    cyc = info.value.cycle
    assert cyc[0] == cyc[-1] and sorted(cyc[:-1]) == ["a", "b", "c"]
    deps = {"a": "c", "b": "a", "c": "b"}
    assert all(deps[x] == y for x, y in zip(cyc, cyc[1:]))
    assert isinstance(info.value, ValueError)


def test_bad_workers():
    with pytest.raises(ValueError):
        build().run(0)


def test_remove_cascades():
    s = build()
    assert s.remove("compile") == ["compile", "package", "test"]
    assert len(s) == 3 and "test" not in s
    assert s.order() == ["lint", "fetch", "docs"]
    with pytest.raises(KeyError):
        s.remove("compile")


def test_critical_path():
    assert build().critical_path() == (13, ["fetch", "compile", "test", "package"])
    assert Scheduler().critical_path() == (0, [])


def test_critical_path_ties():
    s = Scheduler()
    s.add("x", 2)
    s.add("y", 2)
    s.add("z", 1, deps=["y", "x"])
    s.add("w", 3)
    assert s.critical_path() == (3, ["x", "z"])


def test_critical_path_equals_unbounded_makespan():
    s = Scheduler()
    for i in range(30):
        s.add(f"t{i}", (i * 7) % 5 + 1, priority=i % 3, deps=[f"t{j}" for j in range(max(0, i - 3), i) if (i + j) % 2])
    assert s.critical_path()[0] == s.makespan(workers=30)
    assert s.makespan(1) == sum((i * 7) % 5 + 1 for i in range(30))


def test_run_does_not_consume_tasks():
    s = build()
    assert s.run(2) == s.run(2) and len(s) == 6
