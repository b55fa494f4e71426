"""Longest-common-subsequence line diff, unified output and patch application."""

__all__ = ["diff", "lcs_length", "edit_distance", "patch", "unified"]


def _check(lines):
    if not isinstance(lines, (list, tuple)) or not all(isinstance(x, str) for x in lines):
        raise TypeError("expected a list of str")


def _table(a, b):
    """L[i][j] = LCS length of a[i:] and b[j:]."""
    L = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        row, below = L[i], L[i + 1]
        for j in range(len(b) - 1, -1, -1):
            row[j] = below[j + 1] + 1 if a[i] == b[j] else max(below[j], row[j + 1])
    return L


def diff(a, b):
    _check(a)
    _check(b)
    L = _table(a, b)
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            out.append((" ", a[i]))
            i, j = i + 1, j + 1
        elif L[i + 1][j] >= L[i][j + 1]:
            out.append(("-", a[i]))
            i += 1
        else:
            out.append(("+", b[j]))
            j += 1
    out += [("-", x) for x in a[i:]] + [("+", x) for x in b[j:]]
    return out


def lcs_length(a, b):
    _check(a)
    _check(b)
    return _table(a, b)[0][0]


def edit_distance(a, b):
    return len(a) + len(b) - 2 * lcs_length(a, b)


def patch(a, script):
    out, i = [], 0
    for op, line in script:
        if op not in (" ", "-", "+"):
            raise ValueError(f"unknown op {op!r}")
        if op == "+":
            out.append(line)
            continue
        if i >= len(a) or a[i] != line:
            raise ValueError(f"script does not match line {i + 1} of the input")
        if op == " ":
            out.append(line)
        i += 1
    if i != len(a):
        raise ValueError("script does not cover the whole input")
    return out


def _range(start, length):
    if length == 1:
        return str(start + 1)
    if length == 0:
        return f"{start},0"
    return f"{start + 1},{length}"


def unified(a, b, fromfile="a", tofile="b", context=3):
    if context < 0:
        raise ValueError("context must be >= 0")
    script = diff(a, b)
    # position of each entry in a and b (0-based index of the next line of each)
    pos, i, j = [], 0, 0
    for op, _ in script:
        pos.append((i, j))
        i += op != "+"
        j += op != "-"
    changes = [k for k, (op, _) in enumerate(script) if op != " "]
    if not changes:
        return ""
    groups, start = [], changes[0]
    for prev, k in zip(changes, changes[1:]):
        if k - prev - 1 > 2 * context:
            groups.append((start, prev))
            start = k
    groups.append((start, changes[-1]))
    out = [f"--- {fromfile}\n", f"+++ {tofile}\n"]
    for first, last in groups:
        lo, hi = max(first - context, 0), min(last + context, len(script) - 1)
        entries = script[lo:hi + 1]
        a0, b0 = pos[lo]
        na = sum(op != "+" for op, _ in entries)
        nb = sum(op != "-" for op, _ in entries)
        out.append(f"@@ -{_range(a0, na)} +{_range(b0, nb)} @@\n")
        out += [f"{op}{line}\n" for op, line in entries]
    return "".join(out)
