"""Tokenizer for tinycalc expressions."""

import re
from typing import NamedTuple

from .errors import CalcSyntaxError


class Token(NamedTuple):
    kind: str   # "NUMBER", "NAME", "OP", "LPAREN", "RPAREN", "COMMA" or "EOF"
    text: str
    pos: int    # 0-based offset of the first character


_TOKEN = re.compile(r"""
    (?P<NUMBER>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<NAME>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<OP>\*\*|//|[-+*/%])
  | (?P<LPAREN>\()
  | (?P<RPAREN>\))
  | (?P<COMMA>,)
""", re.VERBOSE)


def tokenize(text):
    """Split ``text`` into tokens, ending with an EOF token at ``len(text)``.

    Whitespace separates tokens and is skipped. Any other character raises CalcSyntaxError.
    """
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CalcSyntaxError(f"unexpected character {text[pos]!r}", pos)
        tokens.append(Token(m.lastgroup, m.group(), pos))
        pos = m.end()
    tokens.append(Token("EOF", "", len(text)))
    return tokens
