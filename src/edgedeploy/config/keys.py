"""Typed configuration: one table of ``Key`` objects per file kind, and one validator.

``RECIPE_KEYS`` (recipe.py), ``PROJECT_KEYS`` (project.py) and ``TARGET_KEYS`` (targets.py) describe every key
a file may hold: its dotted path, type, default, allowed values or range and a one-line help. ``validate`` walks
a parsed TOML table against such a table: booleans must be booleans, integers integers, every unknown key is
named with the nearest valid one, and a bad value names the file, the key path and the allowed values.

A ``*`` segment in a path stands for any name (``layers.*.clusters``: one table per layer).
"""

from __future__ import annotations

import builtins
import difflib
import math
import os
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from edgedeploy.errors import EdgeDeployError, UsageError

# The largest integer a setting may hold: exact as a float (JSON, NumPy) and far below int64's limit.
INT_LIMIT = 2**53

_WHAT = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
         dict: "a table"}


@dataclass(frozen=True)
class Key:
    """One key of a configuration file."""

    path: str  # dotted, e.g. "pruning.schedule"; "*" stands for any name
    type: type  # bool, int, float, str, list or dict
    default: Any = None  # None: unset (required keys have no default)
    help: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    items: builtins.type | None = None  # element type of a list
    required: bool = False
    required_when: str = ""  # required only for some files, in words (e.g. "boards"); checked by the loader
    numbers_ok: bool = False  # a str key that also takes a number (kept as its text)
    field: str | None = None  # the attribute of the typed object it sets, when not the last path segment

    @property
    def name(self) -> str:
        return self.field or self.path.rsplit(".", 1)[-1]

    def under(self, prefix: str) -> "Key":
        """The same key inside a table (``recipe.`` in a project file)."""
        return replace(self, path=f"{prefix}.{self.path}", field=self.name)

    def allowed(self) -> str:
        """The allowed form, in words."""
        what = _WHAT[self.type]
        if self.type is list and self.items is not None:
            what = f"a list of {_WHAT[self.items].removeprefix('a ').removeprefix('an ')}s"
        if self.numbers_ok:
            what = "a string or a number"
        if self.choices is not None:
            return f"one of {', '.join(str(c) for c in self.choices)}"
        if self.minimum is not None or self.maximum is not None:
            lo = "" if self.minimum is None else f"{'>' if self.exclusive_minimum else '>='} {_num(self.minimum)}"
            hi = "" if self.maximum is None else f"{'<' if self.exclusive_maximum else '<='} {_num(self.maximum)}"
            what += " " + " and ".join(p for p in (lo, hi) if p)
        return what


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _printable(text: str, limit: int = 80) -> str:
    """``text`` on one line: controls and other non-printables escaped, cut to ``limit`` characters."""
    out = text if text.isprintable() else text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _matches(pattern: str, path: tuple[str, ...]) -> bool:
    a, b = pattern.split("."), path
    return len(a) == len(b) and all(p == "*" or p == q for p, q in zip(a, b))


class _Table:
    """The keys of one file kind, with the table paths they imply."""

    def __init__(self, keys: Sequence[Key]) -> None:
        self.keys = tuple(keys)
        self.tables: set[str] = set()
        for k in self.keys:
            parts = k.path.split(".")
            for i in range(1, len(parts)):
                self.tables.add(".".join(parts[:i]))

    def key(self, path: tuple[str, ...]) -> Key | None:
        for k in self.keys:
            if _matches(k.path, path):
                return k
        return None

    def is_table(self, path: tuple[str, ...]) -> bool:
        return any(_matches(t, path) for t in self.tables)

    def nearest(self, parts: tuple[str, ...]) -> str | None:
        names = [k.path for k in self.keys] + sorted(self.tables)
        # fill "*" with the user's own segment so that `layers.conv1.clusterz` finds `layers.conv1.clusters`
        path = ".".join(parts)
        filled = []
        for n in names:
            segs = n.split(".")
            filled.append(".".join(parts[i] if s == "*" and i < len(parts) else s for i, s in enumerate(segs)))
        close = difflib.get_close_matches(path, filled, n=1, cutoff=0.6)
        if close:
            return close[0]
        tail = difflib.get_close_matches(parts[-1], [f.rsplit(".", 1)[-1] for f in filled], n=1, cutoff=0.6)
        if tail:
            return next(f for f in filled if f.rsplit(".", 1)[-1] == tail[0])
        return None


def check_value(key: Key, value: Any, source: str, error: type[EdgeDeployError] = UsageError,
                hint: str = "fix the file", shown: str | None = None) -> Any:
    """``value`` checked against ``key`` (an int given for a float becomes a float); raises ``error`` otherwise."""
    where = _printable(shown or key.path)

    def fail(what: str) -> EdgeDeployError:
        return error(f"{source}: `{where}` is {_repr(value)}; {what}", hint)

    kind: Any = key.type  # (a class known only when run: ``value`` stays Any through the isinstance checks)
    if key.numbers_ok and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise fail("it must be a string or a finite number")
        value = str(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise fail(f"it must be {key.allowed() if key.choices is None else _WHAT[kind]}")
    if kind is float and not math.isfinite(value):
        raise fail("it must be a finite number")
    if kind is str and "\0" in value or kind is list and any(isinstance(v, str) and "\0" in v for v in value):
        raise fail("it holds a NUL character")
    if kind is str and not value and key.required:
        raise fail("it must be a non-empty string")
    if kind is list and key.items is not None:
        for item in value:
            ok = isinstance(item, key.items) and not (key.items is not bool and isinstance(item, bool))
            if key.items is float and isinstance(item, int) and not isinstance(item, bool):
                ok = True
            if not ok:
                raise fail(f"it must be {key.allowed()}")
        if key.items is float:
            value = [float(v) for v in value]
    if key.choices is not None:
        for item in (value if kind is list else [value]):
            if item not in key.choices:
                verb = "has" if kind is list else "is"
                close = difflib.get_close_matches(str(item), [str(c) for c in key.choices], n=1)
                guess = f"did you mean {close[0]}? " if close else ""
                raise error(f"{source}: `{where}` {verb} {_repr(item)}; allowed values: "
                            f"{', '.join(map(str, key.choices))}", f"{guess}{hint}")
    for item in (value if kind is list else [value]):
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > INT_LIMIT and (
                key.maximum is None or key.maximum > INT_LIMIT):
            raise error(f"{source}: `{where}` is {_repr(item)}; it must be an integer of at most {INT_LIMIT}", hint)
    if key.minimum is not None or key.maximum is not None:
        for item in (value if kind is list else [value]):
            if not isinstance(item, (int, float)):
                continue
            low = key.minimum is not None and (item <= key.minimum if key.exclusive_minimum else item < key.minimum)
            high = key.maximum is not None and (item >= key.maximum if key.exclusive_maximum else item > key.maximum)
            if low or high:
                raise error(f"{source}: `{where}` is {_repr(item)}; it must be {key.allowed()}", hint)
    return value


def validate(data: Mapping[str, Any], keys: Sequence[Key] | _Table, source: str,
             error: type[EdgeDeployError] = UsageError, hint: str = "fix the file",
             prefix: str = "") -> dict[str, Any]:
    """Every key of ``data`` checked against ``keys``: ``{dotted path: value}`` of the keys given.

    Tables are walked; an unknown key or table is named with the nearest valid one.
    """
    table = keys if isinstance(keys, _Table) else _Table(keys)
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], at: tuple[str, ...]) -> None:
        for name, value in node.items():
            parts = (*at, str(name))
            path = ".".join(parts)
            key = table.key(parts)
            if key is not None and not (key.type is not dict and isinstance(value, dict) and table.is_table(parts)):
                out[path] = check_value(key, value, source, error, hint, shown=path)
                continue
            if table.is_table(parts):
                if not isinstance(value, dict):
                    raise error(f"{source}: `{_printable(path)}` is {_repr(value)}; it must be a table",
                                f"e.g. [{_printable(path)}]")
                walk(value, parts)
                continue
            close = table.nearest(parts)
            guess = f"did you mean `{close}`? " if close else ""
            raise error(f"{source}: unknown key `{_printable(path)}`", f"{_printable(guess, 200)}{hint}")

    walk(data, tuple(prefix.split(".")) if prefix else ())
    for k in table.keys:
        if k.required and "*" not in k.path and k.path not in out:
            raise error(f"{source}: `{k.path}` is missing; it must be {k.allowed()}", hint)
    return out


def read_toml(path: Path, what: str, error: type[EdgeDeployError] = UsageError) -> dict[str, Any]:
    """A TOML file as a table; a missing, unreadable or malformed file is one ``error`` naming it."""
    from edgedeploy.errors import InvalidInputError
    from edgedeploy.core.files import read_input_bytes, short

    try:  # a regular file of bounded size (a FIFO or /dev/zero never blocks or fills memory)
        raw = read_input_bytes(path, what, "settings")
    except InvalidInputError as exc:  # missing or a folder: the file kind's own error; else unsuitable input (3)
        gone = not os.path.lexists(path) or os.path.isdir(path)
        raise (error if gone or issubclass(error, InvalidInputError) else InvalidInputError)(
            exc.message, "give the path of a .toml file" if os.path.isdir(path) else exc.hint) from None
    except OSError as exc:
        raise error(f"{what} {short(str(path))} cannot be read ({exc.strerror})", "check the path and permissions"
                    ) from exc
    shown = short(str(path))
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{shown}: not UTF-8 text (byte {exc.start})", "save the file as UTF-8 TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{shown}: not valid TOML ({exc})", "fix the syntax") from exc
    except RecursionError as exc:
        raise error(f"{shown}: nested too deeply to read", "fix the file") from exc


def defaults(keys: Iterable[Key]) -> dict[str, Any]:
    """``{field: default}`` of the keys that have one."""
    return {k.name: k.default for k in keys if k.default is not None and "*" not in k.path}


def lookup(keys: Iterable[Key], path: str) -> Key:
    for k in keys:
        if k.path == path:
            return k
    raise KeyError(path)
