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
    assert len(pos) == len(order)
    for node, deps in graph.items():
        for d in deps:
            assert pos[d] < pos[node]


def assert_genuine_cycle(graph, cycle):
    assert len(cycle) >= 2 and cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1
    for a, b in zip(cycle, cycle[1:]):
        assert b in graph.get(a, ())


def test_toposort_deterministic():
    order = toposort(BUILD)
    assert order == ["config", "core", "fixtures", "utils", "lib", "app", "tests"]
    assert_valid_order(BUILD, order)


def test_dependency_only_nodes_included():
    assert toposort({"b": ["a"]}) == ["a", "b"]


def test_smallest_ready_first():
    assert toposort({3: [], 1: [], 2: [], 0: [3]}) == [1, 2, 3, 0]


def test_duplicates_and_empty():
    assert toposort({"b": ["a", "a"], "c": ("a", "b")}) == ["a", "b", "c"]
    assert toposort({}) == []


def test_iterables_of_any_kind():
    assert toposort({"b": {"a"}, "c": iter(["b"])}) == ["a", "b", "c"]


def test_cycle_error():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    with pytest.raises(CycleError) as info:
        toposort(graph)
    assert_genuine_cycle(graph, info.value.cycle)
    assert sorted(info.value.cycle[:-1]) == ["a", "b", "c"]
    assert "a" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_self_cycle():
    with pytest.raises(CycleError) as info:
        toposort({"a": ["a"], "b": []})
    assert info.value.cycle == ["a", "a"]


def test_cycle_behind_acyclic_part():
    graph = {"z": ["y"], "y": ["x"], "x": [], "m": ["n"], "n": ["o"], "o": ["m"], "top": ["z", "m"]}
    with pytest.raises(CycleError) as info:
        toposort(graph)
    assert_genuine_cycle(graph, info.value.cycle)
    assert set(info.value.cycle) == {"m", "n", "o"}


def test_find_cycle():
    assert find_cycle(BUILD) is None
    g = {1: [2], 2: [3], 3: [4], 4: [2]}
    cycle = find_cycle(g)
    assert_genuine_cycle(g, cycle)
    assert set(cycle) == {2, 3, 4}


def test_layers():
    assert layers(BUILD) == [["config", "core", "fixtures"], ["utils"], ["lib"], ["app"], ["tests"]]
    assert layers({"a": [], "b": [], "c": ["a"]}) == [["a", "b"], ["c"]]
    assert layers({}) == []


def test_layers_cycle():
    with pytest.raises(CycleError):
        layers({"a": ["b"], "b": ["a"]})


def test_dependencies():
    assert dependencies(BUILD, "app") == {"lib", "utils", "config", "core"}
    assert dependencies(BUILD, "core") == set()
    with pytest.raises(KeyError):
        dependencies(BUILD, "nope")


def test_dependencies_cyclic():
    g = {"a": ["b"], "b": ["a", "c"]}
    assert dependencies(g, "a") == {"a", "b", "c"}
    assert dependencies(g, "c") == set()


def test_dependents():
    assert dependents(BUILD, "core") == {"utils", "lib", "app", "tests"}
    assert dependents(BUILD, "tests") == set()
    with pytest.raises(KeyError):
        dependents(BUILD, "nope")


def test_reverse():
    assert reverse(BUILD) == {
        "app": ["tests"], "lib": ["app"], "utils": ["app", "lib"], "tests": [], "config": ["app"],
        "core": ["lib", "utils"], "fixtures": ["tests"],
    }


def test_input_not_mutated():
    g = {"b": ["a"]}
    toposort(g)
    layers(g)
    reverse(g)
    assert g == {"b": ["a"]}


def test_large_chain():
    n = 3000
    g = {i: [i - 1] for i in range(1, n)}
    assert toposort(g) == list(range(n))
    assert len(dependencies(g, n - 1)) == n - 1
