"""The runtime-config guard next to NVIDIA's toolkit: the original saved before the toolkit's
first edit (and kept when an earlier pod did not restore it), put back byte for byte when the file
differs only by what NVIDIA's toolkit writes (re-serialised, its runtimes and default added), left
alone with a message when somebody else changed it too."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import guard, settings
from gpudemo import nvidia_toolkit

SAMPLES = Path(__file__).parent / "samples"
CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"


def host(root: Path) -> Callable[[str], Path]:
    """The toolkit container's paths onto a temp host root (its runtime mounts)."""
    mounts = {
        "/runtime/config-dir": root / "etc/containerd",
        "/runtime/config-dir.d": root / "etc/containerd/conf.d",
        "/usr/local/nvidia": root / "usr/local/nvidia",
    }

    def view(path: str) -> Path:
        for prefix, target in mounts.items():
            if path == prefix or path.startswith(prefix + "/"):
                return target / path[len(prefix) :].lstrip("/")
        return root / path.lstrip("/")

    return view


def containerd_settings() -> settings.Settings:
    return settings.from_env(
        {
            "RUNTIME": "containerd",
            "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
            "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.toml",
            "RUNTIME_DROP_IN_CONFIG_HOST_PATH": DROP_IN,
            "RUNTIME_CONFIG_BACKUP_DIR": "/usr/local/nvidia/runtime-config-guard",
            "CONTAINERD_RUNTIME_CLASS": "nvidia",
        }
    )


@pytest.fixture
def node(tmp_path: Path) -> Path:
    config = tmp_path / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_bytes((SAMPLES / "containerd-v3.toml").read_bytes())
    return tmp_path


@pytest.mark.parametrize("sample", ["containerd-v3.toml", "containerd-v2-imports.toml"])
def test_nvidias_in_place_rewrite_is_undone_byte_for_byte(node: Path, sample: str) -> None:
    s, view = containerd_settings(), host(node)
    config = node / "etc/containerd/config.toml"
    original = (SAMPLES / sample).read_bytes()
    config.write_bytes(original)
    said = guard.save(s, view)
    assert said[0] == f"saved {CONFIG} (sha256:{hashlib.sha256(original).hexdigest()})"
    # NVIDIA's toolkit: its runtimes added, the whole file re-serialised, and a drop-in of its own.
    config.write_text(nvidia_toolkit.rewrite(original.decode(), s))
    (node / "etc/containerd/conf.d").mkdir(exist_ok=True)
    (node / "etc/containerd/conf.d/99-nvidia.toml").write_text("version = 3\n")
    assert config.read_bytes() != original
    restored = guard.restore(s, view)
    assert restored.kept == []
    assert config.read_bytes() == original
    assert not (node / "etc/containerd/conf.d/99-nvidia.toml").exists()
    assert not (node / "usr/local/nvidia/runtime-config-guard").exists()
    assert f"restored {CONFIG} byte for byte" in restored.exact[0]


def test_a_copy_left_by_an_earlier_pod_is_the_original_and_is_kept(node: Path) -> None:
    s, view = containerd_settings(), host(node)
    config = node / "etc/containerd/config.toml"
    original = config.read_bytes()
    guard.save(s, view)
    config.write_text(nvidia_toolkit.rewrite(original.decode(), s))  # the pod died unrestored
    said = guard.save(s, view)  # the next pod
    assert "kept the original runtime config saved in" in said[0]
    guard.restore(s, view)
    assert config.read_bytes() == original


def test_a_change_beyond_nvidias_settings_is_left_alone_and_the_original_kept(node: Path) -> None:
    s, view = containerd_settings(), host(node)
    config = node / "etc/containerd/config.toml"
    original = config.read_bytes()
    guard.save(s, view)
    rewritten = nvidia_toolkit.rewrite(original.decode(), s)
    config.write_text(rewritten.replace("pause:3.10", "pause:3.11"))  # a node-image update too
    restored = guard.restore(s, view)
    assert restored.exact == []
    assert "changed by more than the NVIDIA toolkit's settings" in restored.kept[0]
    assert "pause:3.11" in config.read_text()
    backup = node / "usr/local/nvidia/runtime-config-guard/config.orig"
    assert backup.read_bytes() == original


def test_an_unchanged_config_needs_nothing(node: Path) -> None:
    s, view = containerd_settings(), host(node)
    guard.save(s, view)
    restored = guard.restore(s, view)
    assert restored.exact == []
    assert restored.kept == []
    assert not restored.changed


def test_a_copy_that_cannot_be_made_does_not_stop_the_toolkit(node: Path) -> None:
    s, view = containerd_settings(), host(node)
    (node / "usr/local/nvidia").mkdir(parents=True)
    (node / "usr/local/nvidia/runtime-config-guard").write_text("not a directory")
    said = guard.save(s, view)
    assert said[0].startswith("cannot save the runtime config")


def test_docker_daemon_json_compares_without_nvidias_runtime_and_default() -> None:
    original = json.dumps({"log-driver": "json-file", "runtimes": {"crun": {"path": "crun"}}})
    theirs = json.dumps(
        {
            "default-runtime": "nvidia",
            "log-driver": "json-file",
            "runtimes": {"crun": {"path": "crun"}, "nvidia": {"path": "/x/nvidia"}},
            "features": {"cdi": True},
        },
        indent=4,
    )
    assert guard.equivalent("docker", "config", theirs.encode(), original.encode())
    other = json.dumps({"log-driver": "journald", "runtimes": {"crun": {"path": "crun"}}})
    assert not guard.equivalent("docker", "config", other.encode(), original.encode())
