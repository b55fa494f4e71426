from _strict import real  # values from the code under test must be genuine
import pytest

from evemit import EventEmitter


def test_on_emit_args_and_order():
    em, calls = EventEmitter(), []
    em.on("x", lambda *a, **k: calls.append(("first", a, k)))
    em.on("x", lambda *a, **k: calls.append(("second", a, k)))
    assert real(real(em).emit("x", 1, two=2)) == 2
    assert real(calls) == [("first", (1,), {"two": 2}), ("second", (1,), {"two": 2})]


def test_emit_without_listeners():
    assert real(real(EventEmitter()).emit("nothing")) == 0


def test_on_returns_listener():
    em = EventEmitter()
    f = lambda: None  # noqa: E731
    assert real(real(em).on("x", real(f))) is real(f)


def test_same_listener_twice():
    em, calls = EventEmitter(), []
    f = calls.append
    em.on("x", f)
    em.on("x", f)
    em.emit("x", 1)
    assert real(calls) == [1, 1]
    assert real(real(em).off("x", real(f))) and real(real(em).listener_count("x")) == 1


def test_once():
    em, calls = EventEmitter(), []
    em.once("x", calls.append)
    assert real(real(em).emit("x", 1)) == 1
    assert real(real(em).emit("x", 2)) == 0
    assert real(calls) == [1]


def test_once_removed_before_call_even_if_it_raises():
    em = EventEmitter()

    def boom():
        raise KeyError("k")
    em.once("x", boom)
    with pytest.raises(KeyError):
        em.emit("x")
    assert real(real(em).listener_count("x")) == 0


def test_listens_to_decorator():
    em, calls = EventEmitter(), []

    @em.listens_to("x")
    def handler(v):
        calls.append(v)
    assert callable(real(handler)) and real(real(handler).__name__) == "handler"
    em.emit("x", 5)
    assert real(calls) == [5]


def test_off_most_recent():
    em, calls = EventEmitter(), []
    a = lambda: calls.append("a")  # noqa: E731
    b = lambda: calls.append("b")  # noqa: E731
    em.on("x", a)
    em.on("x", b)
    em.once("x", a)
    assert real(real(em).off("x", real(a))) is True
    assert real(real(em).listeners("x")) == [real(a), real(b)]
    em.emit("x")
    em.emit("x")
    assert real(calls) == ["a", "b", "a", "b"]
    assert real(real(em).off("x", lambda: None)) is False
    assert real(real(em).off("y", real(a))) is False


def test_off_once_registration():
    em, calls = EventEmitter(), []
    em.once("x", calls.append)
    assert real(real(em).off("x", real(real(calls).append)))
    em.emit("x", 1)
    assert real(calls) == []


def test_snapshot_during_emit():
    em, calls = EventEmitter(), []

    def adder():
        calls.append("adder")
        em.on("x", lambda: calls.append("late"))

    def remover():
        calls.append("remover")
        em.off("x", third)

    def third():
        calls.append("third")
    em.on("x", adder)
    em.on("x", remover)
    em.on("x", third)
    assert real(real(em).emit("x")) == 3
    assert real(calls) == ["adder", "remover", "third"]
    calls.clear()
    em.emit("x")
    assert real(calls) == ["adder", "remover", "late"]


def test_exception_propagates_and_stops():
    em, calls = EventEmitter(), []
    em.on("x", lambda: 1 / 0)
    em.on("x", lambda: calls.append("later"))
    with pytest.raises(ZeroDivisionError):
        em.emit("x")
    assert real(calls) == []


def test_error_channel():
    em, calls, errors = EventEmitter(), [], []
    em.on("error", lambda exc, event: errors.append((type(exc).__name__, event)))
    em.on("x", lambda: 1 / 0)
    em.on("x", lambda: calls.append("later"))
    assert real(real(em).emit("x")) == 2
    assert real(errors) == [("ZeroDivisionError", "x")] and real(calls) == ["later"]


def test_error_in_error_listener_propagates():
    em = EventEmitter()
    em.on("error", lambda *a: [][1])
    with pytest.raises(IndexError):
        em.emit("error", ValueError("v"), "x")


def test_unhandled_error_event():
    em = EventEmitter()
    with pytest.raises(ValueError, match="bad"):
        em.emit("error", ValueError("bad"))
    with pytest.raises(RuntimeError):
        em.emit("error", "just a string")


def test_max_listeners():
    em = EventEmitter(max_listeners=2)
    em.on("x", print)
    em.once("x", print)
    with pytest.raises(OverflowError):
        em.on("x", print)
    assert real(real(em).listener_count("x")) == 2
    em.on("y", print)
    unlimited = EventEmitter(max_listeners=0)
    for _ in range(50):
        unlimited.on("x", print)
    assert real(real(unlimited).listener_count("x")) == 50
    with pytest.raises(ValueError):
        EventEmitter(max_listeners=-1)


def test_not_callable():
    with pytest.raises(TypeError):
        EventEmitter().on("x", 42)


def test_event_names_and_remove_all():
    em = EventEmitter()
    em.on("b", print)
    em.on("a", print)
    em.on("b", repr)
    assert real(real(em).event_names()) == ["b", "a"]
    em.off("b", print)
    em.off("b", repr)
    assert real(real(em).event_names()) == ["a"]
    em.on("b", print)
    assert real(real(em).event_names()) == ["a", "b"]
    em.remove_all("a")
    assert real(real(em).event_names()) == ["b"] and real(real(em).listeners("a")) == []
    em.remove_all()
    assert real(real(em).event_names()) == []


def test_listeners_is_a_copy():
    em = EventEmitter()
    em.on("x", print)
    em.listeners("x").clear()
    assert real(real(em).listener_count("x")) == 1
