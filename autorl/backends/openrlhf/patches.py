"""The OpenRLHF patches autorl relies on: find them, check them, apply them.

``patches/*.patch`` are unified diffs with ``a/openrlhf/...`` / ``b/openrlhf/...``
paths, applied with ``patch -p1`` from the site-packages directory that holds
``openrlhf`` (seed 004 §3: never edit site-packages by hand). ``check`` reads
each patch's state without touching a file:

- ``applied``: the reverse dry run (``-R --dry-run``) succeeds;
- ``not applied``: the forward dry run (``--forward --dry-run``) succeeds;
- ``conflicts``: neither does (another version, or the files were edited);
- ``other version``: the patch's header line ``# autorl: applies to openrlhf < 0.10.2``
  (bounds joined by commas) excludes the installed version, so it is neither checked nor applied. A patch
  written for one release (``== 0.10.4``) is applied only where that release is known to be installed.

A second header line, ``# autorl: needed for train.offload``, says the patch adds what only recipes that set
that field use (a flag): preflight requires it only of those recipes (``needed_by``).

``apply`` applies the ``not applied`` ones and leaves the rest. GNU ``patch``
must be on PATH. Commands are argv lists; no shell.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from importlib import metadata, util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autorl import loading
from autorl.backends.openrlhf.flags import parse_version
from autorl.data import shipped
from autorl.errors import AutorlError, UserError

State = Literal["applied", "not applied", "conflicts", "other version"]
TARGET = re.compile(r"^# autorl: applies to openrlhf ([^(\n]+)", re.MULTILINE)
NEEDED = re.compile(r"^# autorl: needed for train\.(\w+)", re.MULTILINE)
BOUND = re.compile(r"^\s*(<=|>=|==|<|>)\s*([0-9][0-9.]*)\s*$")
COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
DEFAULT_DIR = shipped("patches")


class PatchError(UserError):
    """A patch cannot be checked or applied (no GNU patch, no openrlhf, conflicts)."""


class PatchStatus(BaseModel):
    """The state of one patch file against one site-packages directory."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Patch file name, e.g. metrics_trainer.patch.")
    state: State = Field(description="applied, not applied, or conflicts.")
    files: list[str] = Field(default_factory=list, description="Files the patch touches (relative to site-packages).")
    detail: str = Field("", description="patch's own output when the state is conflicts.")


def patch_files(patches_dir: str | Path) -> list[Path]:
    """The ``*.patch`` files of ``patches_dir``, sorted by name."""
    path = Path(patches_dir)
    if not path.is_dir():
        raise PatchError(f"patches directory {path} not found: pass the folder that holds the .patch files")
    found = sorted(path.glob("*.patch"))
    for p in found:
        if not p.is_file():
            kind = "a folder" if p.is_dir() else "not a regular file"
            raise PatchError(f"patch {p} is {kind}: remove it from {path} or pass a folder of .patch files")
    return found


PATCH_MAX_BYTES = 16 << 20


def _text(patch_path: str | Path) -> str:
    """A patch file's text: one ``PatchError`` line when it is not a regular UTF-8 file within the size bound."""
    return loading.read_utf8(patch_path, PatchError, "patch", PATCH_MAX_BYTES)


def site_packages_of(package: str = "openrlhf") -> Path | None:
    """The directory that holds ``package`` (its parent), or None if it is not installed."""
    spec = util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def default_site_packages() -> Path:
    """Where openrlhf is installed, else this interpreter's purelib."""
    return site_packages_of() or Path(sysconfig.get_paths()["purelib"])


def version_at(site_packages: str | Path) -> str | None:
    """The openrlhf version installed in ``site_packages`` (from its dist-info), or None."""
    found = list(metadata.distributions(name="openrlhf", path=[str(site_packages)]))
    return found[0].version if found else None


def target(patch_path: str | Path) -> str | None:
    """The version bounds a patch declares in its header, e.g. ``< 0.10.2``; None applies to every version."""
    match = TARGET.search(_text(patch_path))
    return match.group(1).strip() if match else None


def needed_for(patch_path: str | Path) -> str | None:
    """The ``train`` field whose recipes need this patch (its header ``# autorl: needed for train.FIELD``); None:
    every recipe on the versions it targets."""
    match = NEEDED.search(_text(patch_path))
    return match.group(1) if match else None


def needed_by(patch_path: str | Path, params) -> bool:
    """Whether a recipe's ``train`` block (``params``; None: any recipe) needs this patch."""
    field = needed_for(patch_path)
    return field is None or params is None or bool(getattr(params, field, False))


def applies_to(patch_path: str | Path, version: str | None) -> bool:
    """Whether the patch targets ``version``. Patches with no header: yes. An unknown version: yes, unless the
    patch is written for one release only (``== X``), which is never applied on a guess."""
    bounds = target(patch_path)
    if bounds is None:
        return True
    if version is None:
        return not any(b.strip().startswith("==") for b in bounds.split(","))
    for bound in bounds.split(","):
        match = BOUND.match(bound)
        if match is None:
            raise PatchError(f"{Path(patch_path).name}: bad version bound {bound.strip()!r}: write it like '< 0.10.2'")
        if not COMPARE[match.group(1)](parse_version(version), parse_version(match.group(2))):
            return False
    return True


def check(patches_dir: str | Path, site_packages: str | Path) -> list[PatchStatus]:
    """The state of every patch in ``patches_dir`` against ``site_packages``; changes nothing."""
    version = version_at(site_packages)
    return [
        _status(p, Path(site_packages)) if applies_to(p, version) else _other(p, version)
        for p in patch_files(patches_dir)
    ]


def _other(patch_path: Path, version: str | None) -> PatchStatus:
    return PatchStatus(
        name=patch_path.name,
        state="other version",
        files=touched_files(patch_path),
        detail=f"written for openrlhf {target(patch_path)}; installed: {version or 'unknown (no dist-info)'}",
    )


def apply(patches_dir: str | Path, site_packages: str | Path) -> list[PatchStatus]:
    """Apply every ``not applied`` patch; return the states afterwards. Conflicts raise PatchError first."""
    statuses = check(patches_dir, site_packages)
    bad = [s.name for s in statuses if s.state == "conflicts"]
    if bad:
        version = version_at(site_packages) or "the version the patches name"
        raise PatchError(
            f"patches {', '.join(bad)} conflict with {site_packages}: reinstall openrlhf {version} and retry"
        )
    for status in statuses:
        if status.state == "not applied":
            proc = _run(["--forward", "--batch"], Path(patches_dir) / status.name, Path(site_packages))
            if proc.returncode != 0:
                raise AutorlError(f"patch {status.name} failed after a clean dry run: {_tail(proc)}")
    return check(patches_dir, site_packages)


def touched_files(patch_path: str | Path) -> list[str]:
    """The target files of a unified diff, with the ``b/`` prefix stripped."""
    out = []
    for line in _text(patch_path).splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            out.append(name.split("/", 1)[1] if "/" in name else name)
    return out


def _status(patch_path: Path, site: Path) -> PatchStatus:
    files = touched_files(patch_path)
    if _run(["-R", "--dry-run", "--force"], patch_path, site).returncode == 0:
        return PatchStatus(name=patch_path.name, state="applied", files=files)
    forward = _run(["--forward", "--dry-run", "--batch"], patch_path, site)
    if forward.returncode == 0:
        return PatchStatus(name=patch_path.name, state="not applied", files=files)
    return PatchStatus(name=patch_path.name, state="conflicts", files=files, detail=_tail(forward))


def _run(flags: list[str], patch_path: Path, site: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch is not installed: install it (apt-get install patch) and retry")
    argv = [exe, "-p1", "--silent", "--no-backup-if-mismatch", "-d", str(site), "-i", str(patch_path.resolve()), *flags]
    return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _tail(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stdout + proc.stderr).split())[-300:]
