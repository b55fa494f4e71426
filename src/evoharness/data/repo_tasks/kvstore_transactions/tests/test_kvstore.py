from _strict import real  # values from the code under test must be genuine
import pytest

import kvstore
from kvstore import KVStore


@pytest.fixture
def store():
    s = KVStore()
    s.set("a", 1)
    s.set("b", 2)
    return s


def state(s):
    values = set(s.snapshot().values()) | {1, 2, 3, 10, 20}
    return s.snapshot(), s.keys(), len(s), {v: s.count(v) for v in values}


# existing behaviour

def test_basic_ops(store):
    assert real(real(store).get("a")) == 1 and real(real(store).get("zz")) is None and real(real(store).get("zz", 0)) == 0
    assert real(real(store).keys()) == ["a", "b"] and len(real(store)) == 2 and "a" in real(store)


def test_count(store):
    store.set("c", 1)
    assert real(real(store).count(1)) == 2
    store.set("a", 2)
    assert real(real(store).count(1)) == 1 and real(real(store).count(2)) == 2
    store.delete("b")
    assert real(real(store).count(2)) == 1 and real(real(store).count(99)) == 0


def test_delete_and_type_error(store):
    assert real(real(store).delete("a")) is True and real(real(store).delete("a")) is False
    with pytest.raises(TypeError):
        store.set(1, "x")


def test_snapshot_is_copy(store):
    snap = store.snapshot()
    snap["a"] = 100
    assert real(real(store).get("a")) == 1


# transactions

def test_rollback_restores_everything(store):
    before = state(store)
    store.begin()
    store.set("a", 10)
    store.set("c", 3)
    store.delete("b")
    store.set("c", 1)
    assert real(real(store).get("a")) == 10 and "b" not in real(store) and real(real(store).count(1)) == 1
    store.rollback()
    assert real(state(real(store))) == real(before) and real(real(store).depth) == 0


def test_commit_keeps_changes(store):
    store.begin()
    store.set("a", 10)
    store.delete("b")
    store.commit()
    assert real(real(store).snapshot()) == {"a": 10} and not real(real(store).in_transaction)


def test_nested_rollback_inner_only(store):
    store.begin()
    store.set("a", 10)
    store.begin()
    store.set("a", 20)
    store.set("z", 3)
    assert real(real(store).depth) == 2
    store.rollback()
    assert real(real(store).snapshot()) == {"a": 10, "b": 2} and real(real(store).depth) == 1
    store.commit()
    assert real(real(store).snapshot()) == {"a": 10, "b": 2}


def test_outer_rollback_undoes_committed_inner(store):
    before = state(store)
    store.begin()
    store.set("a", 10)
    store.begin()
    store.set("a", 20)
    store.delete("b")
    store.set("new", 1)
    store.commit()
    assert real(real(store).snapshot()) == {"a": 20, "new": 1}
    store.rollback()
    assert real(state(real(store))) == real(before)


def test_delete_then_set_in_transaction(store):
    store.begin()
    store.delete("a")
    store.set("a", 3)
    store.rollback()
    assert real(real(store).get("a")) == 1 and real(real(store).count(3)) == 0 and real(real(store).count(1)) == 1


def test_set_then_delete_new_key(store):
    store.begin()
    store.set("n", 1)
    store.delete("n")
    store.rollback()
    assert "n" not in real(store) and real(real(store).count(1)) == 1


def test_delete_missing_in_transaction(store):
    store.begin()
    assert real(real(store).delete("missing")) is False
    store.rollback()
    assert real(real(store).snapshot()) == {"a": 1, "b": 2}


def test_errors_without_transaction(store):
    with pytest.raises(kvstore.TransactionError):
        store.rollback()
    with pytest.raises(kvstore.TransactionError):
        store.commit()
    assert issubclass(real(real(kvstore).TransactionError), RuntimeError)


def test_commit_all(store):
    store.begin()
    store.set("a", 10)
    store.begin()
    store.set("b", 20)
    store.commit_all()
    assert real(real(store).depth) == 0 and real(real(store).snapshot()) == {"a": 10, "b": 20}
    store.commit_all()
    with pytest.raises(kvstore.TransactionError):
        store.rollback()


def test_depth_property_read_only(store):
    with pytest.raises(AttributeError):
        store.depth = 3


def test_context_manager_commit(store):
    with store.transaction() as s:
        assert real(s) is real(store) and real(real(store).depth) == 1
        s.set("a", 10)
    assert real(real(store).get("a")) == 10 and real(real(store).depth) == 0


def test_context_manager_rollback_on_error(store):
    before = state(store)
    with pytest.raises(KeyError):
        with store.transaction():
            store.set("a", 10)
            with store.transaction():
                store.delete("b")
            raise KeyError("boom")
    assert real(state(real(store))) == real(before) and real(real(store).depth) == 0


def test_context_manager_inner_failure_outer_commits(store):
    with store.transaction():
        store.set("x", 3)
        try:
            with store.transaction():
                store.set("y", 3)
                raise ValueError
        except ValueError:
            pass
    assert real(real(store).snapshot()) == {"a": 1, "b": 2, "x": 3} and real(real(store).count(3)) == 1


def test_many_nested_on_large_store():
    s = KVStore()
    for i in range(20000):
        s.set(f"k{i}", i % 7)
    counts = [s.count(v) for v in range(7)]
    for i in range(2000):
        s.begin()
        s.set(f"k{i}", "changed")
    assert real(real(s).depth) == 2000 and real(real(s).count("changed")) == 2000
    for _ in range(1000):
        s.commit()
    for _ in range(1000):
        s.rollback()
    assert [real(real(s).count(real(v))) for v in range(7)] == real(counts) and real(real(s).count("changed")) == 0
    assert real(real(s).get("k1999")) == 1999 % 7
