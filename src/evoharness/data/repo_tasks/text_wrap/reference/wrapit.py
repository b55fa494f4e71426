"""Greedy line wrapping, alignment/justification and dedent (no textwrap)."""

import re

__all__ = ["wrap", "fill", "align", "dedent"]


def wrap(text, width, *, break_long_words=True, indent=""):
    if width < 1 or len(indent) >= width:
        raise ValueError("width must exceed the indent length and be >= 1")
    room = width - len(indent)
    lines, current = [], []

    def used():
        return sum(map(len, current)) + max(len(current) - 1, 0)

    for word in text.split():
        if current and used() + 1 + len(word) <= room:
            current.append(word)
            continue
        if current:
            lines.append(current)
            current = []
        if len(word) > room and break_long_words:
            while len(word) > room:
                lines.append([word[:room]])
                word = word[room:]
        current = [word]
    if current:
        lines.append(current)
    return [indent + " ".join(words) for words in lines]


def fill(text, width, **kwargs):
    return "\n".join(wrap(text, width, **kwargs))


def _justify(line, width):
    words = line.split(" ")
    gaps = len(words) - 1
    if gaps == 0:
        return line.ljust(width)
    extra = width - sum(map(len, words))
    base, more = divmod(extra, gaps)
    out = words[0]
    for i, word in enumerate(words[1:]):
        out += " " * (base + (1 if i < more else 0)) + word
    return out


def align(lines, width, how):
    if how not in ("left", "right", "center", "justify"):
        raise ValueError(f"unknown alignment {how!r}")
    out = []
    for i, line in enumerate(lines):
        if len(line) > width:
            raise ValueError(f"line {i} is longer than {width}")
        pad = width - len(line)
        if how == "left" or (how == "justify" and i == len(lines) - 1):
            out.append(line + " " * pad)
        elif how == "right":
            out.append(" " * pad + line)
        elif how == "center":
            out.append(" " * (pad // 2) + line + " " * (pad - pad // 2))
        else:
            out.append(_justify(line, width))
    return out


def dedent(text):
    lines = text.split("\n")
    indents = [re.match(r"[ \t]*", ln).group() for ln in lines if ln.strip()]
    prefix = indents[0] if indents else ""
    for ind in indents[1:]:
        while not ind.startswith(prefix):
            prefix = prefix[:-1]
    return "\n".join("" if not ln.strip() else ln[len(prefix):] for ln in lines)
