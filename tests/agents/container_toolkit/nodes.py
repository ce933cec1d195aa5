"""A node's runtime files in a temp root, wired as the toolkit pod sees them (its mounts of the
node), for each runtime; what the runtime itself would read there; and the two ways a node's disk
lets the toolkit down: an errno from the kernel (`DiskFault`) and a crash, as `kill -9` or a
power cut would stop the agent between two changes of the disk (`CrashAt`)."""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_operator.agents.container_toolkit import backup, configure, runner, settings

SAMPLES = Path(__file__).parent / "samples"
RUNTIMES = ("containerd", "crio", "docker")
# runtime -> the config and our drop-in on the host (what the operator mounts for each).
HOST = {
    "containerd": ("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml"),
    "crio": ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/99-nvidia.conf"),
    "docker": ("/etc/docker/daemon.json", None),
}
SAMPLE = {"containerd": "containerd-v2.toml", "crio": "crio.conf", "docker": "daemon.json"}


class Node:
    """One node's root directory with a runtime's config, and the toolkit's view of it."""

    def __init__(self, root: Path, runtime: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.runtime = runtime
        config, drop_in = HOST[runtime]
        self.config_name, self.drop_in_name = config, drop_in
        values = {
            "RUNTIME": runtime,
            "ROOT": "/usr/local/nvidia",
            "RUNTIME_CONFIG": "/runtime/config-dir/" + posixpath.basename(config),
            "NVIDIA_RUNTIME_SET_AS_DEFAULT": "false",
            "RUNTIME_ENABLE_CDI": "true",
            "CRIO_CONFIG_MODE": "config",
        }
        self.mounts = {"/runtime/config-dir": posixpath.dirname(config)}
        if drop_in is not None:
            values["RUNTIME_DROP_IN_CONFIG"] = "/runtime/config-dir.d/" + posixpath.basename(
                drop_in
            )
            values["RUNTIME_DROP_IN_CONFIG_HOST_PATH"] = drop_in
            self.mounts["/runtime/config-dir.d"] = posixpath.dirname(drop_in)
        self.settings = settings.from_env({**values, **(env or {})})
        self.original = (SAMPLES / SAMPLE[runtime]).read_bytes()
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_bytes(self.original)
        self.editor = runner.editor_for(self.settings)
        self.files = runner.runtime_files(self.settings, self.view)
        self.backup_dir = self.host("/usr/local/nvidia/runtime-config-backup")

    def view(self, path: str) -> Path:
        for ctr in sorted(self.mounts, key=len, reverse=True):
            if path == ctr or path.startswith(ctr + "/"):
                return self.host(self.mounts[ctr] + path[len(ctr) :])
        return self.host(path)

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    @property
    def config(self) -> Path:
        return self.host(self.config_name)

    @property
    def drop_in(self) -> Path | None:
        return None if self.drop_in_name is None else self.host(self.drop_in_name)

    @property
    def ours(self) -> Path:
        """The file the toolkit writes its settings into (CRI-O's config is only read)."""
        if self.runtime == "crio":
            assert self.drop_in is not None
            return self.drop_in
        return self.config

    def store(self) -> backup.Store:  # a new one each time, as a new pod would open it
        return backup.Store(self.view(self.settings.backup_dir), self.settings.backup_dir)

    def apply(self, *, quick: bool = False) -> configure.Applied:
        if quick:
            return configure.apply(self.editor, self.files, self.store(), self.runtime, quick=True)
        return configure.apply(self.editor, self.files, self.store(), self.runtime)

    def restore(self) -> configure.Restored:
        return configure.restore(self.editor, self.files, self.store())

    def runtime_reads(self) -> list[Path]:
        """Every file the runtime reads at its next start: containerd its config and what an
        `imports` glob on the drop-in directory matches (a `conf.d/*` glob, the broadest, which
        matches hidden names too, as Go's globs do); CRI-O its config and every file under its
        drop-in directory, subdirectories and hidden names included (it walks the tree); Docker
        its daemon.json."""
        out = [self.config] if self.config.exists() else []
        if self.runtime == "containerd":
            assert self.drop_in is not None
            out += sorted(p for p in self.drop_in.parent.glob("*") if p.is_file())
            out += sorted(p for p in self.drop_in.parent.glob(".*") if p.is_file())
        elif self.runtime == "crio":
            assert self.drop_in is not None
            if self.drop_in.parent.exists():
                out += sorted(p for p in self.drop_in.parent.rglob("*") if not p.is_dir())
        return out

    def disk(self) -> list[Path]:
        """Where the runtime's files and the toolkit's backup are (a full disk fails both; the
        toolkit's own install directory is left out: see test_runner for that)."""
        return [self.host("/etc"), self.backup_dir]

    def strays(self) -> list[str]:
        """Files the runtime would read that are none of its own (left over by a write)."""
        expected = {self.config, self.drop_in}
        return [str(p.relative_to(self.root)) for p in self.runtime_reads() if p not in expected]


class DiskFault:
    """The node's disk refusing to create files under `roots`, with the errno the kernel gives:
    ENOSPC (no space or inodes left), EROFS (remounted read-only), EACCES (denied), EIO (a
    failing device). Reading keeps working; `on` switches the fault."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, roots: list[Path], code: int) -> None:
        self.code = code
        self.on = False
        self.hits = 0
        real_open = os.open
        prefixes = tuple(str(root) for root in roots)

        def fake_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
            if self.on and os.fspath(path).startswith(prefixes) and flags & os.O_CREAT:
                self.hits += 1
                raise OSError(code, os.strerror(code), os.fspath(path))
            return real_open(path, flags, mode, dir_fd=dir_fd)

        monkeypatch.setattr(os, "open", fake_open)


ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EIO)


class Crash(BaseException):
    """The agent stopped dead (not an exception anything may handle)."""


class CrashAt:
    """Stops the agent before its `at`-th change of the disk (creating, replacing, renaming or
    removing a file or directory); every later change fails too, so no clean-up code runs, as
    after `kill -9`. `count` says how many changes a run made (with `at` = 0: none stops)."""

    CHANGES = ("replace", "rename", "unlink", "rmdir", "symlink")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int = 0) -> None:
        self.at = at
        self.count = 0
        self.crashed = False
        for name in self.CHANGES:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))
        real_open = os.open

        def fake_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
            if flags & os.O_CREAT:
                self._change()
            return real_open(path, flags, mode, dir_fd=dir_fd)

        monkeypatch.setattr(os, "open", fake_open)

    def _change(self) -> None:
        if self.crashed:
            raise Crash()
        self.count += 1
        if self.count == self.at:
            self.crashed = True
            raise Crash()

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def changed(*args: Any, **kwargs: Any) -> Any:
            self._change()
            return real(*args, **kwargs)

        return changed
