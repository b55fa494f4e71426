"""Errors raised by tinycalc. Every error carries the 0-based character offset it refers to."""


class CalcError(Exception):
    def __init__(self, message, pos):
        super().__init__(f"{message} (at offset {pos})")
        self.message = message
        self.pos = pos


class CalcSyntaxError(CalcError):
    """The text is not a well-formed expression."""


class UndefinedNameError(CalcError):
    """A variable or function name that is not defined."""


class EvalError(CalcError):
    """The expression is well formed but cannot be evaluated (division by zero, bad argument...)."""
