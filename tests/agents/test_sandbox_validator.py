"""The sandbox validator's checks on the simulated host: workload type, vfio-pci, vGPU manager
and vGPU devices, with their markers under /run/nvidia/validations."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from vm_hosts import host

from gpu_operator.agents.sandbox_validator import checks, command
from gpu_operator.agents.vfio_manager import manage
from gpu_operator.agents.vgpu_device_manager import apply, config, planner, state

WORKLOAD = "nvidia.com/gpu.workload.config"


def _settings(root: Path, component: str, **kw: object) -> command.Settings:
    return command.Settings(
        component=component, root=root, validations_dir=root / "run/nvidia/validations",
        poll_interval=0.01, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _labels(values: dict[str, str]) -> command.Labels:
    async def read() -> dict[str, str]:
        return dict(values)

    return read


@pytest.mark.parametrize(
    ("labels", "default", "expected"),
    [
        ({WORKLOAD: "vm-vgpu"}, "vm-passthrough", "vm-vgpu"),
        ({WORKLOAD: "bogus"}, "container", "container"),
        ({}, None, "vm-passthrough"),
        ({}, "bogus", "vm-passthrough"),
    ],
)
def test_the_workload_type_is_the_label_else_the_default_else_passthrough(
    labels: dict[str, str], default: str | None, expected: str
) -> None:
    assert checks.workload_type(labels, default) == expected


async def test_vfio_pci_is_ready_once_every_gpu_is_on_vfio(tmp_path: Path) -> None:
    kernel = host(tmp_path, "l40sx4")
    settings = _settings(tmp_path, "vfio-pci", with_wait=False)
    out = settings.validations_dir
    labels = _labels({WORKLOAD: "vm-passthrough"})
    assert await command.validate(settings, labels) == command.EXIT_FAILED
    assert (out / "workload-type").read_text() == "vm-passthrough"
    assert not (out / "vfio-pci-ready").exists()
    manage.bind_all(kernel)
    assert await command.validate(settings, labels) == command.EXIT_OK
    assert (out / "vfio-pci-ready").exists()
    # A later failure removes the marker first.
    manage.unbind_all(kernel)
    assert await command.validate(settings, labels) == command.EXIT_FAILED
    assert not (out / "vfio-pci-ready").exists()


async def test_with_wait_vfio_pci_gives_up_only_when_stopped(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    settings = _settings(tmp_path, "vfio-pci")
    stop = asyncio.Event()
    stop.set()
    assert await command.validate(settings, _labels({}), stop) == command.EXIT_FAILED
    manage.bind_all(kernel)
    assert await command.validate(settings, _labels({}), stop) == command.EXIT_OK


async def test_vm_vgpu_checks_are_skipped_on_passthrough_nodes_and_the_reverse(
    tmp_path: Path,
) -> None:
    host(tmp_path, "t4x4")
    out = tmp_path / "run/nvidia/validations"
    for component in ("vgpu-manager", "vgpu-devices"):
        settings = _settings(tmp_path, component, with_wait=False)
        assert await command.validate(settings, _labels({})) == command.EXIT_OK
        assert not (out / f"{component}-ready").exists()
    settings = _settings(tmp_path, "vfio-pci", with_wait=False)
    assert await command.validate(settings, _labels({WORKLOAD: "vm-vgpu"})) == command.EXIT_OK
    assert (out / "workload-type").read_text() == "vm-vgpu"
    assert not (out / "vfio-pci-ready").exists()


async def test_the_vgpu_manager_marker_says_whether_the_driver_runs_in_a_container(
    tmp_path: Path,
) -> None:
    kernel = host(tmp_path, "a30x4")
    out = tmp_path / "run/nvidia/validations"
    vgpu = _labels({WORKLOAD: "vm-vgpu"})
    settings = _settings(tmp_path, "vgpu-manager", with_wait=False)
    assert await command.validate(settings, vgpu) == command.EXIT_FAILED
    kernel.load_nvidia(vgpu=True)  # loaded, but no VFs yet
    assert await command.validate(settings, vgpu) == command.EXIT_FAILED
    kernel.load_nvidia(vgpu=True, enable_vfs=True)
    assert await command.validate(settings, vgpu) == command.EXIT_OK
    assert (out / "host-vgpu-manager-ready").exists()
    (out / ".driver-ctr-ready").write_text("")
    assert await command.validate(settings, vgpu) == command.EXIT_OK
    assert (out / "vgpu-manager-ready").exists()
    assert not (out / "host-vgpu-manager-ready").exists()


async def test_vgpu_devices_are_ready_with_one_vgpu(tmp_path: Path) -> None:
    kernel = host(tmp_path, "t4x4")
    kernel.load_nvidia(vgpu=True)
    vgpu = _labels({WORKLOAD: "vm-vgpu"})
    settings = _settings(tmp_path, "vgpu-devices", with_wait=False)
    assert await command.validate(settings, vgpu) == command.EXIT_FAILED
    entries = config.loads(
        "version: v1\nvgpu-configs: {x: [{devices: [0], vgpu-devices: {T4-16Q: 1}}]}"
    ).select("x")
    apply.apply(kernel, planner.plan(state.read(tmp_path), entries))
    assert await command.validate(settings, vgpu) == command.EXIT_OK
    assert (tmp_path / "run/nvidia/validations/vgpu-devices-ready").exists()


async def test_cc_manager_waits_only_on_cc_capable_nodes(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "cc-manager", with_wait=False)
    assert await command.validate(settings, _labels({})) == command.EXIT_OK
    capable = _labels({"nvidia.com/cc.capable": "true"})
    assert await command.validate(settings, capable) == command.EXIT_FAILED
    (tmp_path / "run/nvidia/validations/.cc-manager-ctr-ready").write_text("")
    assert await command.validate(settings, capable) == command.EXIT_OK


async def test_an_unknown_component_is_a_usage_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "toolkit")
    assert await command.validate(settings, _labels({})) == command.EXIT_USAGE


def test_the_plugin_prerequisites_follow_the_workload_type(tmp_path: Path) -> None:
    out = tmp_path / "v"
    out.mkdir()
    assert command.plugin_missing(out, vgpu=True) == "workload-type"
    (out / "workload-type").write_text("vm-vgpu")
    (out / "vfio-pci-ready").write_text("")  # not what a vGPU node waits for
    assert command.plugin_missing(out, vgpu=True) == "vgpu-devices-ready"
    assert command.plugin_missing(out, vgpu=False) is None  # a passthrough-only plugin
    (out / "vgpu-devices-ready").write_text("")
    assert command.plugin_missing(out, vgpu=True) is None
    (out / "workload-type").write_text("vm-passthrough")
    (out / "vfio-pci-ready").unlink()
    assert command.plugin_missing(out, vgpu=True) == "vfio-pci-ready"
    command.remove_ready_markers(out)
    assert sorted(p.name for p in out.iterdir()) == ["workload-type"]


async def test_waiting_for_the_plugin_prerequisites_ends_when_they_are_there_or_on_stop(
    tmp_path: Path,
) -> None:
    stop = asyncio.Event()
    (tmp_path / "workload-type").write_text("vm-passthrough")
    stop.set()
    assert not await command.wait_for_plugin_prerequisites(
        tmp_path, vgpu=True, poll_interval=0.01, stop=stop
    )
    (tmp_path / "vfio-pci-ready").write_text("")
    assert await command.wait_for_plugin_prerequisites(
        tmp_path, vgpu=True, poll_interval=0.01, stop=stop
    )
