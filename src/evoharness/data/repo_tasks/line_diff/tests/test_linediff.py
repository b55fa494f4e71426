from _strict import real  # values from the code under test must be genuine
import pytest

from linediff import diff, edit_distance, lcs_length, patch, unified

A = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m"]


def test_identical():
    assert real(diff(["x", "y"], ["x", "y"])) == [(" ", "x"), (" ", "y")]
    assert real(unified(["x"], ["x"])) == ""


def test_empty_sides():
    assert real(diff([], ["a", "b"])) == [("+", "a"), ("+", "b")]
    assert real(diff(["a"], [])) == [("-", "a")]
    assert real(diff([], [])) == []


def test_deletion_before_insertion():
    assert real(diff(["a"], ["b"])) == [("-", "a"), ("+", "b")]
    assert real(diff(["x", "a", "y"], ["x", "b", "y"])) == [(" ", "x"), ("-", "a"), ("+", "b"), (" ", "y")]


def test_tie_break_rule():
    assert real(diff(["a", "b"], ["b", "a"])) == [("-", "a"), (" ", "b"), ("+", "a")]
    assert real(diff(["a", "b", "c", "a", "b", "b", "a"], ["c", "b", "a", "b", "a", "c"])) == [
        ("-", "a"), ("-", "b"), (" ", "c"), ("-", "a"), (" ", "b"), ("+", "a"), (" ", "b"), (" ", "a"), ("+", "c")]


def test_lcs_and_edit_distance():
    assert real(lcs_length(list("ABCBDAB"), list("BDCABA"))) == 4
    assert real(edit_distance(list("ABCBDAB"), list("BDCABA"))) == 5
    assert real(edit_distance([], list("abc"))) == 3


@pytest.mark.parametrize("a,b", [
    (list("kitten"), list("sitting")), (A, A[:5] + ["X"] + A[7:]), ([], ["a"]), (["a"], []),
    (list("aaaa"), list("aa")), (list("abcabba"), list("cbabac")),
])
def test_patch_round_trip(a, b):
    script = diff(a, b)
    assert real(patch(a, real(script))) == b
    assert sum(real(op) != " " for op, _ in real(script)) == real(edit_distance(a, b))


def test_patch_errors():
    with pytest.raises(ValueError):
        patch(["a", "b"], [(" ", "a")])
    with pytest.raises(ValueError):
        patch(["a"], [("-", "z")])
    with pytest.raises(ValueError):
        patch(["a"], [("?", "a")])
    with pytest.raises(ValueError):
        patch([], [(" ", "a")])


@pytest.mark.parametrize("a,b", [("abc", ["a"]), (["a", 1], ["a"]), (None, [])])
def test_type_errors(a, b):
    with pytest.raises(TypeError):
        diff(a, b)


def test_unified_single_hunk():
    b = A[:5] + ["X"] + A[6:]
    assert real(unified(real(A), real(b), "old.txt", "new.txt")) == (
        "--- old.txt\n+++ new.txt\n@@ -3,7 +3,7 @@\n c\n d\n e\n-f\n+X\n g\n h\n i\n")


def test_unified_two_hunks_and_merge():
    b = ["A"] + A[1:12] + ["M"]
    assert real(unified(real(A), real(b), context=2)) == (
        "--- a\n+++ b\n@@ -1,3 +1,3 @@\n-a\n+A\n b\n c\n@@ -11,3 +11,3 @@\n k\n l\n-m\n+M\n")
    b2 = A[:2] + ["C"] + A[3:6] + ["G"] + A[7:]
    text = unified(A, b2, context=2)
    assert real(real(text).count("@@ -")) == 1
    assert "@@ -1,9 +1,9 @@\n" in real(text)


def test_unified_zero_context_and_empty_ranges():
    assert real(unified(["a", "b", "c"], ["a", "c"], context=0)) == "--- a\n+++ b\n@@ -2 +1,0 @@\n-b\n"
    assert real(unified(["a", "c"], ["a", "b", "c"], context=0)) == "--- a\n+++ b\n@@ -1,0 +2 @@\n+b\n"
    assert real(unified([], ["x", "y"])) == "--- a\n+++ b\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    assert real(unified(["x"], [])) == "--- a\n+++ b\n@@ -1 +0,0 @@\n-x\n"


def test_unified_matches_difflib_on_simple_edit():
    import difflib
    b = A[:4] + ["new"] + A[4:10] + A[11:]
    assert real(real(unified(real(A), real(b))).splitlines()) == list(difflib.unified_diff(real(A), real(b), "a", "b", n=3, lineterm=""))


def test_unified_negative_context():
    with pytest.raises(ValueError):
        unified(["a"], ["b"], context=-1)


def test_longer_input():
    a = [f"line {i}" for i in range(300)]
    b = [x for i, x in enumerate(a) if i % 50] + ["tail"]
    script = diff(a, b)
    assert real(patch(real(a), real(script))) == real(b)
    assert real(edit_distance(real(a), real(b))) == 7
