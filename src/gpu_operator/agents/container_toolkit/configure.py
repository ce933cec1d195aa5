"""Apply an editor to the node's files with the backup kept current, and restore on the way out.

Apply: the first time, the original of every file we write is saved before anything is written.
Later (a new pod, or the drift loop), a shared file (`config`) that differs both from what we last
wrote and from the saved original was changed by somebody else (a node-image update): its saved
original becomes that new content without our settings, so the restore brings back the node's
current config, not an outdated one.

Restore: a file still exactly as we last wrote it gets its original back byte for byte (or is
removed when it did not exist); a file changed since (by somebody else) keeps their changes and
loses only our settings. Both are reported, then the backup is forgotten.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.agents.container_toolkit import backup, edits
from gpu_operator.agents.container_toolkit.install import write_atomic

log = logging.getLogger("gpu_operator.agents.container_toolkit")


@dataclass(frozen=True)
class FileSpec:
    """A runtime file: where this process reads and writes it, and its path on the host."""

    local: Path
    name: str


class RuntimeFiles:
    """The runtime's files by role (see `edits`)."""

    def __init__(self, files: Mapping[str, FileSpec]) -> None:
        self.files = dict(files)

    def name(self, role: str) -> str:
        return self.files[role].name

    def read(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for role, spec in self.files.items():
            try:
                out[role] = spec.local.read_bytes()
            except FileNotFoundError:
                out[role] = None
            except OSError as err:
                raise edits.EditError(f"{spec.name}: cannot read: {err}") from err
        return out

    def write(self, role: str, data: bytes | None) -> None:
        spec = self.files[role]
        try:
            if data is None:
                spec.local.unlink(missing_ok=True)
                return
            mode = spec.local.stat().st_mode & 0o7777 if spec.local.exists() else 0o644
            write_atomic(spec.local, data, mode)
        except OSError as err:
            raise edits.EditError(f"{spec.name}: cannot write: {err}") from err


@dataclass
class Applied:
    edit: edits.Edit
    written: list[str] = field(default_factory=list)
    # Files somebody else changed since we wrote them (their new content is the new original).
    rebased: list[str] = field(default_factory=list)


def apply(editor: edits.Editor, files: RuntimeFiles, store: backup.Store, runtime: str) -> Applied:
    """Our settings onto the node's files, saving originals first (see the module docstring)."""
    current = files.read()
    state = store.load()
    rebased: list[str] = []
    if state is None:
        state = backup.State(runtime, prior=editor.prior(current))
        for role in editor.roles:
            store.save_original(role, current.get(role))
            state.files[role] = backup.FileRecord(
                files.name(role), backup.digest(current.get(role))
            )
        store.save(state)
        log.info("saved the original runtime config in %s", store.name)
    else:
        for role in editor.roles:
            record = state.files.get(role)
            now = current.get(role)
            if record is None:
                store.save_original(role, now)
                state.files[role] = backup.FileRecord(files.name(role), backup.digest(now))
                continue
            changed = backup.digest(now) not in (record.written, record.original)
            if role == edits.CONFIG and record.written is not None and changed:
                base = editor.revert(current, state.prior).get(role)
                store.save_original(role, base)
                record.original = backup.digest(base)
                state.prior = editor.prior({**current, role: base})
                rebased.append(files.name(role))
        store.save(state)
    edit = editor.apply(current, state.prior)
    written: list[str] = []
    for role in editor.roles:
        new = edit.files.get(role)
        if new != current.get(role):
            files.write(role, new)
            written.append(files.name(role))
        state.files[role].written = backup.digest(new)
    store.save(state)
    return Applied(edit, written, rebased)


@dataclass
class Restored:
    exact: list[str] = field(default_factory=list)  # sentences
    partial: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.exact or self.partial)


def restore(editor: edits.Editor, files: RuntimeFiles, store: backup.Store) -> Restored:
    """Undo our edits (see the module docstring); the backup is forgotten afterwards."""
    current = files.read()
    state = store.load()
    prior = state.prior if state is not None else {}
    reverted = editor.revert(current, prior)
    out = Restored()
    for role in editor.roles:
        name = files.name(role)
        record = state.files.get(role) if state is not None else None
        now = current.get(role)
        if (
            record is not None
            and record.written is not None
            and backup.digest(now) == record.written
        ):
            original = store.original(role)
            if backup.digest(original) == record.original:
                if original != now:
                    files.write(role, original)
                    out.exact.append(
                        f"restored {name} byte for byte ({record.original})"
                        if original is not None
                        else f"removed {name} (it did not exist before the toolkit)"
                    )
                continue
            out.partial.append(
                f"{name}: the saved original in {store.name} is missing or damaged: "
                "removed only the toolkit's settings"
            )
        elif record is not None and record.written is not None:
            out.partial.append(
                f"{name} changed since the toolkit wrote it (for example by a node-image update): "
                "removed only the toolkit's settings and kept the rest"
            )
        target = reverted.get(role)
        if target != now:
            files.write(role, target)
            if record is None or record.written is None:
                out.exact.append(f"removed the toolkit's settings from {name}")
    store.clear()
    return out
