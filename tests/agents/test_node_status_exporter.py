"""The node status exporter: upstream's gauges from validation markers, the driver, the node's
advertised GPU devices and NVIDIA PCI functions; served on /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from typer.testing import CliRunner
from waiting import within

import kubesim
from gpu_operator import http_endpoint, nvml
from gpu_operator.agents.node_status_exporter import metrics, runner
from gpu_operator.cli import app
from gpu_operator.kube import node_capacity, node_features
from gpu_operator.nvml import mock
from kubesim import KubeletConfig

NOW = 1_700_000_000.0


def exporter(
    tmp_path: Path,
    *,
    devices: int | Exception = 8,
    machine: mock.MockMachine | None = None,
    pci: int | None = 8,
) -> runner.Exporter:
    async def count_devices() -> int:
        if isinstance(devices, Exception):
            raise devices
        return devices

    def count_pci() -> int:
        if pci is None:
            raise OSError("no sysfs")
        return pci

    lab = machine or mock.MockMachine.from_preset("dgx-a100")
    probes = runner.Probes(tmp_path, lab.nvml, count_devices, count_pci)
    return runner.Exporter("gpu-1", probes, interval=30, clock=lambda: NOW)


def gauge(text: str, name: str, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in {**labels, "node": "gpu-1"}.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            assert 'node="gpu-1"' in line, line
            return line.rsplit(" ", 1)[1]
    raise AssertionError(f"no {name}{{{inner}}} in:\n{text}")


async def test_markers_driver_devices_and_pci_become_upstreams_gauges(tmp_path: Path) -> None:
    (tmp_path / "driver-ready").touch()
    (tmp_path / "toolkit-ready").touch()
    (tmp_path / "vfio-pci-ready").touch()
    (tmp_path / "unrelated.txt").touch()
    e = exporter(tmp_path)
    await e.poll_once(slow=True)
    text = metrics.render(e.status).decode()
    assert gauge(text, "gpu_operator_node_metrics_ready_ts_seconds") == "1.7e+09"
    assert gauge(text, "gpu_operator_node_driver_ready") == "1.0"
    assert gauge(text, "gpu_operator_node_toolkit_ready") == "1.0"
    assert gauge(text, "gpu_operator_node_plugin_ready") == "0.0"
    assert gauge(text, "gpu_operator_node_cuda_ready") == "0.0"
    assert gauge(text, "gpu_operator_node_driver_validation") == "1.0"
    assert gauge(text, "gpu_operator_node_driver_validation_last_success_ts_seconds") == "1.7e+09"
    assert gauge(text, "gpu_operator_node_device_plugin_devices_total") == "8.0"
    assert gauge(text, "gpu_operator_node_device_plugin_validation_last_success_ts_seconds") == (
        "1.7e+09"
    )
    assert gauge(text, "gpu_operator_nvidia_pci_devices_total") == "8.0"
    # Every marker, including those upstream has no gauge for.
    ready = "gpu_operator_node_validation_ready"
    assert gauge(text, ready, component="vfio-pci") == "1.0"
    assert gauge(text, ready, component="mofed") == "0.0"
    assert "unrelated" not in text
    assert "# HELP gpu_operator_node_device_plugin_devices_total number of GPU devices" in text
    assert "# TYPE gpu_operator_node_driver_ready gauge" in text


async def test_failures_read_as_upstreams_sentinels(tmp_path: Path) -> None:
    broken = mock.MockMachine.from_preset("t4x4")
    broken.fail_next("init", nvml.DriverNotLoaded, times=None)
    e = exporter(tmp_path, devices=RuntimeError("api down"), machine=broken, pci=None)
    await e.poll_once(slow=True)
    text = metrics.render(e.status).decode()
    assert gauge(text, "gpu_operator_node_driver_validation") == "0.0"
    assert gauge(text, "gpu_operator_node_driver_validation_last_success_ts_seconds") == "0.0"
    assert gauge(text, "gpu_operator_node_device_plugin_devices_total") == "-1.0"
    assert gauge(text, "gpu_operator_nvidia_pci_devices_total") == "-1.0"


async def test_a_marker_that_disappears_closes_its_barrier(tmp_path: Path) -> None:
    marker = tmp_path / "plugin-ready"
    marker.touch()
    e = exporter(tmp_path)
    await e.poll_once(slow=False)
    assert "plugin" in e.status.markers
    marker.unlink()
    await e.poll_once(slow=False)
    assert "plugin" not in e.status.markers


def test_pci_functions_are_counted_by_nvidias_vendor_id(tmp_path: Path) -> None:
    devices = tmp_path / "bus" / "pci" / "devices"
    for bdf, vendor in [
        ("0000:07:00.0", "0x10de"),
        ("0000:07:00.1", "0x10de"),
        ("0000:00:1f.0", "0x8086"),
    ]:
        (devices / bdf).mkdir(parents=True)
        (devices / bdf / "vendor").write_text(vendor + "\n")
    assert runner.pci_counter(tmp_path)() == 2
    with pytest.raises(OSError):
        runner.pci_counter(tmp_path / "absent")()


async def test_metrics_are_served_over_http(tmp_path: Path) -> None:
    e = exporter(tmp_path)
    await e.poll_once(slow=True)
    endpoint = await http_endpoint.start(e.routes(), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(base + "/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == runner.CONTENT_TYPE
                assert "gpu_operator_nvidia_pci_devices_total" in await resp.text()
            async with client.get(base + "/health") as resp:
                assert await resp.text() == "OK"
    finally:
        await endpoint.aclose()


def test_gpu_resources_sum_whole_gpus_shared_replicas_and_mig_devices() -> None:
    capacity = {
        "cpu": "64",
        "nvidia.com/gpu": "4",
        "nvidia.com/gpu.shared": "8",
        "nvidia.com/mig-1g.5gb": "7",
        "example.com/fpga": "2",
    }
    assert node_capacity.count_gpu_resources(capacity) == 19


async def test_device_count_comes_from_the_nodes_capacity_over_the_api() -> None:
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True, lease_interval=None)) as sim:
        sim.add_node("gpu-1", capacity={"cpu": "8", "nvidia.com/gpu": "8"})
        api = node_features.client(sim.kubeconfig_path)
        try:
            assert await node_capacity.gpu_device_count(api, "gpu-1") == 8
            probes = runner.Probes(
                Path("/nonexistent"),
                mock.MockMachine.from_preset("t4x4").nvml,
                lambda: node_capacity.gpu_device_count(api, "absent"),
                lambda: 0,
            )
            e = runner.Exporter("gpu-1", probes)
            await e.poll_devices()
            assert e.status.devices == -1
        finally:
            await api.close()


def test_cli_needs_the_node_name() -> None:
    result = CliRunner().invoke(
        app, ["agent", "node-status-exporter", "--backend", "mock", "--machine", "t4x4"], env={}
    )
    assert result.exit_code == 2
    assert "node-status-exporter: NODE_NAME (--node-name) is required" in result.output


async def test_the_loop_polls_slow_probes_every_other_round(tmp_path: Path) -> None:
    calls: list[str] = []
    e = exporter(tmp_path)
    real_driver = e.poll_driver

    async def driver() -> None:
        calls.append("driver")
        await real_driver()

    e.poll_driver = driver  # type: ignore[method-assign]
    e.interval = 0.0
    stop = asyncio.Event()
    task = asyncio.create_task(e.run(stop))
    async with e.polled:
        await within(e.polled.wait_for(lambda: e.polls >= 4), "4 polls")
    stop.set()
    await task
    assert calls.count("driver") == (e.polls + 1) // 2
