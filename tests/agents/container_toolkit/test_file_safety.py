"""The toolkit's writes to the node's runtime files, for containerd, CRI-O (drop-in) and Docker:
symbolic links are edited where they lead and stay links; a crash at any point leaves no file the
runtime would read and a node the next pod restores byte for byte; every write is flushed to disk
and keeps the owner, group, mode and SELinux label; an I/O failure is one line and changes
nothing."""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import edits, hostfile

from .nodes import ERRNOS, RUNTIMES, Crash, CrashAt, DiskFault, Node

# How each runtime's file is made a link (values relative to the link's directory or absolute;
# `chained`: a relative link to an absolute one; `dangling`: to a file that does not exist yet).
LINKS = ("absolute", "relative", "chained", "dangling")


def has_our_settings(node: Node, path: Path) -> bool:
    text = path.read_text()
    if node.runtime == "docker":
        return "nvidia" in json.loads(text)["runtimes"]
    if node.runtime == "crio":
        return "nvidia" in tomllib.loads(text)["crio"]["runtime"]["runtimes"]
    return "conf.d/*.toml" in text


def make_link(node: Node, kind: str) -> tuple[Path, dict[Path, str], Path]:
    """Turn the file the toolkit writes into a link of `kind`: the link, every link made with
    its value, and the file it finally leads to (which holds the original, unless dangling)."""
    path = node.ours
    home = path.parent
    directory = node.config_name.rsplit("/", 1)[0]  # the mounted config directory, on the host
    real = node.host(f"{directory}/managed/{path.name}")
    real.parent.mkdir(parents=True, exist_ok=True)
    content = node.original if path == node.config else b"# an older drop-in\n"
    if kind != "dangling":
        real.write_bytes(content)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    absolute = "/" + str(real.relative_to(node.root))
    links: dict[Path, str] = {}
    if kind in ("absolute", "dangling"):
        links[path] = absolute
    elif kind == "relative":
        links[path] = os.path.relpath(real, home)
    else:
        hop = home / f".current-{path.name}"
        links[path] = hop.name
        links[hop] = absolute
    for link, value in links.items():
        link.symlink_to(value)
    return path, links, real


@pytest.mark.parametrize("kind", LINKS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_linked_file_is_edited_where_it_leads_and_stays_the_same_link(
    tmp_path: Path, runtime: str, kind: str
) -> None:
    node = Node(tmp_path, runtime)
    _path, links, real = make_link(node, kind)
    before = real.read_bytes() if real.exists() else None

    applied = node.apply()
    for link, value in links.items():
        assert link.is_symlink(), f"{link} was replaced by a regular file"
        assert os.readlink(link) == value
    assert has_our_settings(node, real)
    assert any("symbolic link" in line and "keeps the link" in line for line in applied.links)

    # The runtime reads the target through the link: an edit there (ours removed) is seen and
    # repaired there, the link still untouched.
    if before is None:
        real.unlink()
    else:
        real.write_bytes(before)
    assert node.apply().written
    assert has_our_settings(node, real)
    assert all(os.readlink(link) == value for link, value in links.items())

    node.restore()
    for link, value in links.items():
        assert link.is_symlink()
        assert os.readlink(link) == value
    assert (real.read_bytes() if real.exists() else None) == before
    assert not node.backup_dir.exists()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_uninstall_puts_back_a_link_that_a_tool_replaced_with_a_copy(
    tmp_path: Path, runtime: str
) -> None:
    """`sed -i` or `cp --remove-destination` on a link leave a regular file: the restore brings
    back the link, with its original value, and the original bytes where it leads."""
    node = Node(tmp_path, runtime)
    path, links, real = make_link(node, "chained")
    before = real.read_bytes()
    node.apply()
    ours = real.read_bytes()  # (absolute links lead out of this test's root: read the target)
    for link in links:
        link.unlink()
    path.write_bytes(ours)  # the same content, but a regular file now
    node.restore()
    for link, value in links.items():
        assert link.is_symlink()
        assert os.readlink(link) == value
    assert real.read_bytes() == before


def test_a_link_out_of_the_pods_mounts_is_refused_naming_both_paths(tmp_path: Path) -> None:
    node = Node(tmp_path, "containerd")
    outside = node.host("/opt/managed/config.toml")
    outside.parent.mkdir(parents=True)
    outside.write_bytes(node.original)
    node.config.unlink()
    node.config.symlink_to("/opt/managed/config.toml")
    with pytest.raises(edits.EditError) as caught:
        node.apply()
    message = str(caught.value)
    assert message.startswith("/etc/containerd/config.toml is a symbolic link to /opt/managed")
    assert "outside what the toolkit pod mounts of the node (/etc/containerd" in message
    assert outside.read_bytes() == node.original


def test_a_link_loop_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, "docker")
    node.config.unlink()
    node.config.symlink_to("daemon.json")
    with pytest.raises(edits.EditError, match=r"daemon\.json: more than 40 symbolic links"):
        node.apply()


def changes_made(monkeypatch: pytest.MonkeyPatch, run: Callable[[], object]) -> int:
    """How many changes of the disk `run` makes."""
    with monkeypatch.context() as patch:
        counter = CrashAt(patch)
        run()
    return counter.count


@pytest.mark.parametrize("phase", ["apply", "restore"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_crash_at_any_point_leaves_nothing_for_the_runtime_to_read_and_a_node_to_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str, phase: str
) -> None:
    """kill -9 before each change of the disk in turn (the first apply, or the restore on
    uninstall): no temporary file is where the runtime reads, and the next pod's apply and
    restore bring back the original byte for byte."""
    probe = Node(tmp_path / "probe", runtime)
    if phase == "restore":
        probe.apply()
    total = changes_made(monkeypatch, probe.apply if phase == "apply" else probe.restore)
    assert total >= 3  # a write, its confirmation, forgetting the backup: at least
    for at in range(1, total + 1):
        node = Node(tmp_path / str(at), runtime)
        if phase == "restore":
            node.apply()
        with monkeypatch.context() as patch:
            CrashAt(patch, at)
            with pytest.raises(Crash):
                node.apply() if phase == "apply" else node.restore()
        assert node.strays() == [], f"after a crash before change {at} of {total}"
        node.apply()  # the next pod
        node.restore()  # and its uninstall
        assert node.config.read_bytes() == node.original, f"crash before change {at}"
        assert node.drop_in is None or not node.drop_in.exists()
        assert node.strays() == []
        assert not node.backup_dir.exists()


def test_docker_crash_while_forgetting_the_backup_does_not_reformat_daemon_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash the issue saw: the restore put daemon.json back, then died between removing
    the saved original and the state; the next pod's uninstall must not re-serialise it."""
    node = Node(tmp_path, "docker")
    node.apply()
    real_unlink = os.unlink

    def die_after_the_original(path: object, *args: object, **kwargs: object) -> None:
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]
        if str(path).endswith(".orig"):
            raise Crash()

    with monkeypatch.context() as patch:
        patch.setattr(os, "unlink", die_after_the_original)
        with pytest.raises(Crash):
            node.restore()
    node.apply()
    node.restore()
    assert node.config.read_bytes() == node.original


def test_writes_are_flushed_file_then_rename_then_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, "containerd")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: object, dst: object, **kwargs: object) -> None:
        events.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    node.apply()
    rename = next(
        n for n, (op, what) in enumerate(events) if op == "replace" and what.endswith("config.toml")
    )
    tmp = events[rename][1].split(" -> ")[0]
    assert ("fsync", tmp) in events[:rename], "the new content is flushed before the rename"
    assert ("fsync", str(node.config.parent)) in events[rename + 1 :], "and the directory after"
    assert hostfile.SCRATCH in tmp
    assert "conf.d" not in tmp


@pytest.mark.skipif(os.geteuid() != 0, reason="owners other than ours need root (as the agent)")
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_owner_group_mode_and_selinux_label_survive_apply_and_come_back_on_restore(
    tmp_path: Path, runtime: str
) -> None:
    node = Node(tmp_path, runtime)
    path = node.ours
    if not path.exists():  # CRI-O: an administrator's drop-in of the same name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"# managed by the node image\n")
    before = path.read_bytes()
    label = b"system_u:object_r:container_config_t:s0\x00"
    try:
        os.setxattr(path, hostfile.SELINUX, label)
    except OSError as err:
        pytest.skip(f"no security.selinux xattr on this filesystem: {err}")
    os.chown(path, 1234, 5678)
    os.chmod(path, 0o640)

    def kept() -> tuple[int, int, int, bytes]:
        st = os.stat(path)
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), os.getxattr(path, hostfile.SELINUX)

    node.apply()
    assert path.read_bytes() != before
    assert kept() == (1234, 5678, 0o640, label)
    os.chown(path, 0, 0)  # changed while we run: the restore puts the original's back
    os.chmod(path, 0o600)
    os.setxattr(path, hostfile.SELINUX, b"system_u:object_r:etc_t:s0\x00")
    node.restore()
    assert path.read_bytes() == before
    assert kept() == (1234, 5678, 0o640, label)


@pytest.mark.skipif(os.geteuid() != 0, reason="SELinux labels need root to be set")
def test_a_new_drop_in_gets_mode_0644_and_its_directorys_label(tmp_path: Path) -> None:
    node = Node(tmp_path, "crio")
    assert node.drop_in is not None
    node.drop_in.parent.mkdir(parents=True)
    label = b"system_u:object_r:container_config_t:s0\x00"
    try:
        os.setxattr(node.drop_in.parent, hostfile.SELINUX, label)
    except OSError as err:
        pytest.skip(f"no security.selinux xattr on this filesystem: {err}")
    node.apply()
    assert stat.S_IMODE(os.stat(node.drop_in).st_mode) == 0o644
    assert os.getxattr(node.drop_in, hostfile.SELINUX) == label


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_io_failure_is_one_line_naming_the_file_and_errno_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str, code: int
) -> None:
    node = Node(tmp_path, runtime)
    fault = DiskFault(monkeypatch, node.disk(), code)
    fault.on = True
    with pytest.raises(hostfile.IoFailure) as caught:
        node.apply()
    message = str(caught.value)
    assert "\n" not in message
    assert f"({errno.errorcode[code]})" in message
    assert message.startswith(("/etc/", "/usr/local/nvidia/runtime-config-backup/"))
    assert str(tmp_path) not in message  # node paths, not this process's view of them
    assert node.config.read_bytes() == node.original
    assert node.strays() == []
    fault.on = False
    node.apply()
    assert has_our_settings(node, node.ours)
    node.restore()
    assert node.config.read_bytes() == node.original


def test_a_drift_check_on_unchanged_files_reads_them_but_parses_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, "containerd")
    node.apply()
    calls: list[str] = []
    monkeypatch.setattr(tomllib, "loads", lambda *a, **k: calls.append("parse") or {})
    with monkeypatch.context() as patch:
        counter = CrashAt(patch)
        applied = node.apply(quick=True)
    assert applied.unchanged
    assert calls == []
    assert counter.count == 0
