"""The OpenRLHF jobs' compile caches on a local head: one folder per user and Python on the machine, shared by
every study, so a new workspace's first trials find DeepSpeed's ops, Triton's kernels and vLLM's model inspection
done (autorl/backends/openrlhf/caches.py)."""

from __future__ import annotations

import os
import sys
import time

from autorl.backends.openrlhf import caches


def test_the_folder_is_named_by_the_variable_else_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORL_COMPILE_CACHE", str(tmp_path / "named"))
    assert caches.root() == tmp_path / "named"
    monkeypatch.delenv("AUTORL_COMPILE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.root() == tmp_path / "xdg" / "autorl" / "openrlhf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert caches.root() == tmp_path / "home" / ".cache" / "autorl" / "openrlhf"


def test_two_workspaces_share_it_and_two_pythons_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORL_COMPILE_CACHE", str(tmp_path / "machine"))
    one = caches.for_python(sys.executable, tmp_path / "ws1" / ".autorl" / "cache" / "openrlhf")
    two = caches.for_python(sys.executable, tmp_path / "ws2" / ".autorl" / "cache" / "openrlhf")
    other = caches.for_python(str(tmp_path / "venv" / "bin" / "python"), tmp_path / "ws1")
    assert one == two and one.parent == tmp_path / "machine" and one.is_dir()
    assert other != one and other.parent == one.parent


def test_a_folder_that_cannot_be_made_falls_back_to_the_studys(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AUTORL_COMPILE_CACHE", str(blocker))
    fallback = tmp_path / "ws" / ".autorl" / "cache" / "openrlhf"
    assert caches.for_python(sys.executable, fallback) == fallback


def test_a_killed_builds_lock_is_cleared_and_a_running_builds_is_kept(tmp_path, monkeypatch):
    """torch waits for ever on an op's `lock` file; a build killed mid-way leaves one, and with one folder for
    every study it would stall each later study's first trial until its watchdog fired."""
    monkeypatch.setenv("AUTORL_COMPILE_CACHE", str(tmp_path / "machine"))
    folder = caches.for_python(sys.executable, tmp_path / "ws")
    ops = folder / caches.CACHES["TORCH_EXTENSIONS_DIR"]
    for op in ("fused_adam", "cpu_adam"):
        (ops / op).mkdir(parents=True)
        (ops / op / "lock").write_text("")
    old = time.time() - caches.STALE_LOCK_S - 60
    os.utime(ops / "fused_adam" / "lock", (old, old))
    assert caches.for_python(sys.executable, tmp_path / "ws") == folder
    assert not (ops / "fused_adam" / "lock").exists() and (ops / "cpu_adam" / "lock").exists()
    assert (ops / "fused_adam").is_dir()  # the built op stays
