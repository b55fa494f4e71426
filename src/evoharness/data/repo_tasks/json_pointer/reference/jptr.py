"""JSON Pointer (RFC 6901): parse, escape, resolve and set over plain JSON values."""

import re

__all__ = ["JsonPointerError", "InvalidPointerError", "ResolutionError", "escape", "unescape",
           "parse", "to_pointer", "resolve", "set_value"]

_BAD_ESCAPE = re.compile(r"~(?![01])")
_INDEX = re.compile(r"0|[1-9][0-9]*")
_MISSING = object()


class JsonPointerError(Exception):
    pass


class InvalidPointerError(JsonPointerError, ValueError):
    pass


class ResolutionError(JsonPointerError, LookupError):
    pass


def escape(token):
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token):
    if _BAD_ESCAPE.search(token):
        raise InvalidPointerError(f"bad escape in {token!r}")
    return token.replace("~1", "/").replace("~0", "~")


def parse(pointer):
    if not isinstance(pointer, str):
        raise InvalidPointerError("a pointer is a str")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise InvalidPointerError(f"pointer must start with '/': {pointer!r}")
    return [unescape(t) for t in pointer[1:].split("/")]


def to_pointer(tokens):
    return "".join("/" + escape(str(t)) for t in tokens)


def _step(node, token, pointer):
    if isinstance(node, dict):
        if token in node:
            return node[token]
    elif isinstance(node, list):
        if _INDEX.fullmatch(token) and int(token) < len(node):
            return node[int(token)]
    raise ResolutionError(f"{pointer!r}: cannot resolve token {token!r}")


def resolve(doc, pointer, default=_MISSING):
    tokens = parse(pointer)
    node = doc
    try:
        for token in tokens:
            node = _step(node, token, pointer)
    except ResolutionError:
        if default is _MISSING:
            raise
        return default
    return node


def set_value(doc, pointer, value):
    tokens = parse(pointer)
    if not tokens:
        return value
    parent = resolve(doc, to_pointer(tokens[:-1]))
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" or last == str(len(parent)):
            parent.append(value)
        elif _INDEX.fullmatch(last) and int(last) < len(parent):
            parent[int(last)] = value
        else:
            raise ResolutionError(f"{pointer!r}: bad list index {last!r}")
    else:
        raise ResolutionError(f"{pointer!r}: parent is not a container")
    return doc
