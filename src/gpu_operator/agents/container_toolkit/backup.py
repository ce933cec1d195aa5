"""The node's original runtime config, saved before the first edit (better than upstream).

Kept in `<ROOT>/runtime-config-backup/` on the host (`/usr/local/nvidia/runtime-config-backup/` by
default): a hostPath the toolkit pod mounts, outside `<ROOT>/toolkit` (which an installer may
wipe), and on disk (not under `/run`), so it survives the pod, a node reboot and a crash of the
agent. Files:

- `state.json`: per file we write (by role: `config`, `drop-in`, `hook`) its path on the host, the
  SHA-256 of the original (null: the file did not exist), of what we last wrote and of what we
  were about to write (`pending`, set before each write and cleared after it, so a crash in
  between still leaves the file recognised as ours), what the original was (`links`: the
  symbolic links followed from the path, each with its value; `target`: the file they lead to;
  `meta`: its mode, owner, group and SELinux label), plus the editor's `prior` (what JSON
  configs held where we write) and `seen` (the digest of every file the editor read at the last
  apply: while they stay the same, a drift check has nothing to do);
- `<role>.orig`: the original bytes, for a byte-for-byte restore (an administrator can copy them
  back by hand just as well).

Every file here is written atomically and flushed to disk (`hostfile`). `state.json` is written
after the originals, so a crash in between leaves the previous complete state; and forgotten
before them, so a crash while forgetting never leaves a state whose originals are gone (a
restore would then only remove our settings: Docker's daemon.json would come back reformatted).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.agents.container_toolkit import hostfile

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
    pending: str | None = None
    links: list[tuple[str, str]] = field(default_factory=list)
    target: str | None = None
    meta: hostfile.Meta | None = None

    def ours(self, digest_now: str | None) -> bool:
        """Whether the file holds what we wrote (or were writing when we stopped)."""
        return digest_now is not None and digest_now in (self.written, self.pending)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "original": self.original,
            "written": self.written,
            "pending": self.pending,
            "links": [list(link) for link in self.links],
            "target": self.target,
            "meta": None if self.meta is None else self.meta.to_json(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FileRecord:
        links = [
            (str(link[0]), str(link[1]))
            for link in raw.get("links") or []
            if isinstance(link, list) and len(link) == 2
        ]
        target = raw.get("target")
        return cls(
            str(raw["name"]),
            raw.get("original"),
            raw.get("written"),
            raw.get("pending"),
            links,
            None if target is None else str(target),
            hostfile.Meta.from_json(raw.get("meta")),
        )


@dataclass
class State:
    runtime: str
    files: dict[str, FileRecord] = field(default_factory=dict)
    prior: dict[str, Any] = field(default_factory=dict)
    saved_at: str = ""
    seen: dict[str, str | None] = field(default_factory=dict)


class Store:
    """The backup directory (as this process sees it)."""

    def __init__(self, directory: Path, name: str | None = None) -> None:
        self.dir = directory
        # The directory as the node sees it (for messages): `directory` may be a view of it.
        self.name = name or str(directory)
        self._saved: str | None = None  # state.json as this store last read or wrote it

    @property
    def state_path(self) -> Path:
        return self.dir / STATE

    def _target(self, file: str) -> hostfile.Target:
        local = self.dir / file
        return hostfile.Target(
            f"{self.name}/{file}", local.as_posix(), local, (), (self.dir / hostfile.SCRATCH,)
        )

    def load(self) -> State | None:
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise hostfile.IoFailure(f"{self.name}/{STATE}", "read the backup", err) from err
        try:
            raw = json.loads(text)
        except ValueError as err:
            raise BackupError(f"{self.state_path}: unreadable backup state: {err}") from err
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise BackupError(f"{self.state_path}: unknown backup format")
        try:
            files = {role: FileRecord.from_json(r) for role, r in (raw.get("files") or {}).items()}
        except (KeyError, TypeError, AttributeError) as err:
            raise BackupError(f"{self.state_path}: unreadable backup state: {err!r}") from err
        self._saved = text
        seen = raw.get("seen")
        return State(
            str(raw.get("runtime", "")),
            files,
            dict(raw.get("prior") or {}),
            str(raw.get("savedAt", "")),
            dict(seen) if isinstance(seen, dict) else {},
        )

    def original(self, role: str) -> bytes | None:
        """The saved original bytes (None: the file did not exist, or the copy is gone)."""
        return hostfile.read(self._target(f"{role}.orig"))

    def save_original(self, role: str, data: bytes | None) -> None:
        target = self._target(f"{role}.orig")
        if data is None:
            hostfile.remove(target)
        else:
            hostfile.write(target, data, _PRIVATE)

    def save(self, state: State) -> None:
        """Write the state (only when it changed: a drift check that finds nothing to do
        writes nothing, so it works on a full disk too)."""
        state.saved_at = state.saved_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        body = {
            "format": FORMAT,
            "runtime": state.runtime,
            "savedAt": state.saved_at,
            "files": {role: r.to_json() for role, r in state.files.items()},
            "prior": state.prior,
            "seen": state.seen,
        }
        text = json.dumps(body, indent=2) + "\n"
        if text == self._saved:
            return
        hostfile.write(self._target(STATE), text.encode(), _PRIVATE)
        self._saved = text

    def clear(self) -> None:
        """Forget the backup (after a restore): the state first (see the module docstring)."""
        hostfile.remove(self._target(STATE))
        self._saved = None
        try:
            originals = sorted(self.dir.glob("*.orig"))
        except OSError:
            originals = []
        for path in originals:
            hostfile.remove(self._target(path.name))
        with contextlib.suppress(OSError):
            scratch = self.dir / hostfile.SCRATCH
            for leftover in scratch.glob("*"):
                leftover.unlink()
            scratch.rmdir()
        with contextlib.suppress(OSError):
            self.dir.rmdir()


# Our backup files: root's, readable by nobody else (the originals may hold registry credentials).
_PRIVATE = hostfile.Meta(0o600, os.geteuid(), os.getegid())
