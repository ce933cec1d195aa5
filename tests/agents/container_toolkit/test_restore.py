"""The original runtime config: saved before the first edit, restored byte for byte, or only
our settings removed when somebody else changed the file since (and then said so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import backup, configure, containerd, docker, runtimes
from gpu_operator.agents.container_toolkit.edits import CONFIG, DROP_IN

SAMPLES = Path(__file__).parent / "samples"
HANDLERS = runtimes.handlers("/usr/local/nvidia/toolkit", "nvidia", False)


class Node:
    """A node's containerd files in a temp root, with the editor and the backup store."""

    def __init__(self, root: Path, sample: str = "containerd-v3.toml") -> None:
        self.config = root / "etc/containerd/config.toml"
        self.drop_in = root / "etc/containerd/conf.d/99-nvidia.toml"
        self.config.parent.mkdir(parents=True)
        self.original = (SAMPLES / sample).read_bytes()
        self.config.write_bytes(self.original)
        self.editor = containerd.Containerd(
            containerd.Options(
                HANDLERS, enable_cdi=True, drop_in="/etc/containerd/conf.d/99-nvidia.toml"
            )
        )
        self.files = configure.RuntimeFiles(
            {
                CONFIG: configure.FileSpec(self.config, "/etc/containerd/config.toml"),
                DROP_IN: configure.FileSpec(self.drop_in, "/etc/containerd/conf.d/99-nvidia.toml"),
            }
        )
        self.backup_dir = root / "usr/local/nvidia/runtime-config-backup"

    @property
    def store(self) -> backup.Store:  # a new one each time, as a new pod would open it
        return backup.Store(self.backup_dir)

    def apply(self) -> configure.Applied:
        return configure.apply(self.editor, self.files, self.store, "containerd")

    def restore(self) -> configure.Restored:
        return configure.restore(self.editor, self.files, self.store)


def test_the_original_is_saved_with_its_digest_before_the_first_edit(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.apply()
    state = json.loads((node.backup_dir / "state.json").read_text())
    assert state["files"]["config"]["original"] == backup.digest(node.original)
    assert state["files"]["config"]["written"] == backup.digest(node.config.read_bytes())
    assert state["files"]["drop-in"]["original"] is None
    assert (node.backup_dir / "config.orig").read_bytes() == node.original


def test_uninstall_restores_the_config_byte_for_byte_and_removes_the_drop_in(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    applied = node.apply()
    assert applied.written == [
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/99-nvidia.toml",
    ]
    restored = node.restore()
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()
    assert not node.backup_dir.exists()
    assert any(
        "restored /etc/containerd/config.toml byte for byte" in line for line in restored.exact
    )
    assert any("removed /etc/containerd/conf.d/99-nvidia.toml" in line for line in restored.exact)
    assert restored.partial == []


def test_a_second_pod_finds_the_backup_and_writes_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.apply()
    again = node.apply()
    assert again.written == []
    assert again.rebased == []
    node.restore()
    assert node.config.read_bytes() == node.original


def test_a_config_changed_by_others_keeps_their_change_and_loses_only_ours(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.apply()
    edited = node.config.read_bytes().replace(b"pause:3.10", b"pause:3.11")
    node.config.write_bytes(edited)
    restored = node.restore()
    assert node.config.read_bytes() == node.original.replace(b"pause:3.10", b"pause:3.11")
    assert not node.drop_in.exists()
    assert any("changed since the toolkit wrote it" in line for line in restored.partial)


def test_a_node_image_update_while_we_run_becomes_the_config_uninstall_restores(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    node.apply()
    image_update = node.original.replace(b"oom_score", b"# oom_score").replace(b"3.10", b"3.11")
    node.config.write_bytes(image_update)  # the update knows nothing of our imports line
    drift = node.apply()
    assert drift.rebased == ["/etc/containerd/config.toml"]
    assert drift.written == ["/etc/containerd/config.toml"]
    assert b"conf.d/*.toml" in node.config.read_bytes()
    node.restore()
    assert node.config.read_bytes() == image_update


def test_a_damaged_saved_original_falls_back_to_removing_only_ours(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.apply()
    (node.backup_dir / "config.orig").write_bytes(b"version = 3\n")
    restored = node.restore()
    assert node.config.read_bytes() == node.original
    assert any("missing or damaged" in line for line in restored.partial)


def test_restore_without_a_backup_still_removes_our_settings(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.apply()
    for path in node.backup_dir.iterdir():
        path.unlink()
    node.restore()
    assert node.config.read_bytes() == node.original
    assert not node.drop_in.exists()


def test_an_unreadable_backup_state_is_an_error_naming_the_file(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.backup_dir.mkdir(parents=True)
    (node.backup_dir / "state.json").write_text("{")
    with pytest.raises(backup.BackupError, match=r"state\.json: unreadable backup state"):
        node.apply()


def test_docker_restore_is_byte_exact_when_untouched(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    original = (SAMPLES / "daemon.json").read_bytes()
    path.write_bytes(original)
    ed = docker.Docker(docker.Options(HANDLERS, enable_cdi=True))
    files = configure.RuntimeFiles({CONFIG: configure.FileSpec(path, "/etc/docker/daemon.json")})
    store = backup.Store(tmp_path / "backup")
    configure.apply(ed, files, store, "docker")
    assert json.loads(path.read_bytes())["runtimes"]["nvidia"]
    configure.restore(ed, files, backup.Store(tmp_path / "backup"))
    assert path.read_bytes() == original
