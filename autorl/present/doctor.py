"""``autorl doctor``: is this machine ready to run studies, and what to do if not.

``doctor(ws_dir)`` runs every check in ``CHECKS`` and returns one :class:`DoctorCheck`
each: git and its user identity, Python and the packages autorl needs, the
backends' frameworks (torch with CUDA, OpenRLHF with its flag dialect, Ray,
TRL), free disk at the workspace, GPUs and GNU patch. A failed check says what
to do. Only ``required`` checks decide the exit code: a laptop without GPUs or
OpenRLHF can still run the embedded engine.

An extra of autorl (``openrlhf``, ``trl``, ``ray``) is installed from where this autorl came from (its checkout, or
the wheel it was installed from: ``install_command``), never by name from PyPI, whose project named autorl is an
unrelated, empty package.

torch is imported in a child process, never in this one, so the check also
catches an install that crashes on import.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from autorl.backends.openrlhf.backend import installed_version
from autorl.backends.openrlhf.flags import DOTTED_SINCE, NEW_LENGTHS_SINCE, parse_version
from autorl.errors import UserError
from autorl.install import install_advice, install_command

MIN_PYTHON = (3, 10)
MIN_FREE_GB = 2.0
PROBE_TIMEOUT_S = 180
GB = 1024**3

REQUIRED_PACKAGES = [
    ("optuna", "optuna>=4.0"),
    ("sqlite-utils", "sqlite-utils>=3.36"),
    ("pydantic", "pydantic>=2.6"),
    ("rich", "rich>=13"),
    ("click", "click>=8.1"),
    ("pyyaml", "pyyaml>=6"),
    ("numpy", "numpy>=1.24"),
    ("matplotlib", "matplotlib>=3.7"),
    ("gitpython", "gitpython>=3.1.40"),
]
OPTIONAL_PACKAGES = [  # (kind, distribution, what needs it, the extra of autorl that installs it)
    ("backend", "ray", "trials on a Ray cluster (--ray-address) and the openrlhf backend", "ray"),
    ("backend", "trl", "the trl backend", "trl"),
]

TORCH_PROBE = """
import json, torch
cuda = torch.cuda.is_available()
print(json.dumps({"version": torch.__version__, "cuda": cuda, "cuda_version": torch.version.cuda,
                  "devices": torch.cuda.device_count() if cuda else 0}))
"""


class DoctorCheck(BaseModel):
    """One answer of ``autorl doctor``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="What was checked, e.g. git or package:optuna.")
    ok: bool = Field(description="True when the item is present and usable.")
    required: bool = Field(description="Whether autorl cannot run studies without it (decides the exit code).")
    detail: str = Field(description="What was found: versions, counts, free space.")
    fix: str = Field("", description="What to do when ok is False (empty when ok).")


class _Result(NamedTuple):
    ok: bool
    detail: str
    fix: str = ""


# ---- installing autorl's extras ------------------------------------------------------------
# ---- the checks -------------------------------------------------------------------------
def check_python(_ws: Path) -> _Result:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    return _Result(
        ok,
        f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}",
        "" if ok else f"use Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer",
    )


def check_git(_ws: Path) -> _Result:
    exe = shutil.which("git")
    if exe is None:
        return _Result(
            False, "git not found on PATH", "install git (apt-get install git, brew install git) and put it on PATH"
        )
    out = _run([exe, "--version"])
    return _Result(out is not None, (out or "git --version failed").strip(), "" if out else "reinstall git")


def check_git_identity(ws: Path) -> _Result:
    exe = shutil.which("git")
    if exe is None:
        return _Result(False, "git not found on PATH", "install git first")
    cwd = ws if ws.is_dir() else None
    name, email = (_run([exe, "config", key], cwd=cwd) for key in ("user.name", "user.email"))
    if name and email:
        return _Result(True, f"{name.strip()} <{email.strip()}>")
    return _Result(
        False,
        "no git user.name/user.email: trial commits are signed autorl <autorl@localhost>",
        'set one: git config --global user.name "Your Name"; git config --global user.email you@example.com',
    )


def check_disk(ws: Path) -> _Result:
    target = ws if ws.exists() else Path.cwd()
    free = shutil.disk_usage(target).free / GB
    ok = free >= MIN_FREE_GB
    return _Result(
        ok,
        f"{free:.1f} GiB free at {target.resolve()}",
        "" if ok else f"free at least {MIN_FREE_GB:.0f} GiB there (old .autorl/runs and worktrees can go)",
    )


def check_torch(_ws: Path) -> _Result:
    proc = _probe(TORCH_PROBE)
    if proc is None or proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1] if proc else f"no answer in {PROBE_TIMEOUT_S} s"
        return _Result(
            False,
            f"import torch failed: {err}",
            "install torch (CPU: pip install torch --index-url https://download.pytorch.org/whl/cpu) "
            "for the embedded engine",
        )
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    cuda = (
        f"CUDA {info['cuda_version']}, {info['devices']} device(s)" if info["cuda"] else "CUDA not available (CPU only)"
    )
    return _Result(True, f"torch {info['version']}; {cuda}")


def check_openrlhf(_ws: Path) -> _Result:
    version = installed_version()
    if version is None:
        return _Result(
            False,
            "openrlhf not installed",
            "for backend: openrlhf on this machine, "
            + install_advice("openrlhf")
            + "; for a cluster's OpenRLHF, set train.openrlhf_version to its version",
        )
    v = parse_version(version)
    dialect = (
        "dotted flags (--actor.adam.lr)"
        if v >= DOTTED_SINCE
        else "flat flags with --max_len/--max_new_tokens"
        if v >= NEW_LENGTHS_SINCE
        else "flat flags with --prompt_max_len/--generate_max_len"
    )
    return _Result(True, f"openrlhf {version}: {dialect}")


def tested_stack() -> dict[str, str]:
    """Package -> the version pinned by autorl's ``openrlhf`` extra (the versions run for real), from its metadata."""
    try:
        requires = metadata.requires("autorl") or []
    except metadata.PackageNotFoundError:
        return {}
    pins = {}
    for req in requires:
        found = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^;\s]+)\s*;.*extra\s*==\s*['\"]openrlhf['\"]", req)
        if found:
            pins[found.group(1).lower()] = found.group(3)
    return pins


def _stack_package(dist: str) -> Callable[[Path], _Result]:
    def check(_ws: Path) -> _Result:
        tested = tested_stack().get(dist)
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            return _Result(
                False,
                f"{dist} not installed (tested: {tested})",
                install_advice("openrlhf", " on the GPU machine"),
            )
        if have != tested:
            return _Result(
                False,
                f"{dist} {have}; autorl ran the OpenRLHF stack with {tested}",
                f"`pip install '{dist}=={tested}'`, or expect untested behaviour "
                f"(the whole stack: `{install_command('openrlhf')}`)",
            )
        return _Result(True, f"{dist} {have} (the version autorl was run with)")

    return check


STACK = ("openrlhf", "vllm", "deepspeed", "ray")


def check_gpus(_ws: Path) -> _Result:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return _Result(
            False,
            "nvidia-smi not found: no NVIDIA GPU visible",
            "fine for the embedded engine on CPU; for GPUs install the NVIDIA driver",
        )
    out = _run([exe, "-L"])
    gpus = [line for line in (out or "").splitlines() if line.startswith("GPU ")]
    if not gpus:
        return _Result(False, "nvidia-smi -L lists no GPU", "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    return _Result(True, f"{len(gpus)} GPU(s): " + "; ".join(g.split(" (UUID")[0] for g in gpus))


def check_patch(_ws: Path) -> _Result:
    exe = shutil.which("patch")
    out = _run([exe, "--version"]) if exe else None
    first = (out or "").splitlines()[0] if out else ""
    if "GNU patch" not in first:
        return _Result(
            False,
            f"GNU patch not found ({first or 'no patch on PATH'})",
            "install it (apt-get install patch) for `autorl patches apply`",
        )
    return _Result(True, first)


def _package(dist: str, why: str, requirement: str) -> Callable[[Path], _Result]:
    def check(_ws: Path) -> _Result:
        try:
            return _Result(True, f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            return _Result(False, f"{dist} not installed ({why})", f"pip install '{requirement}'")

    return check


def _extra(dist: str, why: str, extra: str) -> Callable[[Path], _Result]:
    def check(_ws: Path) -> _Result:
        try:
            return _Result(True, f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            return _Result(False, f"{dist} not installed ({why})", install_advice(extra))

    return check


class _Spec(NamedTuple):
    name: str
    run: Callable[[Path], _Result]
    required: bool


CHECKS: list[_Spec] = [
    _Spec("python", check_python, True),
    _Spec("git", check_git, True),
    _Spec("git identity", check_git_identity, False),
    *[_Spec(f"package:{d}", _package(d, "autorl needs it", req), True) for d, req in REQUIRED_PACKAGES],
    _Spec("package:torch", check_torch, False),
    *[_Spec(f"{kind}:{d}", _extra(d, why, extra), False) for kind, d, why, extra in OPTIONAL_PACKAGES],
    _Spec("backend:openrlhf", check_openrlhf, False),
    *[_Spec(f"stack:{d}", _stack_package(d), False) for d in STACK],
    _Spec("disk", check_disk, True),
    _Spec("gpus", check_gpus, False),
    _Spec("gnu patch", check_patch, False),
]


# ---- running them -------------------------------------------------------------------------
def doctor(ws_dir: str | Path = ".", names: list[str] | None = None) -> list[DoctorCheck]:
    """Run the checks (all, or those in ``names``) for the workspace at ``ws_dir``."""
    ws = Path(ws_dir)
    unknown = sorted(set(names or []) - {s.name for s in CHECKS})
    if unknown:
        raise UserError(f"no check named {', '.join(unknown)}: choose from {', '.join(s.name for s in CHECKS)}")
    specs = [s for s in CHECKS if names is None or s.name in names]
    return [_one(s, ws) for s in specs]


def all_required_ok(checks: list[DoctorCheck]) -> bool:
    """True when every required check passed (exit code 0)."""
    return all(c.ok for c in checks if c.required)


def format_checks(checks: list[DoctorCheck]) -> str:
    """One line per check, with the fix under each failure."""
    lines = []
    for c in checks:
        mark = "ok  " if c.ok else "FAIL" if c.required else "warn"
        lines.append(f"{mark} {c.name}: {c.detail}")
        if c.fix:
            lines.append(f"     fix: {c.fix}")
    return "\n".join(lines)


def _one(spec: _Spec, ws: Path) -> DoctorCheck:
    try:
        r = spec.run(ws)
    except (OSError, ValueError) as exc:
        r = _Result(False, f"check failed: {exc}", "run it again; report a bug if it persists")
    return DoctorCheck(name=spec.name, ok=r.ok, required=spec.required, detail=r.detail, fix="" if r.ok else r.fix)


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    """stdout of ``argv`` (no shell), or None when it fails or hangs."""
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _probe(code: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
