"""Tree-walking evaluation of parsed expressions."""

import math
import operator

from .errors import EvalError, UndefinedNameError

MAX_EXPONENT = 10000

# name -> (function, min args, max args or None)
FUNCTIONS = {
    "abs": (abs, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "min": (lambda *xs: min(xs), 1, None),
    "max": (lambda *xs: max(xs), 1, None),
    "round": (round, 1, 2),
}
_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
           "//": operator.floordiv, "%": operator.mod, "**": operator.pow}


def variables_of(node):
    kind = node[0]
    if kind == "var":
        return {node[1]}
    if kind == "call":
        return set().union(*map(variables_of, node[2]))
    if kind in ("neg", "pos"):
        return variables_of(node[1])
    if kind == "bin":
        return variables_of(node[2]) | variables_of(node[3])
    return set()


def _call(name, args, pos):
    if name not in FUNCTIONS:
        raise UndefinedNameError(f"unknown function {name!r}", pos)
    fn, lo, hi = FUNCTIONS[name]
    if len(args) < lo or (hi is not None and len(args) > hi):
        raise EvalError(f"{name}() takes {lo}{'' if hi == lo else '+' if hi is None else f'-{hi}'} arguments", pos)
    if name == "sqrt" and args[0] < 0:
        raise EvalError("sqrt of a negative number", pos)
    if name == "round" and len(args) == 2 and not isinstance(args[1], int):
        raise EvalError("round() digits must be an int", pos)
    return fn(*args)


def evaluate(node, env):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        if node[1] not in env:
            raise UndefinedNameError(f"undefined variable {node[1]!r}", node[2])
        return env[node[1]]
    if kind == "neg":
        return -evaluate(node[1], env)
    if kind == "pos":
        return +evaluate(node[1], env)
    if kind == "call":
        if node[1] not in FUNCTIONS:
            raise UndefinedNameError(f"unknown function {node[1]!r}", node[3])
        return _call(node[1], [evaluate(a, env) for a in node[2]], node[3])
    _, op, left, right, pos = node
    a, b = evaluate(left, env), evaluate(right, env)
    if op in ("/", "//", "%") and b == 0:
        raise EvalError("division by zero", pos)
    if op == "**" and abs(b) > MAX_EXPONENT:
        raise EvalError(f"exponent larger than {MAX_EXPONENT}", pos)
    try:
        return _BINARY[op](a, b)
    except (ZeroDivisionError, OverflowError) as exc:  # e.g. 0 ** -1, 1e308 ** 2
        raise EvalError(str(exc), pos) from None
