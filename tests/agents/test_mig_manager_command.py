"""`gpu-operator agent mig-manager`: upstream's flags and env, where configs come from, and the
one-line errors for what a user can fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner
from waiting import within

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import command, readiness
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.cli import app
from gpu_operator.nvml import mock


def _gpus(preset: str) -> gpus_mod.Gpus:
    machine = mock.MockMachine.from_preset(preset)
    return gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine))


def test_help_lists_upstreams_environment_names() -> None:
    result = CliRunner().invoke(app, ["agent", "mig-manager", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    for name in (
        "NODE_NAME",
        "CONFIG_FILE",
        "DEFAULT_GPU_CLIENTS_NAMESPACE",
        "WITH_REBOOT",
        "WITH_SHUTDOWN_HOST_GPU_CLIENTS",
        "GPU_CLIENTS_FILE",
        "HOST_ROOT_MOUNT",
    ):
        assert name in result.output


def test_a_missing_node_name_exits_2() -> None:
    result = CliRunner().invoke(app, ["agent", "mig-manager"], env={"NODE_NAME": ""})
    assert result.exit_code == 2
    assert "NODE_NAME (--node-name) must not be empty" in result.output


def test_a_bad_config_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("version: v1\nmig-configs:\n  a: [{devices: some, mig-enabled: false}]\n")
    result = CliRunner().invoke(
        app,
        ["agent", "mig-manager", "--backend", "mock", "--machine", "dgx-a100"],
        env={"NODE_NAME": "n1", "CONFIG_FILE": str(bad)},
    )
    assert result.exit_code == 2
    assert f"{bad}: mig-configs.a[0].devices: the only string allowed is 'all'" in result.output


def test_an_unknown_mock_machine_exits_2() -> None:
    result = CliRunner().invoke(
        app,
        ["agent", "mig-manager", "--backend", "mock", "--machine", "dgx-z9"],
        env={"NODE_NAME": "n1"},
    )
    assert result.exit_code == 2
    assert "unknown machine 'dgx-z9'" in result.output


def test_a_config_file_wins_and_is_re_read_on_each_change(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nmig-configs:\n  one: [{devices: all, mig-enabled: false}]\n")
    source = command.config_source(command.Options(config_file=str(path)), _gpus("dgx-a100"))
    assert list(source.load().configs) == ["one"]
    path.write_text("version: v1\nmig-configs:\n  two: [{devices: all, mig-enabled: false}]\n")
    assert list(source.load().configs) == ["two"]
    assert source.generated is None


def test_without_a_config_file_the_config_is_generated_from_the_gpus(tmp_path: Path) -> None:
    target = tmp_path / "etc" / "generated-config.yaml"
    options = command.Options(generated_config_file=str(target))
    source = command.config_source(options, _gpus("dgx-h100"))
    assert "all-1g.10gb" in source.load().configs
    assert source.generated is not None
    assert target.read_text() == source.generated


def test_nodes_without_mig_gpus_fall_back_to_the_default_file(tmp_path: Path) -> None:
    default = tmp_path / "config-default.yaml"
    default.write_text(
        "version: v1\nmig-configs:\n  all-disabled: [{devices: all, mig-enabled: false}]\n"
    )
    options = command.Options(default_config_file=str(default), generated_config_file="")
    assert list(command.config_source(options, _gpus("t4x4")).load().configs) == ["all-disabled"]
    with pytest.raises(command.UsageError, match="no MIG config: CONFIG_FILE is not set"):
        command.config_source(command.Options(generated_config_file=""), _gpus("t4x4"))


def test_gpu_clients_file_lists_host_services(tmp_path: Path) -> None:
    path = tmp_path / "clients.yaml"
    path.write_text("version: v1\nsystemd-services:\n  - nvsm.service\n  - dcgm.service\n")
    assert command.read_gpu_clients(str(path)) == ["nvsm.service", "dcgm.service"]
    assert command.read_gpu_clients("") == []
    path.write_text("systemd-services: nvsm.service\n")
    with pytest.raises(command.UsageError, match="systemd-services: expected a list"):
        command.read_gpu_clients(str(path))


def _fake_nvidia_smi(tmp_path: Path, exit_code: int) -> Path:
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path / "args"}\n'
        'echo "Unable to reset GPU 00000000:07:00.0: In use by another client" >&2\n'
        f"exit {exit_code}\n"
    )
    script.chmod(0o755)
    return script


def test_a_node_resets_only_the_named_gpus_with_nvidia_smi(tmp_path: Path) -> None:
    node = host_mod.NodeHost(tmp_path, nvidia_smi=str(_fake_nvidia_smi(tmp_path, 0)))
    node.reset_gpus(
        [host_mod.GpuRef(0, "00000000:07:00.0"), host_mod.GpuRef(3, "00000000:4E:00.0")]
    )
    assert (tmp_path / "args").read_text().split() == [
        "--gpu-reset",
        "-i",
        "00000000:07:00.0,00000000:4E:00.0",
    ]


def test_a_failed_reset_reports_the_tools_last_words(tmp_path: Path) -> None:
    node = host_mod.NodeHost(tmp_path, nvidia_smi=str(_fake_nvidia_smi(tmp_path, 3)))
    with pytest.raises(host_mod.HostError) as info:
        node.reset_gpus([host_mod.GpuRef(0, "00000000:07:00.0")])
    assert str(info.value) == (
        "resetting GPU(s) 00000000:07:00.0 failed: "
        "Unable to reset GPU 00000000:07:00.0: In use by another client"
    )
    assert info.value.code == nvml.InUse.code  # busy, which a retry may get past
    missing = host_mod.NodeHost(tmp_path, nvidia_smi="no-such-nvidia-smi")
    with pytest.raises(host_mod.HostError, match="GPU reset needs no-such-nvidia-smi"):
        missing.reset_gpus([host_mod.GpuRef(0, "00000000:07:00.0")])


def test_the_selection_is_only_persisted_where_the_hosts_service_expects_it(tmp_path: Path) -> None:
    state_file = "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf"
    assert not host_mod.persist_selected_config(tmp_path, state_file, "all-1g.5gb")
    assert not (tmp_path / state_file.lstrip("/")).exists()
    assert not host_mod.persist_selected_config(None, state_file, "all-1g.5gb")


async def test_the_driver_marker_is_read_without_opening_the_driver(tmp_path: Path) -> None:
    assert readiness.DriverMarker(None).present() is None
    assert readiness.DriverMarker(tmp_path / "absent").present() is None  # not mounted here
    marker = readiness.DriverMarker(tmp_path)
    assert marker.present() is None  # nothing says a driver container serves this node
    validated = tmp_path / "driver-ready"
    validated.write_text("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n")
    assert marker.present() is None  # a driver on the host: there is never a marker
    validated.write_text('IS_HOST_DRIVER="false"\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n')
    assert marker.present() is False  # a driver container, not ready
    changes = marker.changes(0.01)
    assert await within(anext(changes), "the marker's state") is False
    (tmp_path / ".driver-ctr-ready").write_text("")  # the driver container's startup probe
    assert await within(anext(changes), "the marker to appear") is True
    (tmp_path / ".driver-ctr-ready").unlink()  # its preStop hook
    validated.unlink()  # the validator's own marker goes too when it is paused
    assert await within(anext(changes), "the marker to go") is False  # seen before: not ready
    await changes.aclose()
