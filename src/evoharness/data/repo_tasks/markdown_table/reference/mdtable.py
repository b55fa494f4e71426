"""Format and parse GitHub-flavoured Markdown pipe tables."""

import re

__all__ = ["format_table", "parse_table"]

_ALIGNS = ("left", "right", "center")
_SEP_CELL = re.compile(r":?-+:?")
_SPLIT = re.compile(r"(?<!\\)\|")


def _text(cell):
    if cell is None:
        s = ""
    elif isinstance(cell, bool):
        s = "true" if cell else "false"
    else:
        s = str(cell)
    s = re.sub(r"\r\n|\n|\r", "<br>", s.strip()).replace("|", "\\|")
    return s.strip()


def _is_number(cell):
    return isinstance(cell, (int, float)) and not isinstance(cell, bool)


def _pad(text, width, how):
    pad = width - len(text)
    if how == "right":
        return " " * pad + text
    if how == "center":
        return " " * (pad // 2) + text + " " * (pad - pad // 2)
    return text + " " * pad


def _separator(width, how):
    if how == "right":
        return "-" * (width - 1) + ":"
    if how == "center":
        return ":" + "-" * (width - 2) + ":"
    return ":" + "-" * (width - 1)


def format_table(rows, headers=None, align=None):
    rows = [list(r) for r in rows]
    if headers is None:
        if not rows:
            raise ValueError("no headers and no rows")
        headers, rows = rows[0], rows[1:]
    headers = list(headers)
    ncol = len(headers)
    if ncol == 0:
        raise ValueError("a table needs at least one column")
    for r in rows:
        if len(r) > ncol:
            raise ValueError(f"row has {len(r)} cells, header has {ncol}")
        r.extend([None] * (ncol - len(r)))
    if align is None:
        align = [None] * ncol
    align = list(align)
    if len(align) != ncol or any(a not in _ALIGNS + (None,) for a in align):
        raise ValueError("align needs one of left/right/center/None per column")
    for c in range(ncol):
        if align[c] is None:
            body = [r[c] for r in rows if _text(r[c]) != ""]
            align[c] = "right" if body and all(map(_is_number, body)) else "left"
    head_text = [_text(h) for h in headers]
    body_text = [[_text(x) for x in r] for r in rows]
    widths = [max([3, len(head_text[c])] + [len(r[c]) for r in body_text]) for c in range(ncol)]

    def line(cells):
        return "| " + " | ".join(cells) + " |"
    out = [line(_pad(t, w, a) for t, w, a in zip(head_text, widths, align)),
           line(_separator(w, a) for w, a in zip(widths, align))]
    out += [line(_pad(t, w, a) for t, w, a in zip(r, widths, align)) for r in body_text]
    return "\n".join(out) + "\n"


def _cells(line):
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in _SPLIT.split(line)]


def parse_table(text):
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if any(not ln.strip() for ln in lines):
        raise ValueError("blank line inside the table")
    if len(lines) < 2:
        raise ValueError("a table needs a header and a separator line")
    headers, sep = _cells(lines[0]), _cells(lines[1])
    if len(sep) != len(headers) or not all(_SEP_CELL.fullmatch(c) for c in sep):
        raise ValueError("bad separator line")
    aligns = []
    for c in sep:
        left, right = c.startswith(":"), c.endswith(":")
        aligns.append("center" if left and right else "left" if left else "right" if right else None)
    rows = []
    for ln in lines[2:]:
        cells = _cells(ln)[:len(headers)]
        rows.append(cells + [""] * (len(headers) - len(cells)))
    return headers, rows, aligns
