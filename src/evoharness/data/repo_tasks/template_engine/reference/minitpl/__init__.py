"""minitpl: a small Jinja-like template engine (if/for/set, filters, autoescape)."""

import re

from .errors import TemplateError, TemplateSyntaxError, UndefinedError
from .expr import Undefined, compile_expr, html_escape

__all__ = ["Template", "render", "TemplateError", "TemplateSyntaxError", "UndefinedError"]

_TAG = re.compile(r"\{\{(-?)(.*?)(-?)\}\}|\{%(-?)(.*?)(-?)%\}|\{#.*?#\}", re.S)
_OPENERS = re.compile(r"\{\{|\{%|\{#")
_FOR = re.compile(r"for\s+([A-Za-z_]\w*)(?:\s*,\s*([A-Za-z_]\w*))?\s+in\s+(.+)", re.S)
_SET = re.compile(r"set\s+([A-Za-z_]\w*)\s*=\s*(.+)", re.S)


def _check_unclosed(source, start, end):
    m = _OPENERS.search(source, start, end)
    if m is not None:
        raise TemplateSyntaxError("unclosed tag", source.count("\n", 0, m.start()) + 1)


def _lex(source):
    """List of ["text", s, line] / ["out"|"tag", body, line, trim_left, trim_right]."""
    items, pos = [], 0
    for m in _TAG.finditer(source):
        _check_unclosed(source, pos, m.start())
        line = source.count("\n", 0, m.start()) + 1
        items.append(["text", source[pos:m.start()], line])
        if m.group(0).startswith("{{"):
            items.append(["out", m.group(2), line, m.group(1), m.group(3)])
        elif m.group(0).startswith("{%"):
            items.append(["tag", m.group(5), line, m.group(4), m.group(6)])
        pos = m.end()
    _check_unclosed(source, pos, len(source))
    items.append(["text", source[pos:], source.count("\n") + 1])
    for i, item in enumerate(items):
        if item[0] == "text":
            continue
        if item[3] and i > 0 and items[i - 1][0] == "text":
            items[i - 1][1] = items[i - 1][1].rstrip()
        if item[4] and i + 1 < len(items) and items[i + 1][0] == "text":
            items[i + 1][1] = items[i + 1][1].lstrip()
    return items


class _Compiler:
    def __init__(self, source):
        self.items, self.i = _lex(source), 0

    def block(self, stop):
        """Parse nodes until a tag whose name is in ``stop``; return (nodes, tag word, tag body, line)."""
        nodes = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            kind, body, line = item[0], item[1], item[2]
            if kind == "text":
                if body:
                    nodes.append(("text", body))
            elif kind == "out":
                nodes.append(("out", compile_expr(body, line)))
            else:
                word = body.split(None, 1)[0] if body.strip() else ""
                if word in stop:
                    return nodes, word, body, line
                if word == "if":
                    nodes.append(self.if_block(body, line))
                elif word == "for":
                    nodes.append(self.for_block(body, line))
                elif word == "set":
                    m = _SET.fullmatch(body.strip())
                    if m is None:
                        raise TemplateSyntaxError("malformed set tag", line)
                    nodes.append(("set", m.group(1), compile_expr(m.group(2), line)))
                elif word in ("elif", "else", "endif", "endfor"):
                    raise TemplateSyntaxError(f"unexpected {word!r}", line)
                else:
                    raise TemplateSyntaxError(f"unknown tag {word!r}", line)
        return nodes, None, None, None

    def if_block(self, body, line):
        branches, cond, open_line = [], compile_expr(body.strip()[2:], line), line
        while True:
            nodes, word, body, line = self.block({"elif", "else", "endif"})
            if word is None:
                raise TemplateSyntaxError("if block not closed", open_line)
            branches.append((cond, nodes))
            if word == "endif":
                return ("if", branches)
            if word == "elif":
                cond = compile_expr(body.strip()[4:], line)
            else:
                cond = lambda s: True  # noqa: E731
                nodes, word, body, line = self.block({"endif"})
                if word is None:
                    raise TemplateSyntaxError("if block not closed", open_line)
                branches.append((cond, nodes))
                return ("if", branches)

    def for_block(self, body, line):
        m = _FOR.fullmatch(body.strip())
        if m is None:
            raise TemplateSyntaxError("malformed for tag", line)
        names = [n for n in (m.group(1), m.group(2)) if n]
        iterable = compile_expr(m.group(3), line)
        nodes, word, _, _ = self.block({"else", "endfor"})
        empty = []
        if word == "else":
            empty, word, _, _ = self.block({"endfor"})
        if word is None:
            raise TemplateSyntaxError("for block not closed", line)
        return ("for", names, iterable, nodes, empty)


class Template:
    def __init__(self, source, *, autoescape=True, strict=False):
        self.autoescape, self.strict = autoescape, strict
        compiler = _Compiler(source)
        self._nodes = compiler.block(set())[0]

    def render(self, context=None, **kwargs):
        scope = [{**(context or {}), **kwargs}, {}]
        out = []
        self._run(self._nodes, scope, out)
        return "".join(out)

    def _emit(self, value, out):
        if isinstance(value, Undefined):
            if self.strict:
                raise UndefinedError(f"{value.name!r} is undefined")
            return
        if value is None:
            return
        out.append(html_escape(value) if self.autoescape else str(value))

    def _run(self, nodes, scope, out):
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "out":
                self._emit(node[1](scope), out)
            elif kind == "set":
                scope[-1][node[1]] = node[2](scope)
            elif kind == "if":
                for cond, body in node[1]:
                    if cond(scope):
                        self._run(body, scope, out)
                        break
            else:
                _, names, iterable, body, empty = node
                items = iterable(scope)
                if isinstance(items, Undefined):
                    if self.strict:
                        raise UndefinedError(f"{items.name!r} is undefined")
                    items = []
                items = list(items)
                for i, item in enumerate(items):
                    frame = {"loop": {"index0": i, "index": i + 1, "length": len(items),
                                      "first": i == 0, "last": i == len(items) - 1}}
                    if len(names) == 2:
                        frame[names[0]], frame[names[1]] = item
                    else:
                        frame[names[0]] = item
                    self._run(body, scope + [frame], out)
                if not items:
                    self._run(empty, scope, out)


def render(source, context=None, **kwargs):
    return Template(source).render(context, **kwargs)

