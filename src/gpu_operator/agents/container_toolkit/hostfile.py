"""The runtime's files on the node, read and written safely: the toolkit's only way to change them.

- **Links.** A file that is a symbolic link (or a chain of them, absolute or relative) is edited
  where it finally points, and the links stay links. Targets are node paths, so they are followed
  through the pod's mounts of the node (`Mounts`), never through the container's own filesystem;
  a target outside every mount cannot be written and the message says so.
- **Atomic and durable.** New content goes to a temporary file, is flushed to disk (fsync), gets
  the owner, group, mode and SELinux label (`security.selinux`) the file must have, and replaces
  the file by a rename; then the directory is flushed, so that after a crash or a power cut the
  node has the old file or the new one, never a mix, and the rename is not lost.
- **Out of the runtime's sight.** Temporary files are made in a hidden directory (`SCRATCH`) at
  the top of the widest mount that holds the file (`/etc/containerd`, `/etc/crio`,
  `/etc/docker` for the operator's mounts), not in the directory the runtime reads: CRI-O reads
  every file under its drop-in directory, subdirectories and hidden names included, whatever the
  suffix; containerd reads what its `imports` globs match. A crash's leftovers are removed by the
  next write. Where that directory is on another filesystem than the file (a rename fails with
  EXDEV), the hidden directory beside the file is used instead.
- **Failures.** An OSError becomes `IoFailure`: one line naming the node path, what was being done
  and the errno (ENOSPC, EROFS, EACCES, EIO, ...); the file itself is unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_operator.agents.container_toolkit.edits import EditError

SCRATCH = ".nvidia-container-toolkit.tmp"
# As the kernel: more links than this in one path is a loop (ELOOP).
MAX_LINKS = 40
SELINUX = "security.selinux"
_NO_LABEL = {errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


# Failures a change of the disk's state can cure (space freed, remounted read-write, a policy
# or quota fixed, a device back): retried. Others (a directory where a file must be, a name too
# long, ...) are the node's layout: reported at once, like a config the toolkit cannot edit.
TRANSIENT = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EIO,
        errno.EBUSY,
        errno.EAGAIN,
        errno.EINTR,
        errno.ENOMEM,
        errno.ETIMEDOUT,
        errno.ESTALE,
    }
)


class IoFailure(Exception):
    """A file of the node could not be read or written; the message is one line."""

    def __init__(self, name: str, action: str, err: OSError) -> None:
        self.name = name
        self.action = action
        self.errno = err.errno
        self.transient = err.errno in TRANSIENT
        code = errno.errorcode.get(err.errno or 0, "")
        reason = err.strerror or str(err)
        super().__init__(f"{name}: cannot {action}: {reason}" + (f" ({code})" if code else ""))


@dataclass(frozen=True)
class Meta:
    """What a file must keep besides its bytes: mode, owner, group, SELinux label."""

    mode: int
    uid: int
    gid: int
    label: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": f"{self.mode:04o}",
            "uid": self.uid,
            "gid": self.gid,
            "selinux": None if self.label is None else self.label.decode("utf-8", "replace"),
        }

    @classmethod
    def from_json(cls, raw: Any) -> Meta | None:
        if not isinstance(raw, dict):
            return None
        try:
            label = raw.get("selinux")
            return cls(
                int(str(raw["mode"]), 8),
                int(raw["uid"]),
                int(raw["gid"]),
                None if label is None else str(label).encode(),
            )
        except (KeyError, TypeError, ValueError):
            return None


def label_of(path: Path) -> bytes | None:
    """The SELinux label of a file or directory (None: none, or no SELinux support there)."""
    try:
        return os.getxattr(path, SELINUX, follow_symlinks=False)
    except OSError as err:
        if err.errno in _NO_LABEL:
            return None
        raise


def meta_of(path: Path) -> Meta | None:
    """A file's mode, owner, group and label (None when it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return Meta(stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, label_of(path))


@dataclass(frozen=True)
class Mount:
    """A directory of the node (`host`) as this process sees it (`local`)."""

    host: str
    local: Path


@dataclass(frozen=True)
class Target:
    """A file as configured (`name`, a node path) and where it really is."""

    name: str
    host: str  # after every link
    local: Path
    links: tuple[tuple[str, str], ...]  # each link followed: its node path and its value
    scratches: tuple[Path, ...]  # where temporary files may go, best first


class Mounts:
    """The node's directories this process sees, to follow links and place temporary files."""

    def __init__(self, mounts: Iterable[Mount]) -> None:
        self.mounts = sorted(
            {posixpath.normpath(m.host): m for m in mounts}.values(), key=lambda m: len(m.host)
        )

    def _containing(self, host: str) -> Iterator[tuple[Mount, str]]:
        for m in self.mounts:  # widest first
            rel = posixpath.relpath(host, m.host)
            if rel == "." or not rel.startswith(".."):
                yield m, rel

    def local(self, host: str) -> Path | None:
        """A node path through the widest mount that holds it (None: no mount does)."""
        for m, rel in self._containing(host):
            return m.local if rel == "." else m.local / rel
        return None

    def described(self) -> str:
        return ", ".join(m.host for m in self.mounts) or "nothing"

    def resolve(self, name: str) -> Target:
        """Follow every link in `name`, component by component, through the mounts."""
        links: list[tuple[str, str]] = []
        pending = [p for p in name.split("/") if p]
        done = "/"
        while pending:
            part = pending.pop(0)
            if part == ".":
                continue
            if part == "..":
                done = posixpath.dirname(done)
                continue
            candidate = posixpath.join(done, part)
            local = self.local(candidate)
            try:
                is_link = local is not None and stat.S_ISLNK(os.lstat(local).st_mode)
            except FileNotFoundError:
                is_link = False
            except OSError as err:
                raise IoFailure(name, f"look up {candidate}", err) from err
            if not is_link:
                done = candidate
                continue
            if len(links) == MAX_LINKS:
                raise EditError(f"{name}: more than {MAX_LINKS} symbolic links (a loop?)")
            assert local is not None
            try:
                value = os.readlink(local)
            except OSError as err:
                raise IoFailure(name, f"read the link {candidate}", err) from err
            links.append((candidate, value))
            pending = [p for p in value.split("/") if p] + pending
            if value.startswith("/"):
                done = "/"
        local = self.local(done)
        if local is None:
            raise EditError(
                f"{name} is a symbolic link to {done}, outside what the toolkit pod mounts of "
                f"the node ({self.described()}): it cannot be edited there; point the setting "
                f"at {done} instead"
            )
        return Target(name, done, local, tuple(links), self.scratches(done))

    def scratches(self, host: str) -> tuple[Path, ...]:
        """Where temporary files for `host` go: the top of the widest mount that holds it, else
        (another filesystem there) beside it."""
        out: list[Path] = []
        for m, _rel in self._containing(host):
            out.append(m.local / SCRATCH)
            break
        local = self.local(host)
        if local is not None and local.parent / SCRATCH not in out:
            out.append(local.parent / SCRATCH)
        return tuple(out)


def read(target: Target) -> bytes | None:
    """The file's bytes (None: it does not exist)."""
    try:
        return target.local.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise IoFailure(target.name, "read it", err) from err


def write(target: Target, data: bytes, meta: Meta | None = None) -> None:
    """Replace the file's content atomically and durably (see the module docstring). `meta`:
    what the file must have; None keeps the current file's, and a new file gets mode 0644, this
    process's owner and its directory's SELinux label."""
    local = target.local
    try:
        local.parent.mkdir(parents=True, exist_ok=True)
        if meta is None:
            meta = meta_of(local) or Meta(0o644, os.geteuid(), os.getegid(), label_of(local.parent))
    except OSError as err:
        raise IoFailure(target.name, "write it", err) from err
    last: OSError | None = None
    for scratch in target.scratches:
        try:
            _replace(scratch, local, data, meta)
        except OSError as err:
            if err.errno == errno.EXDEV:
                last = err
                continue
            raise IoFailure(target.name, "write it", err) from err
        _tidy(scratch)
        return
    assert last is not None
    raise IoFailure(target.name, "write it", last)


def remove(target: Target) -> None:
    """Remove the file (where its links point: the links themselves stay) and flush that."""
    try:
        target.local.unlink()
    except FileNotFoundError:
        return
    except OSError as err:
        raise IoFailure(target.name, "remove it", err) from err
    try:
        sync_dir(target.local.parent)
    except OSError as err:
        raise IoFailure(target.name, "remove it", err) from err


def relink(mounts: Mounts, name: str, value: str) -> None:
    """Make `name` the symbolic link `value` again, replacing what is there atomically."""
    local = mounts.local(name)
    if local is None:
        raise EditError(f"{name}: outside what the toolkit pod mounts ({mounts.described()})")
    last: OSError | None = None
    for scratch in mounts.scratches(name):
        tmp = scratch / f"{local.name}.link"
        try:
            scratch.mkdir(exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            os.symlink(value, tmp)
            os.replace(tmp, local)
            sync_dir(local.parent)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if err.errno == errno.EXDEV:
                last = err
                continue
            raise IoFailure(name, f"restore the link to {value}", err) from err
        _tidy(scratch)
        return
    assert last is not None
    raise IoFailure(name, f"restore the link to {value}", last)


def _replace(scratch: Path, local: Path, data: bytes, meta: Meta) -> None:
    scratch.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=scratch, prefix=f"{local.name}.")
    try:
        try:
            _write_all(fd, data)
            if (meta.uid, meta.gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(fd, meta.uid, meta.gid)
                except PermissionError:
                    if os.geteuid() == 0:
                        raise  # the agent runs as root: losing the owner is a failure
            os.fchmod(fd, meta.mode)
            if meta.label is not None:
                try:
                    os.setxattr(fd, SELINUX, meta.label)
                except OSError as err:
                    if err.errno not in _NO_LABEL:
                        raise
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, local)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_dir(local.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def sync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename or removal in it) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _tidy(scratch: Path) -> None:
    """Remove the scratch directory with whatever a crash left there (best effort)."""
    with contextlib.suppress(OSError):
        for entry in scratch.iterdir():
            with contextlib.suppress(OSError):
                entry.unlink()
        scratch.rmdir()
