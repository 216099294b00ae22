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
  the field and what to do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autorl.errors import RulesError, UserError, validation_line

# A float with an exponent and no dot (3e-4), or an exponent without a sign (1.0e5): strings in YAML 1.1.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
_FIRST = list("-+0123456789.")


class _Loader(yaml.SafeLoader):
    """Safe YAML with numbers like 3e-4 read as numbers."""


class _Dumper(yaml.SafeDumper):
    """Safe YAML that quotes a string which ``_Loader`` would read as a number."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, _FIRST)

Model = TypeVar("Model", bound=BaseModel)


def _yaml(text: str) -> Any:
    """The one call into the YAML parser: every text autorl reads as YAML goes through here."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def parse(text: str, source: str | Path = "", error: type[UserError] = UserError, first_line: int = 1,
          where: str = "") -> Any:
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
    return f"{at}: not valid YAML ({getattr(exc, 'problem', exc)})"


def parse_value(raw: str) -> Any:
    """One command-line value: YAML scalar or flow collection (``3e-4``, ``true``, ``[4, 8]``); else the text."""
    if not raw.strip():
        return ""
    try:
        return _yaml(raw)
    except yaml.YAMLError:
        return raw


def dump(data: Any) -> str:
    """Block-style YAML of ``data``, keys in their order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def render(value: Any) -> str:
    """``value`` as it is written after ``key: `` on one line (flow style for a list or mapping)."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, allow_unicode=True, sort_keys=False, width=10**6)
    return text.strip().removesuffix("...").strip()


def load_table(path: str | Path, model: type[Model], what: str, doc: str,
               check: Callable[[Model], str | None] | None = None, includes: str | None = None) -> Model:
    """The table at ``path`` validated by ``model`` (and by ``check``, which returns what is wrong or None).

    ``includes`` names a key of the table that lists more files (beside it) whose lists are appended to the
    table's lists of the same keys. Cached per version of every file read (size, modification time). Any problem
    raises ``RulesError``: '<what> <path>: <problem>: fix the file (see <doc>)'."""
    path = Path(path)
    key = (path, model, what, doc, check, includes)
    cached = _TABLES.get(key)
    if cached is not None and _versions(cached[0], what, doc) == cached[1]:
        return cached[2]
    files, versions, data = _read_with_includes(path, includes, what, doc)
    table = _validated(data, path, model, what, doc, check)
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
            raise RulesError(f"{what} {path}: {includes} names {name}, which is not a file beside it: fix the file "
                             f"(see {doc})")
        versions += _versions([extra_path], what, doc)
        extra = _read_data(extra_path, what, doc)
        files.append(extra_path)
        for k, v in (extra.items() if isinstance(extra, dict) else []):
            if isinstance(v, list):
                data[k] = [*(data.get(k) or []), *v]
    return files, versions, data


def _read_data(path: Path, what: str, doc: str) -> Any:
    def fail(problem: str) -> RulesError:
        return RulesError(f"{what} {path}: {problem}: fix the file (see {doc})")

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RulesError(f"{what} {path}: cannot be read (no such file): restore the file (see {doc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot be read ({exc.__class__.__name__})") from None
    try:
        return _yaml(text)
    except yaml.YAMLError as exc:
        raise fail(error_text(exc).removeprefix(" ").removeprefix(": ")) from None


def _validated(data: Any, path: Path, model: type[Model], what: str, doc: str,
               check: Callable[[Model], str | None] | None) -> Model:
    try:
        table = model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise RulesError(f"{what} {path}: {validation_line(exc)}: fix the file (see {doc})") from None
    problem = check(table) if check else None
    if problem:
        raise RulesError(f"{what} {path}: {problem}: fix the file (see {doc})")
    return table
