"""Recursive-descent parser: tokens -> a small tree of tuples.

Nodes: ("num", value, pos), ("var", name, pos), ("call", name, args, pos),
("neg"|"pos", operand, pos), ("bin", op, left, right, pos).
"""

from .errors import CalcSyntaxError
from .lexer import tokenize


class _Parser:
    def __init__(self, text):
        self.tokens = tokenize(text)
        self.i = 0

    @property
    def tok(self):
        return self.tokens[self.i]

    def take(self):
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, what):
        tok = self.tok
        found = "end of input" if tok.kind == "EOF" else repr(tok.text)
        raise CalcSyntaxError(f"expected {what}, found {found}", tok.pos)

    def expect(self, kind, what):
        if self.tok.kind != kind:
            self.fail(what)
        return self.take()

    def parse(self):
        node = self.expr()
        if self.tok.kind != "EOF":
            self.fail("an operator or end of input")
        return node

    def expr(self):
        node = self.term()
        while self.tok.kind == "OP" and self.tok.text in "+-":
            op = self.take()
            node = ("bin", op.text, node, self.term(), op.pos)
        return node

    def term(self):
        node = self.unary()
        while self.tok.kind == "OP" and self.tok.text in ("*", "/", "//", "%"):
            op = self.take()
            node = ("bin", op.text, node, self.unary(), op.pos)
        return node

    def unary(self):
        if self.tok.kind == "OP" and self.tok.text in "+-":
            op = self.take()
            return ("neg" if op.text == "-" else "pos", self.unary(), op.pos)
        return self.power()

    def power(self):
        node = self.atom()
        if self.tok.kind == "OP" and self.tok.text == "**":
            op = self.take()
            node = ("bin", "**", node, self.unary(), op.pos)
        return node

    def atom(self):
        tok = self.tok
        if tok.kind == "NUMBER":
            self.take()
            is_float = any(c in tok.text for c in ".eE")
            return ("num", float(tok.text) if is_float else int(tok.text), tok.pos)
        if tok.kind == "NAME":
            self.take()
            if self.tok.kind != "LPAREN":
                return ("var", tok.text, tok.pos)
            self.take()
            args = []
            if self.tok.kind != "RPAREN":
                args.append(self.expr())
                while self.tok.kind == "COMMA":
                    self.take()
                    args.append(self.expr())
            self.expect("RPAREN", "',' or ')'")
            return ("call", tok.text, args, tok.pos)
        if tok.kind == "LPAREN":
            self.take()
            node = self.expr()
            self.expect("RPAREN", "')'")
            return node
        self.fail("a number, a name or '('")


def parse(text):
    return _Parser(text).parse()
