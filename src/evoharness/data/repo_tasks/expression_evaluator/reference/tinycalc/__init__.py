"""tinycalc: a small arithmetic expression evaluator."""

from . import evaluator
from .errors import CalcError, CalcSyntaxError, EvalError, UndefinedNameError
from .lexer import Token, tokenize
from .parser import parse

__all__ = ["CalcError", "CalcSyntaxError", "EvalError", "UndefinedNameError", "Token", "tokenize",
           "evaluate", "compile_expr", "Expression"]


class Expression:
    """A parsed expression: evaluate it many times with different variables."""

    def __init__(self, text):
        self.text = text
        self._tree = parse(text)
        self.variables = frozenset(evaluator.variables_of(self._tree))

    def evaluate(self, variables=None):
        return evaluator.evaluate(self._tree, variables or {})

    def __repr__(self):
        return f"Expression({self.text!r})"


def compile_expr(text):
    return Expression(text)


def evaluate(text, variables=None):
    return Expression(text).evaluate(variables)
