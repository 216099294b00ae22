"""Reading YAML: the one parser of recipe files, ``--set`` values and hypothesis front matter, and the one loader
of the rules tables (``autorl/data/rules/*.yaml``).

The dialect is PyYAML's safe YAML 1.1 with one change: a number written without a dot (``3e-4``, ``1e-5``,
``2E+3``) is a number, as YAML 1.2 and every reader of a recipe take it, not the string YAML 1.1 makes of it.
A string that looks like such a number is quoted when dumped, so text written here reads back the same.

- ``parse(text, source, error)``: the data of a YAML text; a syntax error is one ``error`` line naming the line;
- ``parse_value(raw)``: one ``key=value`` value from the command line (text that is not YAML stays text);
- ``dump(data)`` and ``render(value)``: YAML text of a mapping, and one value as it is written after ``key: ``;
- ``load_table(path, model, what, doc)``: a rules table read (with the files it includes), parsed and validated
  by its pydantic model, cached per version of its files; any problem is one ``RulesError`` line naming the file,
  the field and what to do;
- ``read_text(path, error, what)``: a file's text, read with the size bound;
- ``read_bytes(path, error, what, max_bytes)`` and ``read_utf8(...)``: a regular file's bytes (text), opened without
  blocking and checked once open (a folder, a FIFO, a device such as /dev/zero is one ``error`` line, never a hang
  or an endless read), bounded by ``max_bytes``; text that is not UTF-8 names its line and byte;
- ``tail_bytes(path, limit)``: the last ``limit`` bytes of a regular file (a log), the same way; ``OSError`` (its
  ``strerror`` says what the path is) otherwise.

Whatever is read is bounded before it can cost anything (``LIMITS``): a text over 1 MiB, nesting deeper than 64
levels, aliases that would expand to more than 2,000,000 values and characters (an alias bomb, or an alias that
holds itself), a key given twice in one mapping, an integer outside 64 bits or a number written with more than 100
characters, a float that overflows, a date that does not exist: each is one ``Refused`` (a YAML error with the line
it is on), which every caller turns into its own one-line error. Anchors, aliases and ``<<`` merges are allowed
within the bound.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autorl.errors import RulesError, UserError, short, validation_line

# A float with an exponent and no dot (3e-4), or an exponent without a sign (1.0e5): strings in YAML 1.1.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_FIRST = list("-+0123456789.")


@dataclass(frozen=True)
class Limits:
    """The bounds on what autorl reads as YAML."""

    max_bytes: int = 1 << 20  # the text (and any file read as text)
    max_depth: int = 64  # nested collections
    max_expanded: int = 2_000_000  # values + characters of a node with every alias expanded
    max_number_chars: int = 100  # how a number is written
    int_range: tuple[int, int] = (-(2**63), 2**63 - 1)  # what SQLite and every library downstream can hold


LIMITS = Limits()


class Refused(yaml.MarkedYAMLError):
    """YAML that is refused for what it would cost or because it cannot mean one thing (a key given twice)."""

    def __init__(self, problem: str, mark: Any = None):
        super().__init__(problem=problem, problem_mark=mark)


class _Loader(yaml.SafeLoader):
    """Safe YAML with numbers like 3e-4 read as numbers, and the bounds of ``LIMITS`` applied while it is read."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._weight: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Each node once, refusing depth beyond the bound and aliases that hold themselves or expand too far."""
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            held = self.anchors.get(event.anchor)
            if held is not None and id(held) not in self._weight:
                raise Refused(
                    f"alias *{short(event.anchor, 40)} is inside the value it names (it would never end): "
                    "write the value out",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > LIMITS.max_depth:
            raise Refused(f"nested deeper than {LIMITS.max_depth} levels: flatten it", event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._weigh(node)
        return node

    def _weigh(self, node: Any) -> None:
        if isinstance(node, yaml.ScalarNode):
            weight = 1 + len(node.value)
        else:
            children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
            weight = 1 + sum(self._weight.get(id(child), 1) for child in children)
        if weight > LIMITS.max_expanded:
            raise Refused(
                f"aliases here expand to more than {LIMITS.max_expanded:,} values and characters (an alias "
                "bomb?): write the values out",
                node.start_mark,
            )
        self._weight[id(node)] = weight

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        """A value that cannot be built (an impossible date, a number out of range) names its line."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
            raise Refused(
                f"{short(getattr(node, 'value', ''), 40)!r} cannot be read ({short(exc, 80)})", node.start_mark
            ) from None

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        """A mapping in which no key is given twice (a ``<<`` merge may be overridden, as YAML says)."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise Refused(
                        f"key {short(key, 60)!r} is given twice in one mapping (first on line "
                        f"{seen[key] + 1}): keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        _check_length(node)
        _check_base_60(node)
        value = super().construct_yaml_int(node)
        low, high = LIMITS.int_range
        if not low <= value <= high:
            raise Refused(
                f"the integer {short(node.value, 40)} is outside 64 bits: give a smaller number", node.start_mark
            )
        return value

    def construct_yaml_float(self, node: Any) -> float:
        _check_length(node)
        _check_base_60(node)
        value = super().construct_yaml_float(node)
        if math.isinf(value) and "inf" not in node.value.lower():
            raise Refused(
                f"the number {short(node.value, 40)} is too large for a float: give a smaller number or .inf",
                node.start_mark,
            )
        mantissa = re.split(r"[eE]", node.value, maxsplit=1)[0]
        if value == 0.0 and re.search(r"[1-9]", mantissa):
            raise Refused(
                f"the number {short(node.value, 40)} is too small for a float (it would be read as 0): give 0 or a "
                "number above 1e-308",
                node.start_mark,
            )
        return value


def _check_base_60(node: Any) -> None:
    """YAML 1.1 reads ``1:30`` as 90 (base 60): a time or a ratio written unquoted becomes a number nobody meant."""
    if ":" in node.value:
        raise Refused(
            f"{short(node.value, 40)} reads as a base-60 number in YAML 1.1: write the number itself, or quote it "
            "for text",
            node.start_mark,
        )


def _check_length(node: Any) -> None:
    if len(node.value) > LIMITS.max_number_chars:
        raise Refused(
            f"a number written with {len(node.value):,} characters (more than {LIMITS.max_number_chars}): "
            "give a smaller number",
            node.start_mark,
        )


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
for _tag in ("binary", "set", "omap", "pairs"):  # bytes, sets and pair lists: nothing a recipe or table holds
    del _Loader.yaml_constructors[f"tag:yaml.org,2002:{_tag}"]


class _Dumper(yaml.SafeDumper):
    """Safe YAML that quotes a string which ``_Loader`` would read as a number."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, _FIRST)

Model = TypeVar("Model", bound=BaseModel)


def _yaml(text: str) -> Any:
    """The one call into the YAML parser: every text autorl reads as YAML goes through here, within ``LIMITS``."""
    if len(text) > LIMITS.max_bytes:
        raise Refused(
            f"{len(text) / (1 << 20):.1f} MiB of text is more than the {LIMITS.max_bytes >> 20} MiB autorl "
            "reads: shorten it"
        )
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except RecursionError:
        raise Refused("nested too deeply to read: flatten it") from None


def read_text(path: str | Path, error: type[UserError], what: str) -> str:
    """The text of the file at ``path``, read with the size bound; a file that is larger, not there, not a regular
    file or not UTF-8 is one ``error`` line: '<what> <path>: <problem>'."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {short(p, 200)} not found (or not a regular file): pass the path of a file")
    try:
        with open(p, "rb") as fh:
            data = fh.read(LIMITS.max_bytes + 1)
    except OSError as exc:
        raise error(f"{what} {short(p, 200)} cannot be read ({exc.strerror}): check its permissions") from None
    if len(data) > LIMITS.max_bytes:
        raise error(f"{what} {short(p, 200)} is larger than the {LIMITS.max_bytes >> 20} MiB autorl reads: shorten it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {short(p, 200)} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None


def parse(
    text: str, source: str | Path = "", error: type[UserError] = UserError, first_line: int = 1, where: str = ""
) -> Any:
    """The data of ``text``; a syntax error raises ``error``: '<source> line N: not valid YAML (problem)<where>'.

    ``first_line`` is the file line of the text's line 1 (front matter starts on line 2)."""
    try:
        return _yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{source}{error_text(exc, first_line)}{where}") from None


def error_text(exc: yaml.YAMLError, first_line: int = 1) -> str:
    """' line N: not valid YAML (problem)' for a parse error."""
    line = getattr(getattr(exc, "problem_mark", None), "line", None)
    at = f" line {line + first_line}" if line is not None else ""
    if isinstance(exc, Refused):
        return f"{at}: {exc.problem}"
    return f"{at}: not valid YAML ({short(getattr(exc, 'problem', None) or exc, 200)})"


def parse_value(raw: str) -> Any:
    """One command-line value: YAML scalar or flow collection (``3e-4``, ``true``, ``[4, 8]``); else the text."""
    if not raw.strip():
        return ""
    try:
        return _yaml(raw)
    except Refused:
        raise
    except yaml.YAMLError:
        return raw


def dump(data: Any) -> str:
    """Block-style YAML of ``data``, keys in their order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def render(value: Any) -> str:
    """``value`` as it is written after ``key: `` on one line (flow style for a list or mapping)."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, allow_unicode=True, sort_keys=False, width=10**6)
    return text.strip().removesuffix("...").strip()


def load_table(
    path: str | Path,
    model: type[Model],
    what: str,
    doc: str,
    check: Callable[[Model], str | None] | None = None,
    includes: str | None = None,
) -> Model:
    """The table at ``path`` validated by ``model`` (and by ``check``, which returns what is wrong or None).

    ``includes`` names a key of the table that lists more files (beside it) whose lists are appended to the
    table's lists of the same keys. Cached per version of every file read (size, modification time). Any problem
    raises ``RulesError``: '<what> <path>: <problem>: fix the file (see <doc>)'."""
    path = Path(path)
    key = (path, model, what, doc, check, includes)
    cached = _TABLES.get(key)
    if cached is not None and _versions(cached[0], what, doc) == cached[1]:
        return cached[2]
    try:
        files, versions, data = _read_with_includes(path, includes, what, doc)
        table = _validated(data, path, model, what, doc, check)
    except RulesError as exc:  # one line, whatever the table's own keys and values hold (a key may be "\n")
        raise RulesError(" ".join(str(exc).split())) from None
    if len(_TABLES) >= 64:
        _TABLES.clear()
    _TABLES[key] = (files, versions, table)
    return table


_TABLES: dict[tuple, tuple[list[Path], tuple, Any]] = {}  # the tables read, with the versions of their files


def _versions(files: list[Path], what: str, doc: str) -> tuple:
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError as exc:
            raise RulesError(f"{what} {f}: cannot be read ({exc.strerror}): restore the file (see {doc})") from None
        out.append((st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read_with_includes(path: Path, includes: str | None, what: str, doc: str) -> tuple[list[Path], tuple, Any]:
    """Every file read, their versions as they were before the reads, and the table's data with the files it
    includes merged in."""
    versions = _versions([path], what, doc)
    data = _read_data(path, what, doc)
    files = [path]
    names = data.get(includes) if includes and isinstance(data, dict) else None
    for name in names or []:
        extra_path = path.parent / str(name)
        if not extra_path.is_file():
            raise RulesError(
                f"{what} {path}: {includes} names {name}, which is not a file beside it: fix the file (see {doc})"
            )
        versions += _versions([extra_path], what, doc)
        extra = _read_data(extra_path, what, doc)
        files.append(extra_path)
        for k, v in extra.items() if isinstance(extra, dict) else []:
            if isinstance(v, list):
                data[k] = [*(data.get(k) or []), *v]
    return files, versions, data


def _read_data(path: Path, what: str, doc: str) -> Any:
    def fail(problem: str) -> RulesError:
        return RulesError(f"{what} {path}: {problem}: fix the file (see {doc})")

    if not path.exists():
        raise RulesError(f"{what} {path}: cannot be read (no such file): restore the file (see {doc})") from None
    try:
        text = read_text(path, RulesError, what)
    except RulesError as exc:
        raise fail(str(exc).removeprefix(f"{what} {path} ")) from None
    try:
        return _yaml(text)
    except yaml.YAMLError as exc:
        raise fail(error_text(exc).removeprefix(" ").removeprefix(": ")) from None


def _validated(
    data: Any, path: Path, model: type[Model], what: str, doc: str, check: Callable[[Model], str | None] | None
) -> Model:
    try:
        table = model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise RulesError(f"{what} {path}: {validation_line(exc)}: fix the file (see {doc})") from None
    problem = check(table) if check else None
    if problem:
        raise RulesError(f"{what} {path}: {problem}: fix the file (see {doc})")
    return table


# ---- regular files, opened without blocking ----------------------------------------------------------------------

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFile(OSError):
    """A path that names a folder, a FIFO, a device or a socket where a file was wanted."""

    def __init__(self, path: str | Path, mode: int):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file", str(path))


def _open_regular(path: str | Path) -> int:
    """A read-only descriptor of the regular file at ``path``. It is opened without blocking (a FIFO with no writer
    never stalls it) and checked once open, so what is read is what was checked; ``OSError`` otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tail_bytes(path: str | Path, limit: int) -> bytes:
    """The last ``limit`` bytes of the regular file at ``path`` (a log that grows while it is read gives no more);
    ``OSError`` when it cannot be read, ``NotRegularFile`` for a folder, a FIFO or a device."""
    fd = _open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        fh.seek(max(0, os.fstat(fd).st_size - limit))
        return fh.read(limit)


def read_bytes(path: str | Path, error: type[UserError], what: str, max_bytes: int = LIMITS.max_bytes) -> bytes:
    """The bytes of the regular file at ``path``; a file that is not there, not a regular file (a folder, a FIFO, a
    device), cannot be read or holds more than ``max_bytes`` is one ``error`` line: '<what> <path> <problem>: <what
    to do>'."""
    p = Path(path)
    try:
        fd = _open_regular(p)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except NotRegularFile as exc:
        raise error(f"{what} {short(p, 200)} {exc.strerror}: pass the path of a file") from None
    except FileNotFoundError:
        raise error(f"{what} {short(p, 200)} not found: pass the path of a file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or short(exc, 100)
        raise error(f"{what} {short(p, 200)} cannot be read ({reason}): check the path and its permissions") from None
    if len(data) > max_bytes:
        raise error(f"{what} {short(p, 200)} is larger than the {_size(max_bytes)} autorl reads: shorten it")
    return data


def decode_utf8(data: bytes, path: str | Path, error: type[UserError], what: str) -> str:
    """``data`` (read from ``path``) as UTF-8 text; text that is not is one ``error`` line naming the line and the
    byte where it stops being UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(
            f"{what} {short(Path(path), 200)} is not UTF-8 text (line {line}, byte {exc.start}): save it as UTF-8"
        ) from None


def read_utf8(path: str | Path, error: type[UserError], what: str, max_bytes: int = LIMITS.max_bytes) -> str:
    """The UTF-8 text of the regular file at ``path``, read as ``read_bytes`` reads it (one ``error`` line for any
    problem, text that is not UTF-8 included)."""
    return decode_utf8(read_bytes(path, error, what, max_bytes), path, error, what)


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and not n % (1 << 30) else f"{n >> 20} MiB"
