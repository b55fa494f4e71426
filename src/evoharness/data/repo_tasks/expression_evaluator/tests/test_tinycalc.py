from _strict import real  # values from the code under test must be genuine
import math

import pytest

import tinycalc
from tinycalc import CalcError, CalcSyntaxError, EvalError, UndefinedNameError, tokenize


def test_lexer_still_works():
    assert [(real(real(t).kind), real(real(t).text), real(real(t).pos)) for t in real(tokenize("2 ** x1"))] == [
        ("NUMBER", "2", 0), ("OP", "**", 2), ("NAME", "x1", 5), ("EOF", "", 7)]


def test_error_hierarchy():
    for cls in (CalcSyntaxError, UndefinedNameError, EvalError):
        assert issubclass(real(cls), real(CalcError))


@pytest.mark.parametrize("text,expected", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("10 - 4 - 3", 3), ("2 * 3 % 4", 2), ("7 // 2", 3),
    ("-7 // 2", -4), ("-7 % 3", 2), ("7 / 2", 3.5), ("8 / 4", 2.0), ("2 ** 10", 1024),
    ("2 ** 3 ** 2", 512), ("-2 ** 2", -4), ("(-2) ** 2", 4), ("2 ** -1", 0.5), ("--3", 3),
    ("+-+3", -3), ("1.5e2 + .5", 150.5), ("3.", 3.0), ("10 ** 30", 10 ** 30), ("2*-3", -6),
])
def test_arithmetic(text, expected):
    result = tinycalc.evaluate(text)
    assert real(result) == expected and type(real(result)) is type(expected)


def test_int_vs_float_types():
    assert isinstance(real(real(tinycalc).evaluate("6 / 3")), float)
    assert isinstance(real(real(tinycalc).evaluate("6 // 3")), int)
    assert isinstance(real(real(tinycalc).evaluate("1e3")), float)


def test_variables():
    assert real(real(tinycalc).evaluate("x * y + z", {"x": 2, "y": 3.5, "z": -1})) == 6.0
    assert real(real(tinycalc).evaluate("min * 2", {"min": 4})) == 8


@pytest.mark.parametrize("text,expected", [
    ("abs(-3)", 3), ("sqrt(16)", 4.0), ("min(3, 1, 2)", 1), ("max(2)", 2), ("round(2.567, 2)", 2.57),
    ("round(2.5)", 2), ("max(1, min(5, 3) * 2) + abs(-1)", 7), ("sqrt(2) ** 2", pytest.approx(2.0)),
])
def test_functions(text, expected):
    assert real(real(tinycalc).evaluate(text)) == expected


@pytest.mark.parametrize("text,pos", [
    ("1 +", 3), ("(1 + 2", 6), ("1 + * 2", 4), ("2 3", 2), ("", 0), ("   ", 3), (")", 0),
    ("max(1,)", 6), ("1 $ 2", 2), ("f(1 2)", 4), ("()", 1),
])
def test_syntax_errors(text, pos):
    with pytest.raises(CalcSyntaxError) as info:
        tinycalc.evaluate(text)
    assert real(real(real(info).value).pos) == pos


@pytest.mark.parametrize("text,pos", [("x + 1", 0), ("1 + foo", 4), ("nope(1)", 0), ("2 * bar(y)", 4)])
def test_undefined_names(text, pos):
    with pytest.raises(UndefinedNameError) as info:
        tinycalc.evaluate(text, {"y": 1})
    assert real(real(real(info).value).pos) == pos


def test_syntax_errors_at_compile_time_name_errors_at_evaluation():
    with pytest.raises(CalcSyntaxError):
        tinycalc.compile_expr("1 + (2")
    expr = tinycalc.compile_expr("foo(1)")
    with pytest.raises(UndefinedNameError):
        expr.evaluate()


@pytest.mark.parametrize("text,pos", [
    ("1 / 0", 2), ("5 // (2 - 2)", 2), ("5 % 0.0", 2), ("sqrt(-1)", 0), ("abs(1, 2)", 0), ("min()", 0),
    ("round(1, 2, 3)", 0), ("2 ** 10001", 2), ("1 + 2 ** -20000", 6),
])
def test_eval_errors(text, pos):
    with pytest.raises(EvalError) as info:
        tinycalc.evaluate(text)
    assert real(real(real(info).value).pos) == pos


def test_compile_once_evaluate_many():
    expr = tinycalc.compile_expr("a * x ** 2 + b * x + c + max(x, 0)")
    assert real(real(expr).variables) == frozenset({"a", "b", "c", "x"})
    assert real(real(expr).text) == "a * x ** 2 + b * x + c + max(x, 0)"
    values = [expr.evaluate({"a": 1, "b": -3, "c": 2, "x": x}) for x in range(4)]
    assert real(values) == [2, 1, 2, 5]


def test_evaluate_matches_python_on_many_expressions():
    exprs = ["3 - 2 - 1", "2 * 3 ** 2", "-3 ** 2 * 2", "100 // 7 % 4", "(5 - 8) * -(2 + 1)",
             "1 / 3 * 3", "2 ** 2 ** 2 ** 2", "7 - -7", "17 % -5", "-17 // 5 * 5 + -17 % 5"]
    for text in exprs:
        assert real(real(tinycalc).evaluate(real(text))) == eval(real(text)), text  # noqa: S307 (the test may use eval)


def test_no_python_eval_used():
    with pytest.raises(CalcSyntaxError):
        tinycalc.evaluate("__import__('os')")
    assert math.isclose(real(real(tinycalc).evaluate("sqrt(x)", {"x": 2})), math.sqrt(2))
