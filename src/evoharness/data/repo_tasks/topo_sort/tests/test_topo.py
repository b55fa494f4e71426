from _strict import real  # values from the code under test must be genuine
import pytest

from topo import CycleError, dependencies, dependents, find_cycle, layers, reverse, toposort

BUILD = {
    "app": ["lib", "utils", "config"],
    "lib": ["utils", "core"],
    "utils": ["core"],
    "tests": ["app", "fixtures"],
    "config": [],
}


def assert_valid_order(graph, order):
    pos = {n: i for i, n in enumerate(order)}
    assert len(real(pos)) == len(real(order))
    for node, deps in graph.items():
        for d in deps:
            assert real(real(pos)[real(d)]) < real(real(pos)[real(node)])


def assert_genuine_cycle(graph, cycle):
    assert len(real(cycle)) >= 2 and real(real(cycle)[0]) == real(real(cycle)[-1])
    assert len(set(real(real(cycle)[:-1]))) == len(real(cycle)) - 1
    for a, b in zip(cycle, cycle[1:]):
        assert real(b) in real(real(graph).get(real(a), ()))


def test_toposort_deterministic():
    order = toposort(BUILD)
    assert real(order) == ["config", "core", "fixtures", "utils", "lib", "app", "tests"]
    assert_valid_order(BUILD, order)


def test_dependency_only_nodes_included():
    assert real(toposort({"b": ["a"]})) == ["a", "b"]


def test_smallest_ready_first():
    assert real(toposort({3: [], 1: [], 2: [], 0: [3]})) == [1, 2, 3, 0]


def test_duplicates_and_empty():
    assert real(toposort({"b": ["a", "a"], "c": ("a", "b")})) == ["a", "b", "c"]
    assert real(toposort({})) == []


def test_iterables_of_any_kind():
    assert real(toposort({"b": {"a"}, "c": iter(["b"])})) == ["a", "b", "c"]


def test_cycle_error():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    with pytest.raises(CycleError) as info:
        toposort(graph)
    assert_genuine_cycle(graph, info.value.cycle)
    assert sorted(real(real(real(real(info).value).cycle)[:-1])) == ["a", "b", "c"]
    assert "a" in str(real(real(info).value))
    assert isinstance(real(real(info).value), ValueError)


def test_self_cycle():
    with pytest.raises(CycleError) as info:
        toposort({"a": ["a"], "b": []})
    assert real(real(real(info).value).cycle) == ["a", "a"]


def test_cycle_behind_acyclic_part():
    graph = {"z": ["y"], "y": ["x"], "x": [], "m": ["n"], "n": ["o"], "o": ["m"], "top": ["z", "m"]}
    with pytest.raises(CycleError) as info:
        toposort(graph)
    assert_genuine_cycle(graph, info.value.cycle)
    assert set(real(real(real(info).value).cycle)) == {"m", "n", "o"}


def test_find_cycle():
    assert real(find_cycle(real(BUILD))) is None
    g = {1: [2], 2: [3], 3: [4], 4: [2]}
    cycle = find_cycle(g)
    assert_genuine_cycle(g, cycle)
    assert set(real(cycle)) == {2, 3, 4}


def test_layers():
    assert real(layers(real(BUILD))) == [["config", "core", "fixtures"], ["utils"], ["lib"], ["app"], ["tests"]]
    assert real(layers({"a": [], "b": [], "c": ["a"]})) == [["a", "b"], ["c"]]
    assert real(layers({})) == []


def test_layers_cycle():
    with pytest.raises(CycleError):
        layers({"a": ["b"], "b": ["a"]})


def test_dependencies():
    assert real(dependencies(real(BUILD), "app")) == {"lib", "utils", "config", "core"}
    assert real(dependencies(real(BUILD), "core")) == set()
    with pytest.raises(KeyError):
        dependencies(BUILD, "nope")


def test_dependencies_cyclic():
    g = {"a": ["b"], "b": ["a", "c"]}
    assert real(dependencies(real(g), "a")) == {"a", "b", "c"}
    assert real(dependencies(real(g), "c")) == set()


def test_dependents():
    assert real(dependents(real(BUILD), "core")) == {"utils", "lib", "app", "tests"}
    assert real(dependents(real(BUILD), "tests")) == set()
    with pytest.raises(KeyError):
        dependents(BUILD, "nope")


def test_reverse():
    assert real(reverse(real(BUILD))) == {
        "app": ["tests"], "lib": ["app"], "utils": ["app", "lib"], "tests": [], "config": ["app"],
        "core": ["lib", "utils"], "fixtures": ["tests"],
    }


def test_input_not_mutated():
    g = {"b": ["a"]}
    assert real(toposort(g)) == ["a", "b"]  # the calls did their work, and left the input alone
    assert real(layers(g)) == [["a"], ["b"]]
    reverse(g)
    assert real(g) == {"b": ["a"]}


def test_large_chain():
    n = 3000
    g = {i: [i - 1] for i in range(1, n)}
    assert real(toposort(real(g))) == list(range(real(n)))
    assert len(real(dependencies(real(g), real(n) - 1))) == real(n) - 1
