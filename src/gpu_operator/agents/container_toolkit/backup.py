"""The node's original runtime config, saved before the first edit (better than upstream).

Kept in `<ROOT>/runtime-config-backup/` on the host (`/usr/local/nvidia/runtime-config-backup/` by
default): a hostPath the toolkit pod mounts, outside `<ROOT>/toolkit` (which an installer may
wipe), and on disk (not under `/run`), so it survives the pod, a node reboot and a crash of the
agent. Files:

- `state.json`: per file we write (by role: `config`, `drop-in`, `hook`) its path on the host, the
  SHA-256 of the original (null: the file did not exist) and of what we last wrote, plus the
  editor's `prior` (what JSON configs held where we write);
- `<role>.orig`: the original bytes, for a byte-for-byte restore (an administrator can copy them
  back by hand just as well).

`state.json` is written last, so a crash in between leaves the previous complete state.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.agents.container_toolkit.install import write_atomic

DIR_NAME = "runtime-config-backup"
STATE = "state.json"
FORMAT = 1


def digest(data: bytes | None) -> str | None:
    return None if data is None else "sha256:" + hashlib.sha256(data).hexdigest()


class BackupError(Exception):
    """The backup cannot be read or written (names the path)."""


@dataclass
class FileRecord:
    """One file we write: where it is on the host, its original and what we last wrote."""

    name: str
    original: str | None
    written: str | None = None


@dataclass
class State:
    runtime: str
    files: dict[str, FileRecord] = field(default_factory=dict)
    prior: dict[str, Any] = field(default_factory=dict)
    saved_at: str = ""


class Store:
    """The backup directory (as this process sees it)."""

    def __init__(self, directory: Path, name: str | None = None) -> None:
        self.dir = directory
        # The directory as the node sees it (for messages): `directory` may be a view of it.
        self.name = name or str(directory)

    @property
    def state_path(self) -> Path:
        return self.dir / STATE

    def load(self) -> State | None:
        try:
            raw = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            raise BackupError(f"{self.state_path}: unreadable backup state: {err}") from err
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise BackupError(f"{self.state_path}: unknown backup format")
        files = {
            role: FileRecord(str(r["name"]), r.get("original"), r.get("written"))
            for role, r in (raw.get("files") or {}).items()
        }
        return State(
            str(raw.get("runtime", "")),
            files,
            dict(raw.get("prior") or {}),
            str(raw.get("savedAt", "")),
        )

    def original(self, role: str) -> bytes | None:
        """The saved original bytes (None: the file did not exist, or the copy is gone)."""
        try:
            return (self.dir / f"{role}.orig").read_bytes()
        except FileNotFoundError:
            return None

    def save_original(self, role: str, data: bytes | None) -> None:
        path = self.dir / f"{role}.orig"
        if data is None:
            path.unlink(missing_ok=True)
        else:
            write_atomic(path, data, 0o600)

    def save(self, state: State) -> None:
        state.saved_at = state.saved_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        body = {
            "format": FORMAT,
            "runtime": state.runtime,
            "savedAt": state.saved_at,
            "files": {
                role: {"name": r.name, "original": r.original, "written": r.written}
                for role, r in state.files.items()
            },
            "prior": state.prior,
        }
        try:
            write_atomic(self.state_path, (json.dumps(body, indent=2) + "\n").encode(), 0o600)
        except OSError as err:
            raise BackupError(f"{self.state_path}: cannot save the backup: {err}") from err

    def clear(self) -> None:
        """Forget the backup (after a restore)."""
        for path in self.dir.glob("*.orig"):
            path.unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.dir.rmdir()
