"""Typed configuration: YAML files and ``key=value`` overrides loaded into nested dataclasses.

A config is a tree of dataclasses. ``load_config`` reads a YAML file (or a dict), applies
command-line overrides with dotted keys, checks every value against the field's type hint
and then runs each section's own ``validate()``. Every problem found is reported in one
``ConfigError``, each naming the full dotted key, the value and a fix; nothing is ever
silently dropped or rewritten.

Supported field types: nested dataclasses, ``int``, ``float``, ``bool``, ``str``,
``pathlib.Path``, ``Literal[...]``, ``Enum``, ``Optional[X]`` / ``X | None``, other unions,
``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict[str, X]`` and ``Any``.

Coercions, all deliberate and few:
- an ``int`` is accepted for a ``float`` field (``lr: 1`` means 1.0);
- a numeric string is accepted for a ``float`` field, because YAML 1.1 reads ``1e-5``
  (no dot) as the string ``"1e-5"``;
- a YAML list is accepted for a ``tuple`` field; a string for a ``Path`` field.
A ``bool`` is never an ``int`` and a float is never an ``int``. YAML 1.1's base-60 and
leading-0 octal numbers (``1:30`` as 90, ``017`` as 15) are read as text, which a number field
refuses. Nothing is expanded: a text or path value starting with ``~/`` or ``$NAME/`` is refused
with its expansion as the fix (``_refuse_unexpanded``).

Semantic checks live with the section that owns them: a config dataclass may define
``validate(self) -> list[str]``, returning problems such as ``"lr: must be > 0, got -1.0"``.
The loader prefixes each with the section's dotted path (``actor.lr: ...``), so semantic
errors and type errors read the same and are reported together. A ``__post_init__`` that
raises ``ValueError`` (or ``ConfigError``) is collected the same way. A value that is wrong
(its type, or refused by its section's checks) stops only the checks that read it: the others,
those across sections included, run on the section with that key at its default and leave out
what they say about it (``_build_dataclass``), so one pass lists every problem.

This module never imports torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import json
import math
import numbers
import os
import re
import secrets
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from loomrl.errors import ConfigError

__all__ = [
    "DuplicateKeyError",
    "load_config",
    "parse_overrides",
    "apply_overrides",
    "to_dict",
    "dump_yaml",
    "config_keys",
]

T = TypeVar("T")

_MISSING = object()
# Separates a problem from its suggested fix in every message.
_DASH = " \u2014 "
_KEY_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_BOOL_TAG = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true and false. Under YAML 1.1
    ``off``, ``no``, ``on`` and ``yes`` are booleans too, so ``wandb: off`` or
    ``iteration_timeout_s=off`` would reach a text setting as False; they stay words here, and
    a bool setting takes them as the words they are (``_BOOL_WORDS``).

    A key given twice in one mapping is a ``DuplicateKeyError``: plain YAML keeps the last, so
    a setting written twice (two edits, a paste) would lose one of them without a word."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.document_root: yaml.Node | None = None
        self.checked_mappings: set[int] = set()

    def construct_document(self, node: yaml.Node) -> Any:
        self.document_root, self.checked_mappings = node, set()
        return super().construct_document(node)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Every mapping is flattened (its '<<' merges resolved, in place) before it is built,
        # the first time as written: that is when its own keys are compared.
        if id(node) not in self.checked_mappings:
            self.checked_mappings.add(id(node))
            _refuse_duplicate_keys(self, node)
        super().flatten_mapping(node)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_BOOL_WORDS = {"yes": True, "on": True, "no": False, "off": False}
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


def _construct_timestamp(loader: _Loader, node: yaml.ScalarNode) -> Any:
    # PyYAML raises a bare ValueError, with no place, for text that reads as a date but is
    # none (2024-13-45); a ConstructorError carries the line and column like any syntax error.
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)
    except ValueError as e:
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.value!r} reads as a date but is not one ({e})", node.start_mark
        ) from None


_Loader.add_constructor(_TIMESTAMP_TAG, _construct_timestamp)


def _yaml11_number(text: str) -> bool:
    """``text`` is a number only YAML 1.1 reads: base 60 (``1:30`` is 90) or a leading 0 that
    makes it octal (``017`` is 15). YAML 1.2 reads neither so, and nobody writing
    ``launch_timeout_s: 1:30`` or ``seed: 0042`` means it: they stay text, which a number setting
    refuses with the fix (``_convert``) and a text setting keeps as written."""
    digits = text.lstrip("+-").replace("_", "")
    return ":" in digits or (len(digits) > 1 and digits[0] == "0" and digits[1].isdigit())


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> Any:
    if _yaml11_number(node.value):
        return node.value
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> Any:
    if ":" in node.value:  # a leading 0 is no octal in a float (01.5 is 1.5)
        return node.value
    return yaml.SafeLoader.construct_yaml_float(loader, node)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names a key twice. ``key`` is its dotted path (``ppo.lr``); ``lines`` the
    lines (from 1) of its first and second occurrence."""

    def __init__(self, key: str, first: yaml.Mark, second: yaml.Mark):
        super().__init__(
            "while constructing a mapping", first, f"found duplicate key {key!r}", second
        )
        self.key, self.lines = key, (first.line + 1, second.line + 1)

    def where(self) -> str:
        first, second = self.lines
        if first == second:
            cols = (self.context_mark.column + 1, self.problem_mark.column + 1)
            return f"on line {first} (columns {cols[0]} and {cols[1]})"
        return f"on lines {first} and {second}"

    def message(self) -> str:
        """The one-line problem a file's reader reports: the key, both places, the fix."""
        return (
            f"duplicate key {self.key!r} {self.where()}{_DASH}a key may be given once per "
            "mapping (YAML and JSON readers would silently keep the last); remove one of them"
        )


def _refuse_duplicate_keys(loader: _Loader, node: yaml.MappingNode) -> None:
    # Keys merged in with '<<' are overridden on purpose, and are not this node's own.
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node)
        try:
            first = seen.setdefault(key, key_node)
        except TypeError:  # unhashable: PyYAML refuses it itself
            continue
        if first is not key_node:
            path = _node_path(loader.document_root, node)
            dotted = _join(path, key) if path is not None else str(key)
            raise DuplicateKeyError(dotted, first.start_mark, key_node.start_mark)


def _node_path(root: yaml.Node | None, target: yaml.Node) -> str | None:
    """The dotted path from ``root`` to the mapping ``target`` ("" for the root itself)."""
    stack: list[tuple[yaml.Node, str]] = [(root, "")] if root is not None else []
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if id(node) in seen:  # an alias met again (YAML allows a node inside itself)
            continue
        seen.add(id(node))
        # Pushed in reverse, so that nodes are met in the file's order: a node an alias
        # repeats (and '<<' merges into another mapping) is met first where it is written.
        if isinstance(node, yaml.MappingNode):
            stack.extend(
                (v, _join(path, k.value if isinstance(k, yaml.ScalarNode) else "?"))
                for k, v in reversed(node.value)
            )
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node.value))))
    return None


class _JsonDuplicate(ValueError):
    pass


def load_json(text: str) -> Any:
    """``json.loads``, but a key given twice in one object is refused: the json module keeps
    the last, as plain YAML does. The error is a ``DuplicateKeyError`` with the key's dotted
    path and both lines, or a ``ValueError`` naming the key where the text is JSON that the
    YAML reader cannot follow."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for k, v in pairs:
            if k in d:
                raise _JsonDuplicate(k)
            d[k] = v
        return d

    try:
        return json.loads(text, object_pairs_hook=unique)
    except _JsonDuplicate as dup:
        # The json module builds inner objects first and keeps no positions, so it cannot say
        # where the key sits; JSON is YAML, and the YAML reader can.
        try:
            load_yaml(text)
        except DuplicateKeyError:  # with the dotted path and both lines
            raise
        except yaml.YAMLError:
            pass
        raise ValueError(
            f"duplicate key {dup.args[0]!r} in one object{_DASH}a key may be given once; "
            "remove one of them"
        ) from None


def load_yaml(text: str) -> Any:
    """Parse YAML text as configs are read (``_Loader``): YAML 1.2's booleans, and a key given
    twice in one mapping is a ``DuplicateKeyError``, not the last one silently winning."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# --------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Parse ``["actor.lr=1e-5", "steps=5"]`` into ``{"actor.lr": "1e-5", "steps": 5}``.

    Values are read as YAML (``5`` -> int, ``true`` -> bool, ``[1, 2]`` -> list, ``null`` or
    an empty value -> None; ``off``/``on``/``yes``/``no`` stay words, see ``_Loader``). A later override of the same
    key wins. Raises ``ConfigError`` listing every malformed override.
    """
    if isinstance(overrides, str):
        # A bare string would be iterated character by character: a caller bug worth naming.
        raise TypeError(
            f"overrides must be a list of 'key=value' strings, got the string {overrides!r}"
        )
    parsed: dict[str, Any] = {}
    problems: list[str] = []
    items = list(overrides)
    for i, j in _split_at_spaces(items):
        # "a.b = 1" on a command line arrives as three words: "a.b", "=", "1" ("a.b= 1" as
        # two, whose first alone would set a.b to null).
        words = " ".join(items[i:j])
        joined = "".join(w.strip() for w in items[i:j])
        problems.append(
            f"{words!r}: the shell split it at the spaces around '='{_DASH}write it without "
            f"spaces: {joined}"
        )
        items[i:j] = [None] * (j - i)  # said; not read again below
    for item in items:
        if item is None:
            continue
        if not isinstance(item, str):
            problems.append(f"override {item!r} is not a string{_DASH}write it as 'key=value'")
            continue
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            hint = _guess_override(item)
            problems.append(f"{item!r} is not key=value{_DASH}write it as {hint}")
            continue
        if not key:
            problems.append(f"{item!r} has an empty key{_DASH}write it as 'key=value'")
            continue
        bad = [seg for seg in key.split(".") if not _KEY_SEGMENT.match(seg)]
        if bad and key.startswith("-") and key.lstrip("-"):
            # `--run.steps=5`, as other tools take options: overrides are bare key=value words
            problems.append(
                f"{item!r}: overrides take no leading '-'{_DASH}write it as {key.lstrip('-')}={raw}"
            )
            continue
        if bad:
            problems.append(
                f"{item!r}: key {key!r} is not a dotted name (bad part {bad[0]!r}){_DASH}"
                "use letters, digits and '_' separated by '.', e.g. actor.lr=1e-5"
            )
            continue
        try:
            value = load_yaml(raw) if raw.strip() else None
        except DuplicateKeyError as e:
            problems.append(f"{item!r}: the value gives the key {e.key!r} twice{_DASH}give it once")
            continue
        except yaml.YAMLError as e:
            first = getattr(e, "problem", None) or str(e).splitlines()[0]
            problems.append(
                f"{item!r}: value {raw!r} is not valid YAML ({first}){_DASH}quote it, e.g. {key}='{raw}'"
            )
            continue
        if glued := _glued_keys(value):
            fixed = raw
            for k in glued:
                head, _, tail = k.partition(":")
                fixed = fixed.replace(k, f"{head}: {tail}", 1)
            problems.append(
                f"{item!r}: YAML reads {', '.join(repr(k) for k in glued)} as a key with no "
                f"value (a ':' in a mapping needs a space after it){_DASH}write {key}='{fixed}'"
            )
            continue
        parsed[key] = value
    if problems:
        raise ConfigError(problems, source="overrides")
    return parsed


def _glued_keys(value: Any) -> list[str]:
    """Keys of the mappings in ``value`` that hold a ':' and map to null: ``{lr:0.1}`` is the
    mapping ``{'lr:0.1': None}`` in YAML's flow style, which would reach a setting (or a
    constructor's keywords) as a key nobody wrote."""
    if isinstance(value, Mapping):
        own = [k for k, v in value.items() if isinstance(k, str) and ":" in k and v is None]
        return own + [k for v in value.values() for k in _glued_keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _glued_keys(v)]
    return []


def _split_at_spaces(items: list[Any]) -> list[tuple[int, int]]:
    """Spans ``[i, j)`` of ``items`` that are one ``key=value`` split at spaces around its '=':
    ``key`` ``=`` ``value`` or ``key=`` ``value``, where ``value`` holds no '=' (an item of its
    own would be ``key=value``). Each word alone would be a problem, or (``key=``) a null."""
    words = [w if isinstance(w, str) else "" for w in items]

    def is_key(w: str) -> bool:
        return bool(w) and "=" not in w and bool(_KEY_SEGMENT.match(w.split(".")[0]))

    spans, i = [], 0
    while i < len(words):
        w, nxt = words[i], words[i + 1] if i + 1 < len(words) else None
        after = words[i + 2] if i + 2 < len(words) else None
        if is_key(w) and nxt == "=" and after is not None and "=" not in after:
            spans.append((i, i + 3))
            i += 3
        elif w.endswith("=") and is_key(w[:-1]) and nxt and "=" not in nxt:
            spans.append((i, i + 2))
            i += 2
        else:
            i += 1
    return spans


def _guess_override(item: str) -> str:
    # 'steps5' -> 'steps=5'; 'actor.lr:1e-5' -> 'actor.lr=1e-5'.
    if ":" in item:
        k, _, v = item.partition(":")
        return f"'{k.strip()}={v.strip()}'"
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*?)(-?\d.*)$", item)
    if m:
        return f"'{m.group(1)}={m.group(2)}'"
    return f"'{item}=<value>'"


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any]) -> dict:
    """Return a copy of ``data`` with dotted-key overrides set (nested dicts created as needed).

    ``overrides`` is a list of ``key=value`` strings or an already parsed ``{dotted_key: value}``.
    Setting a key below a value that is not a mapping (``actor=5`` then ``actor.lr=1``) is a
    ``ConfigError``.
    """
    flat = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    out = _deep_copy_dicts(data)
    problems: list[str] = []
    for dotted, value in flat.items():
        parts = dotted.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part, _MISSING)
            if child is _MISSING or child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                problems.append(
                    f"cannot set {dotted!r}: {where!r} is {_show(child)}, not a section"
                    f"{_DASH}remove the override of {where!r} or the one of {dotted!r}"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError(problems, source="overrides")
    return out


def _deep_copy_dicts(data: Mapping[str, Any]) -> dict:
    return {k: _deep_copy_dicts(v) if isinstance(v, Mapping) else v for k, v in data.items()}


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load_config(
    cls: type[T],
    path_or_dict: str | os.PathLike | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    short_keys: Mapping[str, str] | None = None,
) -> T:
    """Build a ``cls`` instance from a YAML file (or a dict, or None for all defaults) plus overrides.

    ``overrides`` are ``key=value`` strings with dotted keys, applied after the file.
    ``short_keys``: short forms the caller accepts for dotted keys (``{"steps": "run.steps"}``),
    already expanded in ``overrides``; an unknown top-level key close to one is told to mean it.
    Raises ``ConfigError`` listing every unknown key, wrong type, missing required key and
    ``validate()`` problem at once, with ``source`` set to the file's path.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    source: str | None = None
    if path_or_dict is None:
        data: Any = {}
    elif isinstance(path_or_dict, Mapping):
        data = path_or_dict
    else:
        source = str(path_or_dict)
        data = _read_yaml(Path(path_or_dict))
    if not isinstance(data, Mapping):
        raise ConfigError(
            [f"the top level must be a mapping of keys to values, got {_show(data)}"], source=source
        )
    if overrides:
        # Report malformed overrides and bad file keys separately: the former stops the load.
        data = apply_overrides(data, overrides)
    problems: list[str] = []
    result = _build_dataclass(cls, data, "", problems, short_keys or {}, set())
    if problems:
        # The problems may come from the file or from an override: say both were read.
        where = f"{source} with overrides" if source and overrides else source
        raise ConfigError(problems, source=where)
    return result


# The largest config file read: configs are a few KB; this is far past any of them.
MAX_CONFIG_BYTES = 16 << 20


def _read_yaml(path: Path) -> Any:
    if path.is_dir():
        raise ConfigError([f"config {str(path)!r} is a directory; name a YAML file in it"])
    if not path.exists():
        raise ConfigError([f"config file not found: {path}"], source=str(path))
    if not path.is_file():
        # A pipe (`<(sed ... base.yaml)`) can be read once, and the command line reads a
        # config twice (its recipe, then its keys); a device may never end (/dev/zero).
        raise ConfigError(
            [
                f"{path} exists but is not a regular file (a pipe or a device){_DASH}save the "
                "config to a file and name that file"
            ],
            source=str(path),
        )
    try:
        # A checkpoint or data file named by mistake would otherwise be read whole.
        text = read_utf8(path, MAX_CONFIG_BYTES)
    except FileTooLarge:
        raise ConfigError(
            [
                f"more than {MAX_CONFIG_BYTES >> 20} MiB, far more than a config holds{_DASH}"
                "name the YAML config (is this a checkpoint or a data file?)"
            ],
            source=str(path),
        ) from None
    except ValueError as e:  # read_utf8's: the file is not UTF-8 text
        where, byte = e.args
        raise ConfigError(
            [f"not UTF-8 text ({byte} at {where}){_DASH}save the file as UTF-8"], source=str(path)
        ) from None
    except OSError as e:
        raise ConfigError([f"cannot be read: {e}"], source=str(path)) from None
    try:
        data = load_yaml(text)
    except DuplicateKeyError as e:
        raise ConfigError([e.message()], source=str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError([_yaml_problem(e, text)], source=str(path)) from None
    return {} if data is None else data


def _yaml_problem(e: yaml.YAMLError, text: str) -> str:
    """One line for a YAML syntax error: where (line, column and the line's text), what PyYAML
    found, and the usual fix. PyYAML's own message spans five lines and names the file
    "<unicode string>"."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or getattr(e, "context", None)
    if mark is None or what is None:
        return f"not valid YAML: {e}"
    context, started = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and context != what:
        if started is not None and started.line != mark.line:
            context += f" at line {started.line + 1}"
        what = f"{what} ({context})"
    lines = text.splitlines()
    shown = lines[mark.line].rstrip() if mark.line < len(lines) else ""
    shown = f" ({shown[:57] + '...' if len(shown) > 60 else shown!r})" if shown.strip() else ""
    if "'\\t'" in what:
        fix = "indent with spaces; YAML does not allow tabs"
    elif "another document" in what:
        fix = "a config is one document: remove the '---' and merge what follows it"
    elif "reads as a date" in what:
        fix = "quote the value where it is text, or write a real date (YYYY-MM-DD)"
    elif "constructor for the tag" in what:
        fix = "a config holds plain values (text, numbers, lists, mappings): remove the tag"
    else:
        fix = (
            "fix the YAML there or just above it (an indent that does not line up, a bracket "
            "or quote left open, a ':' in an unquoted value)"
        )
    where = f"line {mark.line + 1}, column {mark.column + 1}{shown}"
    return f"not valid YAML at {where}: {what}{_DASH}{fix}"


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as e:  # an annotation that cannot be resolved is a bug in the config class
        raise TypeError(f"cannot resolve the type hints of {cls.__qualname__}: {e}") from e


def _build_dataclass(
    cls: type,
    data: Any,
    prefix: str,
    problems: list[str],
    short_keys: Mapping[str, str] | None = None,
    broken: set[str] | None = None,
) -> Any:
    """Convert ``data`` into ``cls``; append problems; return the instance or ``_MISSING``.
    ``short_keys``: see ``load_config`` (top level only).

    Where some values given are wrong (a wrong type, or refused by the section's own checks),
    every other check still runs: the instance returned is then a stand-in holding those keys'
    defaults, and their dotted keys are added to ``broken``. The checks of this section and of
    those above it run on the stand-in and drop what they say about a broken key (it would be
    about the default, not the value given), so a check across sections runs whenever the
    values it reads are valid. ``load_config`` raises whenever a problem was found, so a
    stand-in never leaves this module. ``_MISSING``: no stand-in can be built (a required key
    is missing or wrong, or a problem names none of the section's keys)."""
    if broken is None:
        broken = set()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        problems.append(_not_a_section(cls, prefix, data))
        return _MISSING
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}

    for key in data:
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            problems.extend(_unknown_key(cls, prefix, key, data[key], short_keys))
        elif not f.init:
            problems.append(
                f"{_join(prefix, key)}: is computed from other keys and cannot be set{_DASH}remove it"
            )

    values: dict[str, Any] = {}
    bad: set[str] = set()  # this section's keys whose value is wrong: stood in for by defaults
    complete = True
    for name, f in fields.items():
        if not f.init:
            continue
        key = _join(prefix, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{key}: missing required key (expected {_type_name(hints[name])})")
                complete = False
            continue
        value = _convert(data[name], hints[name], key, problems, broken)
        if value is _MISSING:
            bad.add(name)
        else:
            values[name] = value
    if not complete:
        # A required key has no default to stand in for it: nothing can be checked here.
        # Nested sections were still built and checked above, so their problems are listed.
        return _MISSING

    def build(wrong: set[str]) -> tuple[Any, list[str]]:
        kwargs = {n: v for n, v in values.items() if n not in wrong}
        for n in wrong:
            default = _default(fields[n])
            if default is _MISSING:
                return _MISSING, []
            kwargs[n] = default
        try:
            return cls(**kwargs), []
        except ConfigError as e:
            return _MISSING, [str(p) for p in e.problems]
        except ValueError as e:
            return _MISSING, [str(e)]

    def report(found: list[str]) -> bool:
        """List the problems in ``found`` that are not about a broken key and mark the keys
        they name broken; False where one names none of this section's keys."""
        below = {k[len(prefix) + 1 :] if prefix else k for k in broken if _is_below(k, prefix)}
        kept = _not_about(found, bad | below)
        problems.extend(_prefix_problems(cls, prefix, kept))
        for p in kept:
            named = _keys_named(p, fields)
            if not named:
                return False
            bad.update(named)
        return True

    instance, found = build(bad)
    if found:  # __post_init__ refused a value
        if not report(found):
            return _MISSING
        instance, found = build(bad)
        if found or instance is _MISSING:
            return _MISSING
    elif instance is _MISSING:
        return _MISSING
    validate = getattr(instance, "validate", None)
    if callable(validate):
        before = set(bad)
        if not report(list(validate())):
            return _MISSING
        if bad - before:
            # The sections above must not read a value this section refused: they get it at
            # its default (replace() keeps what validate() normalised in the others).
            defaults = {n: _default(fields[n]) for n in bad - before}
            if _MISSING in defaults.values():  # a required key: nothing to stand in
                return _MISSING
            try:
                instance = dataclasses.replace(instance, **defaults)
            except (ConfigError, ValueError):
                return _MISSING
    broken.update(_join(prefix, n) for n in bad)
    return instance


def _not_a_section(cls: type, prefix: str, data: Any) -> str:
    key = prefix or "<top level>"
    if data is None:  # `ppo:` with nothing (or only comments) below it
        return (
            f"{key}: is empty (null) where a section ({cls.__name__}) goes{_DASH}give its keys "
            "indented below it, or leave it out to keep every default"
        )
    head = f"{key}: expected a section ({cls.__name__}, a mapping of keys), got {_show(data)}"
    if isinstance(data, list) and data and all(isinstance(x, Mapping) for x in data):
        return f"{head}{_DASH}write its keys without the leading '- ' (a '- ' starts a list item)"
    names = [_join(prefix, f.name) for f in dataclasses.fields(cls) if f.init]
    if not names:
        return head
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{head}{_DASH}set the keys inside it instead ({shown})"


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    if f.default is not dataclasses.MISSING:
        return f.default
    return _MISSING


def _is_below(key: str, prefix: str) -> bool:
    return not prefix or key.startswith(prefix + ".") or key.startswith(prefix + "[")


def _not_about(found: list[str], keys: set[str]) -> list[str]:
    """The problems in ``found`` that name none of ``keys`` (relative dotted keys, e.g.
    ``num_envs``, ``env.num_envs`` or the whole section ``env``, which ``env.pixels``
    names). A key counts as named wherever it stands as a word, even in prose: dropping a
    true problem until the broken value is fixed is better than listing a false one."""
    if not keys:
        return [str(p) for p in found]
    alts = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    named = re.compile(rf"(?<![A-Za-z0-9_.])({alts})(?![A-Za-z0-9_])")
    return [str(p) for p in found if not named.search(str(p))]


def _keys_named(problem: str, fields: Mapping[str, dataclasses.Field]) -> set[str]:
    """The keys of a section that a problem of its own is about: those named before its first
    ': ' (``num_minibatches=9999: must be in [1, rollout_steps=2048]`` is about
    num_minibatches; ``vf_coef=-1, ent_coef=0: ...`` about both), or anywhere in it when it
    has none. A nested key counts as its section (``env.num_envs`` -> ``env``)."""
    head = problem.split(": ", 1)[0]
    words = re.findall(r"(?<![A-Za-z0-9_.])([A-Za-z_][A-Za-z0-9_]*)", head)
    return {w for w in words if w in fields and fields[w].init}


def _prefix_problems(cls: type, prefix: str, found: list[str]) -> list[str]:
    """``"lr: must be > 0"`` in section ``actor`` becomes ``"actor.lr: must be > 0"``."""
    if not prefix:
        return [str(p) for p in found]
    names = {f.name for f in dataclasses.fields(cls)}
    out = []
    for p in found:
        p = str(p)
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)", p)
        if m and m.group(1) in names:
            out.append(f"{prefix}.{p}")
        else:
            out.append(f"{prefix}: {p}")
    return out


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _unknown_key(
    cls: type, prefix: str, key: Any, value: Any, short_keys: Mapping[str, str] | None = None
) -> list[str]:
    """One problem per unknown leaf, each with a did-you-mean among all the keys of ``cls``
    and the ``short_keys`` (see ``load_config``)."""
    root_cls, known = cls, config_keys(cls)
    short = dict(short_keys or {})
    leaves = _flatten(value, str(key)) if isinstance(value, Mapping) and value else []
    if not leaves:
        leaves = [(str(key), value)]
    # Match keys relative to this section (the shared prefix would make every key look close),
    # against dotted keys below it too, so that 'acter.lr' meets 'actor.lr'.
    out = []
    for rel, _ in leaves:
        dotted = _join(prefix, rel)
        close = difflib.get_close_matches(rel, [*known, *short], n=1, cutoff=0.6)
        if rel in short:  # a short form is a command-line spelling; a file nests the key
            head, _, leaf_key = short[rel].rpartition(".")
            out.append(
                f"unknown key {dotted!r}{_DASH}{rel!r} is short for {short[rel]!r} in a "
                f"command-line override only; in a file write it under {head}: "
                f"({head}: {{{leaf_key}: ...}})"
            )
        elif close and close[0] in short:
            what = f"{close[0]!r} (short for {short[close[0]]!r})"
            out.append(f"unknown key {dotted!r}{_DASH}did you mean {what}?")
        elif close:
            out.append(f"unknown key {dotted!r}{_DASH}did you mean {_join(prefix, close[0])!r}?")
        else:
            top = [f.name for f in dataclasses.fields(root_cls) if f.init]
            where = f"under {prefix!r}" if prefix else "at the top level"
            out.append(f"unknown key {dotted!r}{_DASH}valid keys {where}: {', '.join(top)}")
    return out


def _flatten(value: Mapping, prefix: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in value.items():
        key = _join(prefix, k)
        if isinstance(v, Mapping) and v:
            out.extend(_flatten(v, key))
        else:
            out.append((key, v))
    return out


def config_keys(cls: type) -> list[str]:
    """Every settable dotted key of a config dataclass, sections and leaves, in field order."""
    hints = _type_hints(cls)
    keys: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        keys.append(f.name)
        sub = _section_type(hints[f.name])
        if sub is not None:
            keys.extend(f"{f.name}.{k}" for k in config_keys(sub))
    return keys


def _section_type(tp: Any) -> type | None:
    """The dataclass inside ``tp`` (``Foo`` or ``Foo | None``), if any."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        subs = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(subs) == 1:
            return _section_type(subs[0])
    return None


def _is_union(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType)


def _convert(
    value: Any, tp: Any, key: str, problems: list[str], broken: set[str] | None = None
) -> Any:
    """Check ``value`` against the type hint ``tp``; return the converted value or ``_MISSING``.
    ``broken``: see ``_build_dataclass``."""
    if tp is Any or tp is object:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, key, problems, broken=broken)
    if _is_union(tp):
        return _convert_union(value, tp, key, problems, broken)
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        # Compare with the type too: True == 1 but a bool is not the choice 1.
        for c in choices:
            if value == c and type(value) is type(c):
                return c
        shown = ", ".join(repr(c) for c in choices)
        msg = f"{key}: expected one of {shown}, got {_show(value)}"
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
        if close:
            msg += f"{_DASH}did you mean {close[0]!r}?"
        problems.append(msg)
        return _MISSING
    if origin in (list, Sequence):
        return _convert_list(value, tp, key, problems, broken)
    if origin is tuple:
        return _convert_tuple(value, tp, key, problems, broken)
    if origin in (dict, Mapping):
        return _convert_dict(value, tp, key, problems, broken)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _convert_enum(value, tp, key, problems)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        return _wrong(key, "bool (true or false)", value, problems)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        hint = ""
        number = finite_number(value)  # YAML reads 1e3 (no dot) as text, 1.0e3 as a float
        if number is not None and number.is_integer() and not isinstance(value, bool):
            hint = f"{_DASH}write {int(number)}"
        return _wrong(key, "int", value, problems, hint or _base60_hint(value))
    if tp is float:
        if isinstance(value, bool):
            return _wrong(key, "float", value, problems)
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        if number is None:
            return _wrong(key, "float", value, problems, _base60_hint(value))
        if math.isnan(number):  # NaN passes every range check
            problems.append(f"{key}: NaN is not a value; give a number")
            return _MISSING
        return number
    if tp is str:
        if isinstance(value, str):
            return _refuse_unexpanded(key, value, problems)
        hint = ""
        if isinstance(value, (int, float, bool)):
            hint = f'{_DASH}quote it if you meant the text: {key.rsplit(".", 1)[-1]}: "{value}"'
        return _wrong(key, "str", value, problems, hint)
    if tp is Path or (isinstance(tp, type) and issubclass(tp, os.PathLike)):
        if isinstance(value, (str, os.PathLike)):
            checked = _refuse_unexpanded(key, os.fspath(value), problems)
            return checked if checked is _MISSING else Path(checked)
        return _wrong(key, "a path (str)", value, problems)
    if tp is list or tp is dict or tp is tuple:
        if tp is tuple and isinstance(value, list):
            return tuple(value)
        if isinstance(value, tp):
            return value
        return _wrong(key, tp.__name__, value, problems)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        return _wrong(key, tp.__name__, value, problems)
    raise TypeError(f"{key}: unsupported config field type {tp!r}")


def _convert_union(
    value: Any, tp: Any, key: str, problems: list[str], broken: set[str] | None = None
) -> Any:
    args = typing.get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        return _wrong(key, _type_name(tp), value, problems)
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:
        return _convert(value, options[0], key, problems, broken)
    # Prefer an exact match so that `int | float` keeps 3 an int and `float | str` keeps "1e-5" a str.
    for opt in options:
        if isinstance(opt, type) and not dataclasses.is_dataclass(opt):
            if type(value) is opt:
                return _convert(value, opt, key, problems, broken)  # its own checks still apply
    for opt in options:
        trial: list[str] = []
        out = _convert(value, opt, key, trial, set())
        if not trial and out is not _MISSING:
            return out
    return _wrong(key, _type_name(tp), value, problems)


def _convert_list(
    value: Any, tp: Any, key: str, problems: list[str], broken: set[str] | None = None
) -> Any:
    if not isinstance(value, list):
        return _wrong(key, _type_name(tp), value, problems, _list_hint(key, value))
    (item_tp,) = typing.get_args(tp) or (Any,)
    out, ok = [], True
    for i, item in enumerate(value):
        v = _convert(item, item_tp, f"{key}[{i}]", problems, broken)
        ok &= v is not _MISSING
        out.append(v)
    return out if ok else _MISSING


def _convert_tuple(
    value: Any, tp: Any, key: str, problems: list[str], broken: set[str] | None = None
) -> Any:
    args = typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        items = len(args) if args and args[-1] is not Ellipsis else 1
        return _wrong(key, _type_name(tp), value, problems, _list_hint(key, value, items))
    if not args:
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(value)
    else:
        if len(value) != len(args):
            problems.append(
                f"{key}: expected {len(args)} items ({_type_name(tp)}), got {len(value)}: {_show(value)}"
            )
            return _MISSING
        item_types = list(args)
    out, ok = [], True
    for i, (item, item_tp) in enumerate(zip(value, item_types, strict=True)):
        v = _convert(item, item_tp, f"{key}[{i}]", problems, broken)
        ok &= v is not _MISSING
        out.append(v)
    return tuple(out) if ok else _MISSING


def _convert_dict(
    value: Any, tp: Any, key: str, problems: list[str], broken: set[str] | None = None
) -> Any:
    if not isinstance(value, Mapping):
        leaf = key.rsplit(".", 1)[-1]
        hint = f"{_DASH}write a mapping, e.g. {leaf}: {{name: value}}, or {leaf}: {{}} for none"
        return _wrong(key, _type_name(tp), value, problems, hint)
    args = typing.get_args(tp) or (Any, Any)
    key_tp, val_tp = args
    out, ok = {}, True
    for k, v in value.items():
        kk = _convert(k, key_tp, f"{key} key {k!r}", problems)
        vv = _convert(v, val_tp, f"{key}.{k}", problems, broken)
        ok &= kk is not _MISSING and vv is not _MISSING
        out[kk] = vv
    return out if ok else _MISSING


# A leading '~/' or '$NAME/' (or '${NAME}') in a value with no spaces: a path the shell would
# have expanded. Prompts and other text have spaces, and math text writes '$a/b$' inside them.
_SHELL_PREFIX = re.compile(
    r"^(~[A-Za-z0-9_.\-]*|\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\})(/|$)"
)


def _refuse_unexpanded(key: str, value: str, problems: list[str]) -> Any:
    """``value``, or ``_MISSING`` with a problem where it starts as a path the shell would have
    expanded: the config reads it as written, and ``output_dir: ~/runs`` would make a folder
    named '~' in the working directory. Refused rather than expanded, so that what config.yaml
    records is what was written (``~`` and ``$HOME`` differ from one machine to the next)."""
    m = _SHELL_PREFIX.match(value)
    if m is None or any(c.isspace() for c in value) or (m.group(2) == "" and value[0] == "~"):
        return value
    full = os.path.expandvars(os.path.expanduser(value))
    fix = f"write the full path: {full}" if full != value else "write the full path"
    problems.append(
        f"{key}: {value!r} starts with {m.group(1)!r}, which a shell expands and a config does "
        f"not (it would be a folder named {m.group(1)!r}){_DASH}{fix}"
    )
    return _MISSING


def _base60_hint(value: Any) -> str:
    # `1:30` is 90 to a YAML 1.1 reader and text to this one (_yaml11_number)
    if isinstance(value, str) and ":" in value:
        return f"{_DASH}write one number in one unit (1:30 is not read as 90 here)"
    return ""


def _list_hint(key: str, value: Any, items: int = 1) -> str:
    # `hidden: 64` for `hidden: [64]`, `clip: 0.2` for `clip: [0.2, 0.2]`
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        shown = ", ".join([str(value)] * items)
        what = "a list" if items == 1 else f"a list of {items} items"
        return f"{_DASH}write {what}, e.g. {key.rsplit('.', 1)[-1]}: [{shown}]"
    return ""


def _convert_enum(value: Any, tp: type[enum.Enum], key: str, problems: list[str]) -> Any:
    if isinstance(value, tp):
        return value
    for member in tp:
        if value == member.value or value == member.name:
            return member
    choices = [repr(m.value) for m in tp]
    problems.append(f"{key}: expected one of {', '.join(choices)}, got {_show(value)}")
    return _MISSING


def _wrong(key: str, expected: str, value: Any, problems: list[str], hint: str = "") -> Any:
    if not hint and isinstance(value, str) and value.strip() in ("None", "none", "NULL", "Null"):
        # Python's word, or SQL's, for YAML's null: the value the user most likely meant
        hint = f"{_DASH}YAML writes no value as null (or ~)"
    problems.append(f"{key}: expected {expected}, got {_show(value)}{hint}")
    return _MISSING


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _type_name(a) for a in typing.get_args(tp))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]"
    return str(tp).replace("typing.", "")


# --------------------------------------------------------------------------------------
# Dumping
# --------------------------------------------------------------------------------------


def to_dict(cfg: Any) -> Any:
    """A plain, YAML/JSON-safe copy of a config: dataclasses -> dicts, Path -> str, tuple -> list,
    Enum -> its value. ``load_config(type(cfg), to_dict(cfg))`` gives back an equal config."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, Mapping):
        return {to_dict(k): to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple, set, frozenset)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, enum.Enum):
        return to_dict(cfg.value)
    if isinstance(cfg, os.PathLike):
        return os.fspath(cfg)
    return cfg


def dump_yaml(cfg: Any, path: str | os.PathLike) -> Path:
    """Write ``to_dict(cfg)`` as YAML (fields in declaration order), atomically. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)
    atomic_write_text(path, text)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one (temp file, fsync, rename).
    The temp file is created 0666 less the umask, like any output (mkstemp's would be private)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def finite_in(x: Any, in_range: Callable[[float], bool] = lambda v: True) -> bool:
    """``x`` is a real number (not a bool, not text: a loaded config field holds none), neither
    NaN nor ±inf, for which ``in_range`` holds. The loader lets inf through to such checks."""
    v = finite_number(x) if not isinstance(x, str) else None
    return v is not None and bool(in_range(v))


def finite_number(v: Any) -> float | None:
    """``v`` as a float when it is a finite real number, else None. Bools are not numbers here
    (Python counts True as 1; a setting must not), numpy's reals are, and so is text that reads
    as one: PyYAML (YAML 1.1) reads ``1e-3``, without a dot, as a string."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    # numpy's bool is no bool subclass, nor a numbers.Real: refused by the second test
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int past float's range (10**400) is no finite setting
        return None
    return x if math.isfinite(x) else None


class FileTooLarge(Exception):
    """``read_utf8(path, max_bytes)`` found more than ``max_bytes`` (args: the bytes read)."""


def read_utf8(path: Path, max_bytes: int | None = None) -> str:
    """The text of a UTF-8 file, newlines as ``\\n``; ``ValueError`` naming ``path:line`` and
    the byte that is not UTF-8 (a data file saved in another encoding), for the caller to say as
    its own error. ``max_bytes``: read no more (``FileTooLarge``): a pipe has no size to check
    first, and a file named by mistake (a checkpoint) would be read whole into memory."""
    with open(path, "rb") as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise FileTooLarge(len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}", f"byte {e.object[e.start]:#x}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as open()'s text mode reads
