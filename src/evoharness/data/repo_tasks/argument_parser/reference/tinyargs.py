"""A small command-line argument parser: options, flags, counts, appends, variadic positionals."""

import re
import types

__all__ = ["ArgError", "Parser"]

_SHORT = re.compile(r"-[A-Za-z]")
_LONG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9-]*")
_NEGATIVE = re.compile(r"-\d+(\.\d+)?|-\.\d+")
_ACTIONS = ("store", "store_true", "count", "append")


class ArgError(Exception):
    pass


class _Arg:
    def __init__(self, names, dest, action, type, default, required, choices, nargs, metavar):
        self.names, self.dest, self.action, self.type = names, dest, action, type
        self.default, self.required, self.choices = default, required, choices
        self.nargs, self.metavar = nargs, metavar

    @property
    def takes_value(self):
        return self.action in ("store", "append")

    def convert(self, text):
        try:
            value = self.type(text)
        except (ValueError, TypeError):
            raise ArgError(f"argument {self.names[0]}: invalid {getattr(self.type, '__name__', 'type')} value: {text!r}")
        if self.choices is not None and value not in self.choices:
            raise ArgError(f"argument {self.names[0]}: invalid choice: {value!r} (choose from {list(self.choices)})")
        return value


class Parser:
    def __init__(self, prog):
        self.prog = prog
        self._options, self._positionals, self._by_name = [], [], {}

    def add_argument(self, *names, action="store", type=str, default=None, required=False,
                     choices=None, nargs=None, metavar=None):
        if not names:
            raise ValueError("add_argument() needs a name")
        if action not in _ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        positional = not names[0].startswith("-")
        if positional:
            if len(names) != 1 or not names[0].isidentifier():
                raise ValueError("a positional takes exactly one identifier name")
            if action != "store" or nargs not in (None, "?", "*", "+"):
                raise ValueError("positionals support action='store' and nargs None/?/*/+")
            arg = _Arg(names, names[0], action, type, default, True, choices, nargs, metavar)
            self._positionals.append(arg)
            return arg
        for name in names:
            if not (_SHORT.fullmatch(name) or _LONG.fullmatch(name)):
                raise ValueError(f"malformed option string {name!r}")
            if name in self._by_name:
                raise ValueError(f"conflicting option string {name!r}")
        if nargs is not None:
            raise ValueError("nargs is only for positionals")
        longs = [n for n in names if n.startswith("--")]
        dest = longs[0][2:].replace("-", "_") if longs else names[0][1:]
        arg = _Arg(names, dest, action, type, default, required, choices, None, metavar)
        self._options.append(arg)
        for name in names:
            self._by_name[name] = arg
        return arg

    def _initial(self, arg):
        if arg.action == "store_true":
            return False if arg.default is None else arg.default
        if arg.action == "count":
            return 0 if arg.default is None else arg.default
        if arg.action == "append":
            return list(arg.default) if arg.default is not None else []
        return arg.default

    def parse(self, argv):
        values = {a.dest: self._initial(a) for a in self._options}
        seen, positional_tokens = set(), []
        tokens, i = list(argv), 0

        def apply(arg, text):
            seen.add(arg)
            if arg.action == "store_true":
                values[arg.dest] = True
            elif arg.action == "count":
                values[arg.dest] += 1
            elif arg.action == "append":
                values[arg.dest].append(arg.convert(text))
            else:
                values[arg.dest] = arg.convert(text)

        def next_value(arg):
            nonlocal i
            if i >= len(tokens) or (tokens[i].startswith("-") and tokens[i] != "-" and not _NEGATIVE.fullmatch(tokens[i])):
                raise ArgError(f"argument {arg.names[0]}: expected one argument")
            i += 1
            return tokens[i - 1]

        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if tok == "--":
                positional_tokens += tokens[i:]
                break
            if tok.startswith("--"):
                name, eq, attached = tok.partition("=")
                arg = self._by_name.get(name)
                if arg is None:
                    raise ArgError(f"unrecognized arguments: {tok}")
                if not arg.takes_value:
                    if eq:
                        raise ArgError(f"argument {name}: ignored explicit argument {attached!r}")
                    apply(arg, None)
                else:
                    apply(arg, attached if eq else next_value(arg))
            elif tok.startswith("-") and len(tok) > 1 and not _NEGATIVE.fullmatch(tok):
                j = 1
                while j < len(tok):
                    arg = self._by_name.get("-" + tok[j])
                    if arg is None:
                        raise ArgError(f"unrecognized arguments: -{tok[j]} (in {tok})")
                    j += 1
                    if arg.takes_value:
                        apply(arg, tok[j:] if j < len(tok) else next_value(arg))
                        break
                    apply(arg, None)
            else:
                positional_tokens.append(tok)

        missing = [a.names[0] for a in self._options if a.required and a not in seen]
        if missing:
            raise ArgError("the following arguments are required: " + ", ".join(missing))
        values.update(self._assign(positional_tokens))
        return types.SimpleNamespace(**values)

    def _assign(self, tokens):
        out, rest = {}, list(tokens)
        for k, arg in enumerate(self._positionals):
            reserve = sum(1 for a in self._positionals[k + 1:] if a.nargs in (None, "+"))
            available = max(len(rest) - reserve, 0)
            if arg.nargs is None:
                take = 1 if rest else 0
            elif arg.nargs == "?":
                take = min(1, available)
            else:
                take = available
            if (arg.nargs is None or arg.nargs == "+") and take == 0:
                need = [a.dest for a in self._positionals[k:] if a.nargs in (None, "+")]
                raise ArgError("the following arguments are required: " + ", ".join(need))
            chunk, rest = rest[:take], rest[take:]
            if arg.nargs is None or (arg.nargs == "?" and chunk):
                out[arg.dest] = arg.convert(chunk[0])
            elif arg.nargs == "?":
                out[arg.dest] = arg.default
            else:
                out[arg.dest] = [arg.convert(t) for t in chunk]
        if rest:
            raise ArgError("unrecognized arguments: " + " ".join(rest))
        return out

    def format_usage(self):
        parts = ["usage:", self.prog]
        for arg in self._options:
            text = arg.names[0]
            if arg.takes_value:
                text += " " + (arg.metavar or arg.dest.upper())
            parts.append(text if arg.required else f"[{text}]")
        for arg in self._positionals:
            name = arg.metavar or arg.dest
            parts.append({None: name, "?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]"}[arg.nargs])
        return " ".join(parts)
