"""The config manager's file side: list the available configs, validate one, swap the symlink.

Paths are container paths (`/available-configs`, `/config/config.yaml`) mapped to this machine by
a `Files` view: the identity in a real container, the pod's volumes in the simulated cluster.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from pathlib import Path
from typing import Protocol

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.config_manager import selection
from gpu_operator.api import manifests

# Where the symlink points for the empty config (upstream's choice: readers see an empty file).
EMPTY_TARGET = "/dev/null"


class Files(Protocol):
    """Maps a container path to a path on this machine, following symlinks as the container
    would (a missing path raises FileNotFoundError)."""

    def path(self, container_path: str) -> Path: ...


class LocalFiles:
    """The identity view: the agent runs in the container whose paths it is given."""

    def path(self, container_path: str) -> Path:
        return Path(container_path)


def list_configs(files: Files, srcdir: str) -> list[str]:
    """The config names in `srcdir` (a mounted ConfigMap: one file per key)."""
    directory = files.path(srcdir)
    try:
        entries = [(e.name, e.is_dir()) for e in os.scandir(directory)]
    except FileNotFoundError:
        raise selection.SelectionError(f"config directory {srcdir} does not exist") from None
    except NotADirectoryError:
        raise selection.SelectionError(f"config directory {srcdir} is not a directory") from None
    return selection.config_names(entries)


def target_of(choice: selection.Selection, srcdir: str) -> str:
    """The container path the destination symlink points to for a selection."""
    return EMPTY_TARGET if choice.name is None else posixpath.join(srcdir, choice.name)


def load_config(files: Files, srcdir: str, name: str) -> pc.PluginConfig:
    """Parse one named config, so a malformed file is refused before anything points at it."""
    container_path = posixpath.join(srcdir, name)
    try:
        local = files.path(container_path)
    except FileNotFoundError as err:
        raise pc.ConfigError(f"{container_path}: {err.strerror or err}") from None
    try:
        data = manifests.load_one(local)
    except manifests.ManifestError as err:
        # Messages name the file as the container sees it, not where it lives on this machine.
        raise pc.ConfigError(str(err).replace(str(local), container_path)) from None
    return pc.parse(data, container_path)


def _link(files: Files, dst: str) -> Path:
    # The symlink itself (not what it points to): resolve the directory, then name the entry.
    parent, name = posixpath.split(posixpath.normpath(dst))
    return files.path(parent or "/") / name


def current_target(files: Files, dst: str) -> str | None:
    """Where the destination link points now (None: missing or not a symlink)."""
    try:
        return os.readlink(_link(files, dst))
    except (FileNotFoundError, OSError):
        return None


def swap_symlink(files: Files, dst: str, target: str) -> bool:
    """Point `dst` at `target`; False when it already does. The new link is made next to the
    old one and renamed over it, so a reader never finds the file missing (upstream removes
    the old link first)."""
    link = _link(files, dst)
    with contextlib.suppress(OSError):
        if os.readlink(link) == target:
            return False
    staging = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    staging.symlink_to(target)
    os.replace(staging, link)
    return True
