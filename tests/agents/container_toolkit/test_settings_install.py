"""Upstream's environment contract, the toolkit's own files under ROOT and the pid-file lock."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from gpu_operator.agents.container_toolkit import install, settings

# What our DaemonSet passes today (`gpu-operator render -f examples/clusterpolicy-default.yaml`).
OPERATOR_ENV = {
    "ROOT": "/usr/local/nvidia",
    "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND": "management.nvidia.com/gpu",
    "NVIDIA_VISIBLE_DEVICES": "void",
    "TOOLKIT_PID_FILE": "/run/nvidia/toolkit/toolkit.pid",
    "CDI_ENABLED": "true",
    "NVIDIA_RUNTIME_SET_AS_DEFAULT": "false",
    "NVIDIA_CONTAINER_RUNTIME_MODE": "cdi",
    "RUNTIME": "containerd",
    "CONTAINERD_RUNTIME_CLASS": "nvidia",
    "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
    "CONTAINERD_CONFIG": "/runtime/config-dir/config.toml",
    "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.toml",
    "RUNTIME_DROP_IN_CONFIG_HOST_PATH": "/etc/containerd/conf.d/99-nvidia.toml",
    "RUNTIME_SOCKET": "/runtime/sock-dir/containerd.sock",
    "CONTAINERD_SOCKET": "/runtime/sock-dir/containerd.sock",
}


def test_the_operator_env_configures_containerd_with_cdi_and_no_default() -> None:
    s = settings.from_env(OPERATOR_ENV)
    assert (s.runtime, s.config, s.config_host) == (
        "containerd",
        "/runtime/config-dir/config.toml",
        "/etc/containerd/config.toml",
    )
    assert (s.drop_in, s.drop_in_host) == (
        "/runtime/config-dir.d/99-nvidia.toml",
        "/etc/containerd/conf.d/99-nvidia.toml",
    )
    assert s.restart_mode == "signal"
    assert s.cdi_enabled
    assert s.enable_cdi_in_runtime
    assert not s.set_as_default
    assert [h.name for h in s.handlers()] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert not any(h.default for h in s.handlers())
    assert s.backup_dir == "/usr/local/nvidia/runtime-config-backup"
    assert s.drift_interval == 5.0


def test_upstream_defaults_without_env() -> None:
    s = settings.from_env({})
    assert s.runtime == "docker"
    assert s.config == "/etc/docker/daemon.json"
    assert s.set_as_default is True
    assert s.driver_root == s.driver_root_ctr == "/run/nvidia/driver"
    assert s.cdi_kind == "management.nvidia.com/gpu"


def test_crio_defaults_to_systemd_and_its_drop_in() -> None:
    s = settings.from_env({"RUNTIME": "crio", "CRIO_CONFIG_MODE": "hook"})
    assert s.restart_mode == "systemd"
    assert s.drop_in == "/etc/crio/crio.conf.d/99-nvidia.conf"
    assert s.crio_hook == "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RUNTIME": "podman"}, "RUNTIME: unknown runtime 'podman'"),
        ({"RUNTIME": "crio", "RUNTIME_RESTART_MODE": "signal"}, "restarting crio with a signal"),
        ({"RUNTIME_RESTART_MODE": "reboot"}, "RUNTIME_RESTART_MODE: invalid restart mode"),
        ({"CDI_ENABLED": "sure"}, "CDI_ENABLED: expected true or false, not 'sure'"),
        ({"TOOLKIT_PID_FILE": "/run/x.pid"}, "TOOLKIT_PID_FILE: invalid toolkit.pid path"),
        ({"CRIO_CONFIG_MODE": "nri"}, "CRIO_CONFIG_MODE: invalid cri-o config mode"),
        (
            {"RUNTIME_CONFIG_DRIFT_INTERVAL": "-1"},
            "RUNTIME_CONFIG_DRIFT_INTERVAL: expected seconds",
        ),
        ({"RUNTIME_CONFIG_SOURCE": "dump"}, "RUNTIME_CONFIG_SOURCE: unknown source 'dump'"),
        ({"CDI_SPEC_TIMEOUT": "soon"}, r"CDI_SPEC_TIMEOUT: expected seconds \(0 retries"),
        ({"CDI_SPEC_TIMEOUT": "-5"}, "CDI_SPEC_TIMEOUT: expected seconds"),
        (
            {"RUNTIME_CONFIG_IO_TIMEOUT": "never"},
            r"RUNTIME_CONFIG_IO_TIMEOUT: expected seconds \(0 retries forever\), not 'never'",
        ),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(settings.SettingsError, match=message):
        settings.from_env(env)


def test_the_driver_ready_file_reads_as_upstreams_entrypoint_sources_it() -> None:
    text = (
        "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n"
        "DRIVER_ROOT_CTR_PATH=/driver-root\n"
    )
    assert settings.read_driver_ready(text) == {
        "IS_HOST_DRIVER": "false",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "DRIVER_ROOT_CTR_PATH": "/driver-root",
    }


def test_the_runtime_config_has_mode_default_kind_and_driver_root() -> None:
    text = install.runtime_config(
        install.RuntimeConfig(
            "/usr/local/nvidia/toolkit",
            mode="cdi",
            cdi_default_kind="management.nvidia.com/gpu",
            low_level_runtimes=("runc", "crun"),
        )
    )
    data = tomllib.loads(text)
    runtime = data["nvidia-container-runtime"]
    assert runtime["mode"] == "cdi"
    assert runtime["modes"]["cdi"]["default-kind"] == "management.nvidia.com/gpu"
    assert runtime["runtimes"] == ["runc", "crun"]
    assert data["nvidia-container-cli"]["root"] == "/run/nvidia/driver"
    assert data["nvidia-container-cli"]["ldconfig"] == "@/run/nvidia/driver/sbin/ldconfig"
    assert data["nvidia-container-runtime-hook"]["path"] == (
        "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"
    )
    assert data["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True


def test_stand_ins_for_the_binaries_only_on_a_simulated_node(tmp_path: Path) -> None:
    config = install.RuntimeConfig("/usr/local/nvidia/toolkit")
    lines = install.install(tmp_path, config, stand_ins=False)
    assert not (tmp_path / "toolkit/nvidia-container-runtime").exists()
    assert "on a real node they come from NVIDIA's container-toolkit image" in lines[-1]
    assert (tmp_path / "toolkit/.config/nvidia-container-runtime/config.toml").is_file()
    install.install(tmp_path, config, stand_ins=True)
    binary = tmp_path / "toolkit/nvidia-container-runtime.cdi"
    assert os.access(binary, os.X_OK)
    install.uninstall_stand_ins(tmp_path)
    assert not binary.exists()


def test_the_pid_lock_admits_one_instance_and_holds_our_pid(tmp_path: Path) -> None:
    first = install.PidLock(tmp_path / "toolkit.pid")
    first.acquire()
    assert (tmp_path / "toolkit.pid").read_text() == f"{os.getpid()}\n"
    with pytest.raises(install.InstallError, match="another instance of the toolkit container"):
        install.PidLock(tmp_path / "toolkit.pid").acquire()
    first.release()
    assert not (tmp_path / "toolkit.pid").exists()
    again = install.PidLock(tmp_path / "toolkit.pid")
    again.acquire()
    again.release()
