"""The toolkit's own files under ROOT, and the single-instance lock.

`<root>/toolkit/` holds NVIDIA's runtime binaries (`nvidia-container-runtime{,.cdi,.legacy}`,
`nvidia-ctk`, `nvidia-cdi-hook`, `nvidia-container-runtime-hook`, `nvidia-container-cli`) and the
runtime's config `<root>/toolkit/.config/nvidia-container-runtime/config.toml` (mode, CDI default
kind, driver root). Our image carries no NVIDIA binaries: on a real node they come from NVIDIA's
toolkit image (`nvcr.io/nvidia/k8s/container-toolkit`); this agent writes the config and, only on
a simulated node, executable stand-ins so the simulated runtime finds the handlers' binaries.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import posixpath
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpu_operator.agents.container_toolkit import hostfile, tomltext

log = logging.getLogger("gpu_operator.agents.container_toolkit")

TOOLKIT_SUBDIR = "toolkit"
CONFIG_RELATIVE = ".config/nvidia-container-runtime/config.toml"
BINARIES = (
    "nvidia-container-runtime",
    "nvidia-container-runtime.cdi",
    "nvidia-container-runtime.legacy",
    "nvidia-ctk",
    "nvidia-cdi-hook",
    "nvidia-container-runtime-hook",
    "nvidia-container-cli",
)
PID_FILE_NAME = "toolkit.pid"
STAND_IN = """#!/bin/sh
# Stand-in written by the GPU operator's toolkit agent on a simulated node: the real binary
# comes from NVIDIA's container-toolkit image.
echo "{name}: simulated NVIDIA Container Toolkit binary" >&2
exit 0
"""


class InstallError(Exception):
    """The toolkit could not be installed (names the path); `errno`: an I/O failure's."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


@dataclass(frozen=True)
class RuntimeConfig:
    """What goes into the NVIDIA runtime's config.toml (upstream's keys)."""

    runtime_dir: str  # `<root>/toolkit` on the host
    driver_root: str = "/run/nvidia/driver"
    mode: str = ""  # auto | legacy | cdi | csv ("": the runtime's default, auto)
    cdi_default_kind: str = ""
    annotation_prefixes: tuple[str, ...] = ()
    low_level_runtimes: tuple[str, ...] = ()
    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    hook_skip_mode_detection: bool = True
    debug: str = ""
    log_level: str = ""
    extra: dict[str, object] = field(default_factory=dict)


def runtime_config(c: RuntimeConfig) -> str:
    """The NVIDIA runtime's config.toml (pure)."""
    ldconfig = "@" + posixpath.join(c.driver_root, "sbin/ldconfig")
    runtime: dict[str, object] = {}
    if c.debug:
        runtime["debug"] = c.debug
    if c.log_level:
        runtime["log-level"] = c.log_level
    if c.mode:
        runtime["mode"] = c.mode
    if c.low_level_runtimes:
        runtime["runtimes"] = list(c.low_level_runtimes)
    cdi_mode: dict[str, object] = {}
    if c.cdi_default_kind:
        cdi_mode["default-kind"] = c.cdi_default_kind
    if c.annotation_prefixes:
        cdi_mode["annotation-prefixes"] = list(c.annotation_prefixes)
    if cdi_mode:
        runtime["modes"] = {"cdi": cdi_mode}
    doc: dict[str, object] = {
        "accept-nvidia-visible-devices-envvar-when-unprivileged": c.accept_envvar_unprivileged,
        "accept-nvidia-visible-devices-as-volume-mounts": c.accept_volume_mounts,
        "nvidia-container-cli": {
            "root": c.driver_root,
            "path": posixpath.join(c.runtime_dir, "nvidia-container-cli"),
            "ldconfig": ldconfig,
        },
        "nvidia-container-runtime": runtime,
        "nvidia-container-runtime-hook": {
            "path": posixpath.join(c.runtime_dir, "nvidia-container-runtime-hook"),
            "skip-mode-detection": c.hook_skip_mode_detection,
        },
        "nvidia-ctk": {"path": posixpath.join(c.runtime_dir, "nvidia-ctk")},
        **c.extra,
    }
    header = "# Written by the GPU operator's toolkit agent for the NVIDIA Container Runtime.\n\n"
    return header + tomltext.dumps(doc)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace a file so readers see the old or the new content, never half of one, and flush
    both to disk (the toolkit's own files; the runtime's go through `hostfile`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    hostfile.sync_dir(path.parent)


def install(root_view: Path, config: RuntimeConfig, *, stand_ins: bool) -> list[str]:
    """Install into `<root>/toolkit` (`root_view`: ROOT as this process sees it); returns what
    it did, as log lines. An OSError is an InstallError of one line naming the file on the node
    and the errno."""
    toolkit = root_view / TOOLKIT_SUBDIR
    done: list[str] = []
    target = toolkit / CONFIG_RELATIVE
    try:
        write_atomic(target, runtime_config(config).encode())
        done.append(
            f"wrote the NVIDIA runtime config {posixpath.join(config.runtime_dir, CONFIG_RELATIVE)}"
        )
        missing = [b for b in BINARIES if not (toolkit / b).exists()]
        if stand_ins:
            for name in missing:
                target = toolkit / name
                write_atomic(target, STAND_IN.format(name=name).encode(), 0o755)
            if missing:
                done.append(f"simulated node: wrote stand-ins for {', '.join(missing)}")
        elif missing:
            done.append(
                f"{config.runtime_dir} lacks {', '.join(missing)}: this image carries no NVIDIA "
                "binaries; on a real node they come from NVIDIA's container-toolkit image"
            )
    except OSError as err:
        name = posixpath.join(config.runtime_dir, target.relative_to(toolkit).as_posix())
        failure = hostfile.IoFailure(name, "write it", err)
        raise InstallError(f"installing the toolkit: {failure}", err.errno) from err
    return done


def uninstall_stand_ins(root_view: Path) -> None:
    """Remove the simulated binaries (never real ones: only files that are our stand-ins)."""
    toolkit = root_view / TOOLKIT_SUBDIR
    for name in BINARIES:
        path = toolkit / name
        with contextlib.suppress(OSError):
            if path.read_text().startswith("#!/bin/sh\n# Stand-in written by the GPU operator"):
                path.unlink()


class PidLock:
    """The single-instance lock: an exclusive flock on `toolkit.pid`, which holds our PID."""

    def __init__(self, path: Path) -> None:
        if path.name != PID_FILE_NAME:
            raise InstallError(f"TOOLKIT_PID_FILE: invalid toolkit.pid path {path}")
        self.path = path
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open(self.path, "a+")  # noqa: SIM115 - held for the agent's lifetime
        except OSError as err:
            raise InstallError(f"unable to create pidfile {self.path}: {err}") from err
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise InstallError(
                f"unable to get an exclusive lock on {self.path}: another instance of the "
                "toolkit container is already running on this node"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._file.close()
        self._file = None


def low_level_runtime_paths(names: Sequence[str]) -> tuple[str, ...]:
    """The runtimes the NVIDIA runtime execs (what the config names, then runc and crun)."""
    out: list[str] = []
    for name in (*names, "runc", "crun"):
        if name and name not in out:
            out.append(name)
    return tuple(out)
