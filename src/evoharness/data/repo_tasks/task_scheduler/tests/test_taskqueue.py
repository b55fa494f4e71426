from _strict import real  # values from the code under test must be genuine
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
    assert real(real(build()).order()) == ["lint", "fetch", "docs", "compile", "test", "package"]


def test_single_worker_runs():
    runs = build().run()
    assert real(real(runs)[0]) == real(Run("lint", 0, 0, 1))
    assert real(real(runs)[-1]) == real(Run("package", 0, 15, 16))
    assert all(real(real(a).end) == real(real(b).start) for a, b in zip(real(runs), real(real(runs)[1:])))


def test_two_workers():
    assert real(real(build()).run(2)) == [
        real(Run("lint", 0, 0, 1)), real(Run("fetch", 1, 0, 3)), real(Run("docs", 0, 3, 5)), real(Run("compile", 1, 3, 7)),
        real(Run("test", 0, 7, 12)), real(Run("package", 0, 12, 13)),
    ]


def test_makespan():
    s = build()
    assert real(real(s).makespan(1)) == 16 and real(real(s).makespan(2)) == 13 and real(real(s).makespan(10)) == 13
    assert real(real(Scheduler()).makespan(3)) == 0


def test_run_is_a_namedtuple():
    r = build().run()[0]
    assert (real(real(r).name), real(real(r).worker), real(real(r).start), real(real(r).end)) == tuple(real(r))


def test_priority_then_insertion_order():
    s = Scheduler()
    for name, prio in [("a", 0), ("b", 2), ("c", 2), ("d", 1)]:
        s.add(name, 1, priority=prio)
    assert real(real(s).order()) == ["b", "c", "d", "a"]


def test_lowest_free_worker_and_no_preemption():
    s = Scheduler()
    s.add("long", 10)
    s.add("short1", 1)
    s.add("short2", 1)
    s.add("urgent", 1, priority=100, deps=["short1"])
    assert real(real(s).run(2)) == [real(Run("long", 0, 0, 10)), real(Run("short1", 1, 0, 1)), real(Run("urgent", 1, 1, 2)), real(Run("short2", 1, 2, 3))]


def test_worker_idles_while_waiting():
    s = Scheduler()
    s.add("a", 2)
    s.add("b", 1, deps=["a"])
    assert real(real(s).run(3)) == [real(Run("a", 0, 0, 2)), real(Run("b", 0, 2, 3))]


def test_simultaneous_finishes_free_workers_together():
    s = Scheduler()
    s.add("x", 2)
    s.add("y", 2)
    s.add("z", 1, priority=1, deps=["x"])
    s.add("w", 1, priority=2)
    assert real(real(s).run(2)) == [real(Run("w", 0, 0, 1)), real(Run("x", 1, 0, 2)), real(Run("y", 0, 1, 3)), real(Run("z", 1, 2, 3))]


def test_float_durations():
    s = Scheduler()
    s.add("a", 0.5)
    s.add("b", 1.25, deps=["a"])
    assert real(real(s).makespan()) == pytest.approx(1.75)


def test_forward_references():
    s = Scheduler()
    s.add("b", 1, deps=["a"])
    s.add("a", 1)
    assert real(real(s).order()) == ["a", "b"]


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
    assert len(real(s)) == 1 and "b" not in real(s)


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
    assert real(real(cyc)[0]) == real(real(cyc)[-1]) and sorted(real(real(cyc)[:-1])) == ["a", "b", "c"]
    deps = {"a": "c", "b": "a", "c": "b"}
    assert all(real(real(deps)[real(x)]) == real(y) for x, y in zip(real(cyc), real(real(cyc)[1:])))
    assert isinstance(real(real(info).value), ValueError)


def test_bad_workers():
    with pytest.raises(ValueError):
        build().run(0)


def test_remove_cascades():
    s = build()
    assert real(real(s).remove("compile")) == ["compile", "package", "test"]
    assert len(real(s)) == 3 and "test" not in real(s)
    assert real(real(s).order()) == ["lint", "fetch", "docs"]
    with pytest.raises(KeyError):
        s.remove("compile")


def test_critical_path():
    assert real(real(build()).critical_path()) == (13, ["fetch", "compile", "test", "package"])
    assert real(real(Scheduler()).critical_path()) == (0, [])


def test_critical_path_ties():
    s = Scheduler()
    s.add("x", 2)
    s.add("y", 2)
    s.add("z", 1, deps=["y", "x"])
    s.add("w", 3)
    assert real(real(s).critical_path()) == (3, ["x", "z"])


def test_critical_path_equals_unbounded_makespan():
    s = Scheduler()
    for i in range(30):
        s.add(f"t{i}", (i * 7) % 5 + 1, priority=i % 3, deps=[f"t{j}" for j in range(max(0, i - 3), i) if (i + j) % 2])
    assert real(real(real(s).critical_path())[0]) == real(real(s).makespan(workers=30))
    assert real(real(s).makespan(1)) == sum((real(i) * 7) % 5 + 1 for i in range(30))


def test_run_does_not_consume_tasks():
    s = build()
    assert real(real(s).run(2)) == real(real(s).run(2)) and len(real(s)) == 6
