"""tinycalc: a small arithmetic expression evaluator."""

from .errors import CalcError, CalcSyntaxError, EvalError, UndefinedNameError
from .lexer import Token, tokenize

__all__ = ["CalcError", "CalcSyntaxError", "EvalError", "UndefinedNameError", "Token", "tokenize",
           "evaluate", "compile_expr"]


def evaluate(text, variables=None):
    raise NotImplementedError


def compile_expr(text):
    raise NotImplementedError
