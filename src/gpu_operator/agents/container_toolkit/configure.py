"""Apply an editor to the node's files with the backup kept current, and restore on the way out.

Apply: the first time, the original of every file we write is saved before anything is written,
with what it was (the symbolic links on its path and their values, the file they lead to, and
that file's mode, owner, group and SELinux label). Later (a new pod, or the drift loop), a shared
file (`config`) that differs both from what we last wrote and from the saved original was changed
by somebody else (a node-image update): its saved original becomes that new content without our
settings, so the restore brings back the node's current config, not an outdated one. Each write
is announced in the backup first (`pending`) and confirmed after, so a crash at any point leaves
a file the restore recognises. While every file the editor reads is as the last apply left it,
a drift check (`quick`) stops there: no parse, no write.

Files are read and written through `hostfile`: a link is followed (through the pod's mounts) and
its target edited, the link kept; writes are atomic, flushed, keep owner, group, mode and label,
and make their temporary files where the runtime does not read.

Restore: a file still exactly as we last wrote it gets its original back byte for byte, with the
original's mode, owner, group and label, and its links as they were (or is removed when it did
not exist); a file changed since (by somebody else) keeps their changes and loses only our
settings. Both are reported, then the backup is forgotten. A file that is already its original
(a restore that was interrupted) is left as it is.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_operator.agents.container_toolkit import backup, edits, hostfile

log = logging.getLogger("gpu_operator.agents.container_toolkit")


@dataclass(frozen=True)
class FileSpec:
    """A runtime file: where this process reads and writes it, and its path on the host."""

    local: Path
    name: str


class RuntimeFiles:
    """The runtime's files by role (see `edits`), and the node's directories they are in
    (`mounts`; by default each file's directory)."""

    def __init__(
        self, files: Mapping[str, FileSpec], mounts: Iterable[hostfile.Mount] | None = None
    ) -> None:
        self.files = dict(files)
        if mounts is None:
            mounts = [
                hostfile.Mount(posixpath.dirname(spec.name), spec.local.parent)
                for role, spec in self.files.items()
                if role != edits.SOURCE
            ]
        self.mounts = hostfile.Mounts(mounts)

    def name(self, role: str) -> str:
        return self.files[role].name

    def target(self, role: str) -> hostfile.Target:
        """Where the role's file really is (its links followed through the mounts)."""
        return self.mounts.resolve(self.files[role].name)

    def read(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for role, spec in self.files.items():
            if role == edits.SOURCE:  # a settings source, read as given (never written)
                try:
                    out[role] = spec.local.read_bytes()
                except FileNotFoundError:
                    out[role] = None
                except OSError as err:
                    raise hostfile.IoFailure(spec.name, "read it", err) from err
                continue
            out[role] = hostfile.read(self.target(role))
        return out

    def write(self, role: str, data: bytes | None, meta: hostfile.Meta | None = None) -> None:
        """Write (None: remove) the role's file where its links lead; `meta`: see
        `hostfile.write`."""
        target = self.target(role)
        if data is None:
            hostfile.remove(target)
        else:
            hostfile.write(target, data, meta)

    def record(self, role: str, data: bytes | None) -> backup.FileRecord:
        """What the backup keeps of a file before our first write: see `backup`."""
        target = self.target(role)
        try:
            meta = hostfile.meta_of(target.local)
        except OSError as err:
            raise hostfile.IoFailure(target.name, "read its owner and mode", err) from err
        return backup.FileRecord(
            self.name(role),
            backup.digest(data),
            links=list(target.links),
            target=target.host,
            meta=meta,
        )

    def links_changed(self, role: str, record: backup.FileRecord) -> bool:
        """Whether the links the original had are no longer as they were."""
        return bool(record.links) and list(self.target(role).links) != record.links

    def put_back(self, role: str, data: bytes | None, record: backup.FileRecord) -> None:
        """The original back: its bytes (None: removed) with its mode, owner, group and label in
        the file the links led to, then the links as they were where something replaced them."""
        if not self.links_changed(role, record) or record.target is None:
            self.write(role, data, record.meta)
            return
        target = self.mounts.resolve(record.target)
        if data is None:
            hostfile.remove(target)
        else:
            hostfile.write(target, data, record.meta)
        for path, value in reversed(record.links):
            local = self.mounts.local(path)
            if local is None or _readlink(local) != value:
                hostfile.relink(self.mounts, path, value)


def _readlink(path: Path) -> str | None:
    try:
        return str(Path(path).readlink())
    except OSError:
        return None


@dataclass
class Applied:
    edit: edits.Edit
    written: list[str] = field(default_factory=list)
    # Files somebody else changed since we wrote them (their new content is the new original).
    rebased: list[str] = field(default_factory=list)
    # Sentences about files that are symbolic links (edited where they lead).
    links: list[str] = field(default_factory=list)
    # A quick apply found every file as the last apply left it (nothing was done).
    unchanged: bool = False


def apply(
    editor: edits.Editor,
    files: RuntimeFiles,
    store: backup.Store,
    runtime: str,
    *,
    quick: bool = False,
) -> Applied:
    """Our settings onto the node's files, saving originals first (see the module docstring);
    `quick`: stop early when no file changed since the last apply (drift checks). Big configs
    become trees with the cycle collector paused (`edits.bulk`)."""
    with edits.bulk():
        return _apply(editor, files, store, runtime, quick)


def _apply(
    editor: edits.Editor,
    files: RuntimeFiles,
    store: backup.Store,
    runtime: str,
    quick: bool,
) -> Applied:
    current = files.read()
    state = store.load()
    if quick and state is not None and _unchanged(state, current):
        return Applied(edits.Edit(dict(current)), unchanged=True)
    rebased: list[str] = []
    bases: dict[str, bytes | None] = {}  # new originals, saved once our edit of them works
    if state is None:
        state = backup.State(runtime, prior=editor.prior(current))
        for role in editor.roles:
            store.save_original(role, current.get(role))
            state.files[role] = files.record(role, current.get(role))
        store.save(state)
        log.info("saved the original runtime config in %s", store.name)
    else:
        for role in editor.roles:
            record = state.files.get(role)
            now = current.get(role)
            if record is None:
                store.save_original(role, now)
                state.files[role] = files.record(role, now)
                continue
            if backup.digest(now) == record.original:
                if backup.digest(store.original(role)) != record.original:
                    store.save_original(role, now)  # the copy was lost; the file still is it
                continue
            changed = not record.ours(backup.digest(now)) and backup.digest(now) != record.original
            if role == edits.CONFIG and (record.written or record.pending) and changed:
                bases[role] = editor.revert(current, state.prior).get(role)
                state.prior = editor.prior({**current, role: bases[role]})
    edit = editor.apply(current, state.prior)  # an EditError here leaves the backup as it was
    for role, base in bases.items():
        store.save_original(role, base)
        state.files[role].original = backup.digest(base)
        rebased.append(files.name(role))
    store.save(state)
    written: list[str] = []
    for role in editor.roles:
        new = edit.files.get(role)
        record = state.files[role]
        if new != current.get(role):
            record.pending = backup.digest(new)
            store.save(state)  # announced before the write: see the module docstring
            files.write(role, new)
            written.append(files.name(role))
        record.written, record.pending = backup.digest(new), None
    state.seen = {
        role: backup.digest(edit.files.get(role) if role in editor.roles else data)
        for role, data in current.items()
    }
    store.save(state)
    links = [
        f"{files.name(role)} is a symbolic link to {target.host}: the toolkit edits "
        f"{target.host} and keeps the link"
        for role in editor.roles
        if (target := files.target(role)).links
    ]
    return Applied(edit, written, rebased, links)


def _unchanged(state: backup.State, current: Mapping[str, bytes | None]) -> bool:
    return bool(state.seen) and state.seen == {
        role: backup.digest(data) for role, data in current.items()
    }


@dataclass
class Restored:
    exact: list[str] = field(default_factory=list)  # sentences
    partial: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.exact or self.partial)


def restore(editor: edits.Editor, files: RuntimeFiles, store: backup.Store) -> Restored:
    """Undo our edits (see the module docstring); the backup is forgotten afterwards."""
    with edits.bulk():
        return _restore(editor, files, store)


def _restore(editor: edits.Editor, files: RuntimeFiles, store: backup.Store) -> Restored:
    current = files.read()
    state = store.load()
    prior = state.prior if state is not None else {}
    reverted = editor.revert(current, prior)
    out = Restored()
    for role in editor.roles:
        name = files.name(role)
        record = state.files.get(role) if state is not None else None
        now = current.get(role)
        digest = backup.digest(now)
        if record is not None and record.ours(digest):
            original = store.original(role)
            if backup.digest(original) == record.original:
                if original != now or files.links_changed(role, record):
                    files.put_back(role, original, record)
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
        elif record is not None and digest == record.original:
            continue  # already the original (a restore that stopped half way)
        elif record is not None and (record.written is not None or record.pending is not None):
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
