"""CSV parsing/formatting with configurable dialects, a dict reader and a delimiter sniffer."""

from collections import Counter
from dataclasses import dataclass

__all__ = ["Dialect", "CSVError", "parse", "format", "parse_dicts", "sniff"]


class CSVError(ValueError):
    def __init__(self, message, line):
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Dialect:
    delimiter: str = ","
    quotechar: str = '"'
    escapechar: str | None = None
    doublequote: bool = True
    skipinitialspace: bool = False
    lineterminator: str = "\r\n"

    def __post_init__(self):
        chars = [self.delimiter, self.quotechar] + ([self.escapechar] if self.escapechar is not None else [])
        if not all(isinstance(c, str) and len(c) == 1 for c in chars):
            raise ValueError("delimiter, quotechar and escapechar must be single characters")
        if len(set(chars)) != len(chars) or set(chars) & {"\r", "\n"}:
            raise ValueError("delimiter, quotechar and escapechar must be distinct and not line breaks")


def parse(text, dialect=Dialect()):
    d, q, esc = dialect.delimiter, dialect.quotechar, dialect.escapechar
    records, record, field = [], [], []
    i, line, n = 0, 1, len(text)
    at_field_start, record_empty = True, True

    def end_field():
        nonlocal field, at_field_start
        record.append("".join(field))
        field, at_field_start = [], True

    while i < n:
        c = text[i]
        if at_field_start and dialect.skipinitialspace and c == " " and record:
            i += 1
            continue
        if at_field_start and c == q:
            start_line, i = line, i + 1
            while True:
                if i >= n:
                    raise CSVError("unterminated quoted field", start_line)
                c = text[i]
                if esc is not None and c == esc:
                    if i + 1 >= n:
                        raise CSVError("escape character at end of input", line)
                    line += text[i + 1] == "\n" or (text[i + 1] == "\r" and text[i + 2:i + 3] != "\n")
                    field.append(text[i + 1])
                    i += 2
                elif c == q:
                    if dialect.doublequote and text[i + 1:i + 2] == q:
                        field.append(q)
                        i += 2
                    else:
                        i += 1
                        break
                else:
                    if c == "\n" or (c == "\r" and text[i + 1:i + 2] != "\n"):
                        line += 1
                    field.append(c)
                    i += 1
            if i < n and text[i] not in (d, "\r", "\n"):
                raise CSVError(f"{text[i]!r} after closing quote", line)
            at_field_start, record_empty = False, False
            continue
        if esc is not None and c == esc:
            if i + 1 >= n:
                raise CSVError("escape character at end of input", line)
            field.append(text[i + 1])
            at_field_start, record_empty = False, False
            i += 2
        elif c == d:
            end_field()
            record_empty = False
            i += 1
        elif c in "\r\n":
            i += 2 if text[i:i + 2] == "\r\n" else 1
            if not (record_empty and not field):
                end_field()
            records.append(record)
            record, record_empty, line = [], True, line + 1
        else:
            field.append(c)
            at_field_start, record_empty = False, False
            i += 1
    if not record_empty or field:
        end_field()
        records.append(record)
    return records


def _needs_quotes(s, dialect):
    return (any(ch in s for ch in (dialect.delimiter, dialect.quotechar, "\r", "\n"))
            or s[:1] == " " or s[-1:] == " ")


def format(rows, dialect=Dialect()):
    q, esc = dialect.quotechar, dialect.escapechar
    out = []
    for row_no, row in enumerate(rows, 1):
        cells = []
        for value in row:
            s = "" if value is None else str(value)
            if esc is not None:
                s = s.replace(esc, esc + esc)
            quote = _needs_quotes(s, dialect) or (len(row) == 1 and s == "")
            if q in s:
                if dialect.doublequote:
                    s = s.replace(q, q + q)
                elif esc is not None:
                    s = s.replace(q, esc + q)
                else:
                    raise CSVError("quotechar in a field needs doublequote or an escapechar", row_no)
            cells.append(q + s + q if quote else s)
        out.append(dialect.delimiter.join(cells) + dialect.lineterminator)
    return "".join(out)


def _records_with_lines(text, dialect):
    """Records and the line each starts on (re-parsing record by record is simplest)."""
    records = parse(text, dialect)
    lines, line = [], 1
    for rec in records:
        lines.append(line)
        line += 1 + sum(f.count("\n") + f.count("\r") - f.count("\r\n") for f in rec)
    return records, lines


def parse_dicts(text, dialect=Dialect()):
    records, lines = _records_with_lines(text, dialect)
    pairs = [(r, ln) for r, ln in zip(records, lines) if r]
    if not pairs:
        return []
    (header, hline), body = pairs[0], pairs[1:]
    if len(set(header)) != len(header):
        raise CSVError("duplicate header name", hline)
    out = []
    for rec, ln in body:
        if len(rec) != len(header):
            raise CSVError(f"expected {len(header)} fields, got {len(rec)}", ln)
        out.append(dict(zip(header, rec)))
    return out


def _outside_quotes(line):
    out, quoted = [], False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif not quoted:
            out.append(ch)
        else:
            out.append("\0")
    return "".join(out)


def sniff(sample, delimiters=",;\t|"):
    lines = [_outside_quotes(ln) for ln in sample.splitlines() if ln.strip()]
    best, best_score = None, 0
    for d in delimiters:
        counts = Counter(ln.count(d) for ln in lines)
        if not counts:
            continue
        m = max(counts, key=lambda c: (counts[c], c))
        score = counts[m] if m else 0
        if score > best_score:
            best, best_score = d, score
    if best is None:
        raise CSVError("could not determine the delimiter", 1)
    spaced = all(ln[i + 1:i + 2] == " " for ln in lines for i, ch in enumerate(ln) if ch == best)
    return Dialect(delimiter=best, skipinitialspace=spaced)
