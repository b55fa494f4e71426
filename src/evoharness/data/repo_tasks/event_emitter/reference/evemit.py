"""A synchronous event emitter: on/once/off, ordered emission, an optional "error" channel."""

__all__ = ["EventEmitter"]


class _Registration:
    __slots__ = ("listener", "once")

    def __init__(self, listener, once):
        self.listener, self.once = listener, once


class EventEmitter:
    def __init__(self, max_listeners=10):
        if max_listeners < 0:
            raise ValueError("max_listeners must be >= 0")
        self.max_listeners = max_listeners
        self._events = {}  # event -> list[_Registration]; dict order = first-registration order

    def _add(self, event, listener, once):
        if not callable(listener):
            raise TypeError("listener must be callable")
        regs = self._events.get(event, [])
        if self.max_listeners and len(regs) >= self.max_listeners:
            raise OverflowError(f"more than {self.max_listeners} listeners for {event!r}")
        regs.append(_Registration(listener, once))
        self._events[event] = regs
        return listener

    def on(self, event, listener):
        return self._add(event, listener, False)

    def once(self, event, listener):
        return self._add(event, listener, True)

    def listens_to(self, event):
        def decorator(fn):
            self.on(event, fn)
            return fn
        return decorator

    def _remove(self, event, reg):
        regs = self._events.get(event, [])
        if reg in regs:
            regs.remove(reg)
            if not regs:
                del self._events[event]

    def off(self, event, listener):
        for reg in reversed(self._events.get(event, [])):
            if reg.listener == listener:
                self._remove(event, reg)
                return True
        return False

    def remove_all(self, event=None):
        if event is None:
            self._events.clear()
        else:
            self._events.pop(event, None)

    def emit(self, event, *args, **kwargs):
        regs = list(self._events.get(event, []))
        if event == "error" and not regs:
            if args and isinstance(args[0], BaseException):
                raise args[0]
            raise RuntimeError(f"unhandled error event: {args!r}")
        called = 0
        for reg in regs:
            if reg.once:
                self._remove(event, reg)
            called += 1
            try:
                reg.listener(*args, **kwargs)
            except Exception as exc:
                if event == "error" or "error" not in self._events:
                    raise
                self.emit("error", exc, event)
        return called

    def listeners(self, event):
        return [reg.listener for reg in self._events.get(event, [])]

    def listener_count(self, event):
        return len(self._events.get(event, []))

    def event_names(self):
        return list(self._events)
