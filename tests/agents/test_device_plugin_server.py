"""The plugin over real unix sockets: registration, ListAndWatch, Allocate and preferred
allocation against a minimal fake kubelet; restarts, reloads, shutdown, CDI specs, MPS, the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner
from waiting import DEADLINE, eventually, within

from gpu_operator.agents.device_plugin import endpoint, manager, mps, mps_daemon
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.cli import app
from gpu_operator.nvml import errors, mock
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

WAIT = DEADLINE


class FakeKubelet(pb_grpc.RegistrationServicer):
    """A Registration server that records every Register call."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.requests: list[pb.RegisterRequest] = []
        self.changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.requests.append(request)
        self.changed.set()
        return pb.Empty()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    def names(self) -> list[str]:
        return [r.resource_name for r in self.requests]

    async def wait_registered(self, n: int) -> list[str]:
        await eventually(
            lambda: len(self.requests) >= n, f"{n} registration(s)", timeout=WAIT, state=self.names
        )
        return self.names()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[FakeKubelet]:
    k = FakeKubelet(short_dir / "kubelet.sock")
    await k.start()
    yield k
    await k.stop()


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))
        self.changed.set()


def make_settings(
    root: Path, config: dict[str, Any] | None = None, **kw: Any
) -> dp_settings.Settings:
    path = None
    if config is not None:
        path = root / "config.yaml"
        path.write_text(json.dumps(config))
    defaults: dict[str, Any] = {
        "kubelet_socket": root / "kubelet.sock",
        "plugin_dir": root,
        "cdi_root": root / "cdi",
        "driver_root_view": root / "driver",
        "dev_root_view": root / "dev-root",
        "sys_root": root / "sys-root",
        "mps_root_view": root / "mps",
        "recheck_interval": 0.05,
        "retry_interval": 0.2,
        "kubelet_poll_interval": 0.05,
        "mps_poll_interval": 0.05,
        "mps_wait_timeout": WAIT,
    }
    defaults.update(kw)
    return dp_settings.build(path, {}, **defaults)


class Running:
    """A manager running as a task, stopped on exit."""

    def __init__(self, m: manager.Manager) -> None:
        self.manager = m
        self.stop = asyncio.Event()
        self.reload = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(
            self.manager.run(stop=self.stop, reload=self.reload, install_signals=False)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await within(self.task, "the device plugin manager to stop", WAIT)


def plugin_stub(root: Path, name: str = "nvidia-gpu.sock") -> pb_grpc.DevicePluginStub:
    return pb_grpc.DevicePluginStub(grpc.aio.insecure_channel(f"unix://{root / name}"))


async def test_registers_one_plugin_per_resource_with_v1beta1_and_preferred_allocation(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    s = make_settings(short_dir, {"flags": {"migStrategy": "mixed"}})
    async with Running(manager.Manager(s, machine.nvml)):
        names = await kubelet.wait_registered(3)
        assert sorted(names) == [
            "nvidia.com/mig-1g.5gb",
            "nvidia.com/mig-2g.10gb",
            "nvidia.com/mig-3g.20gb",
        ]
        request = next(r for r in kubelet.requests if r.resource_name.endswith("1g.5gb"))
        assert request.version == "v1beta1"
        assert request.endpoint == "nvidia-mig-1g.5gb.sock"
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required
        assert (short_dir / "nvidia-mig-1g.5gb.sock").is_socket()
        options = await plugin_stub(short_dir, "nvidia-mig-1g.5gb.sock").GetDevicePluginOptions(
            pb.Empty()
        )
        assert options.get_preferred_allocation_available


async def test_list_and_watch_streams_health_changes_within_100_ms_of_the_xid(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    # An R565+ driver: the recovery-action field tells when the reset cleared the XID.
    machine = mock.MockMachine.from_preset("t4x4", driver="570.195.03")
    async with Running(manager.Manager(make_settings(short_dir), machine.nvml)) as run:
        await kubelet.wait_registered(1)
        await within(run.manager.state.serving.wait(), "the plugin to serve", WAIT)
        assert run.manager.state.monitor is not None
        assert await asyncio.to_thread(run.manager.state.monitor.started.wait, WAIT)
        stream = plugin_stub(short_dir).ListAndWatch(pb.Empty())
        first = await stream.read()
        assert [d.health for d in first.devices] == ["Healthy"] * 4
        # How fast is bench/device_plugin_bench.py's figure (target 100 ms), not a test's.
        machine.inject_xid(2, 48)
        update = await within(stream.read(), "the Unhealthy update", WAIT)
        assert [d.health for d in update.devices] == ["Healthy", "Healthy", "Unhealthy", "Healthy"]
        machine.reset(2)
        recovered = await within(stream.read(), "the Healthy update", WAIT)
        assert [d.health for d in recovered.devices] == ["Healthy"] * 4
        stream.cancel()


async def test_health_changes_are_recorded_as_node_events(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    events = Events()
    m = manager.Manager(make_settings(short_dir), machine.nvml, events=events)
    async with Running(m):
        await kubelet.wait_registered(1)
        assert m.state.monitor is not None
        assert await asyncio.to_thread(m.state.monitor.started.wait, WAIT)
        uuid = m.state.resources[0].devices[1].uuid
        machine.fall_off_bus(1)
        await eventually(lambda: events.events, "the GPUUnhealthy event", timeout=WAIT)
        assert events.events[0] == (
            "Warning",
            "GPUUnhealthy",
            f"nvidia.com/gpu device {uuid} is unhealthy: XID 79",
        )
        machine.reset(1)
        await eventually(
            lambda: len(events.events) >= 2,
            "the GPUHealthy event",
            timeout=WAIT,
            state=lambda: events.events,
        )
        kind, reason, message = events.events[1]
        assert (kind, reason) == ("Normal", "GPUHealthy")
        assert message.startswith(f"nvidia.com/gpu device {uuid} is healthy again: the GPU answers")


async def test_allocate_over_grpc_returns_the_runtime_settings_and_refuses_unknown_ids(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    config = {"flags": {"plugin": {"passDeviceSpecs": True, "deviceIDStrategy": "index"}}}
    async with Running(manager.Manager(make_settings(short_dir, config), machine.nvml)):
        await kubelet.wait_registered(1)
        stub = plugin_stub(short_dir)
        ids = [d.ID for d in (await stub.ListAndWatch(pb.Empty()).read()).devices]
        response = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=ids[1:3]),
                    pb.ContainerAllocateRequest(devices_ids=ids[:1]),
                ]
            )
        )
        first, second = response.container_responses
        assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": "1,2"}
        assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
            ("/dev/nvidia1", "/dev/nvidia1", "rw"),
            ("/dev/nvidia2", "/dev/nvidia2", "rw"),
        ]
        assert dict(second.envs) == {"NVIDIA_VISIBLE_DEVICES": "0"}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])]
                )
            )
        assert err.value.code() is grpc.StatusCode.UNKNOWN
        assert err.value.details() == (
            "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-nope"
        )


async def test_preferred_allocation_over_grpc_picks_gpus_on_one_pcie_switch(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    async with Running(manager.Manager(make_settings(short_dir), machine.nvml)):
        await kubelet.wait_registered(1)
        stub = plugin_stub(short_dir)
        ids = [d.ID for d in (await stub.ListAndWatch(pb.Empty()).read()).devices]
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=ids[3:], must_include_deviceIDs=[ids[6]], allocation_size=2
                )
            ]
        )
        response = await stub.GetPreferredAllocation(request)
        assert sorted(response.container_responses[0].deviceIDs) == sorted([ids[6], ids[7]])


async def test_time_sliced_allocation_larger_than_one_fails_over_grpc(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    config = {
        "sharing": {
            "timeSlicing": {
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        }
    }
    async with Running(manager.Manager(make_settings(short_dir, config), machine.nvml)):
        await kubelet.wait_registered(1)
        stub = plugin_stub(short_dir)
        devices = (await stub.ListAndWatch(pb.Empty()).read()).devices
        assert len(devices) == 16
        assert devices[0].ID.endswith("::0")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=[devices[0].ID, devices[1].ID])
                    ]
                )
            )
        assert "maximum request size for shared resources is 1" in (err.value.details() or "")


async def test_a_new_kubelet_socket_makes_every_plugin_register_again(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    async with Running(manager.Manager(make_settings(short_dir), machine.nvml)) as run:
        await kubelet.wait_registered(1)
        await kubelet.stop()
        await kubelet.start()  # the kubelet restarted: a fresh kubelet.sock
        assert await kubelet.wait_registered(2) == ["nvidia.com/gpu", "nvidia.com/gpu"]
        assert run.manager.state.starts == 2


async def test_a_missing_kubelet_is_retried_until_it_appears(short_dir: Path) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    s = make_settings(short_dir, retry_interval=0.2)
    async with Running(manager.Manager(s, machine.nvml)) as run:
        await eventually(  # a failed start, then the retry
            lambda: run.manager.state.starts >= 2,
            "a failed start, then the retry",
            timeout=WAIT,
            interval=0.01,
            state=lambda: run.manager.state.starts,
        )
        assert run.manager.state.servers == []
        k = FakeKubelet(short_dir / "kubelet.sock")
        await k.start()
        try:
            # The retry may dial the socket before the watcher sees it appear, which then
            # registers once more: harmless, so only the resource registered is checked.
            assert set(await k.wait_registered(1)) == {"nvidia.com/gpu"}
        finally:
            await k.stop()


async def test_sighup_reloads_the_config_and_a_bad_file_keeps_the_running_plugins(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    events = Events()
    s = make_settings(short_dir, {"version": "v1"})
    async with Running(manager.Manager(s, machine.nvml, events=events)) as run:
        await kubelet.wait_registered(1)
        assert s.config_path is not None
        s.config_path.write_text(json.dumps({"sharing": {"timeSlicing": {"resources": [
            {"name": "nvidia.com/gpu", "replicas": 2}]}}}))  # fmt: skip
        run.reload.set()
        await kubelet.wait_registered(2)
        stub = plugin_stub(short_dir)
        assert len((await stub.ListAndWatch(pb.Empty()).read()).devices) == 8
        s.config_path.write_text("version: v2\n")
        run.reload.set()
        await eventually(
            lambda: events.events,
            "the DevicePluginConfigInvalid event",
            timeout=WAIT,
        )
        assert events.events[-1][1] == "DevicePluginConfigInvalid"
        assert "unknown version 'v2'" in events.events[-1][2]
        assert len((await stub.ListAndWatch(pb.Empty()).read()).devices) == 8
        assert len(kubelet.requests) == 2


async def test_stopping_removes_the_sockets_and_ends_list_and_watch(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    run = Running(manager.Manager(make_settings(short_dir), machine.nvml))
    async with run:
        await kubelet.wait_registered(1)
        stream = plugin_stub(short_dir).ListAndWatch(pb.Empty())
        await stream.read()
    assert not (short_dir / "nvidia-gpu.sock").exists()
    with contextlib.suppress(grpc.aio.AioRpcError):
        assert await within(stream.read(), "the end of ListAndWatch", WAIT) is grpc.aio.EOF


async def test_an_empty_kubelet_socket_serves_without_registering(short_dir: Path) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    s = make_settings(short_dir, kubelet_socket=None)
    async with Running(manager.Manager(s, machine.nvml)) as run:
        await within(run.manager.state.serving.wait(), "the plugin to serve", WAIT)
        devices = (await plugin_stub(short_dir).ListAndWatch(pb.Empty()).read()).devices
        assert len(devices) == 4


async def test_nvml_init_failure_exits_unless_fail_on_init_error_is_false(short_dir: Path) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    machine.fail_next("init", errors.LibraryNotFound, times=None)
    with pytest.raises(manager.InitFailed, match="NVML library not found"):
        await manager.Manager(make_settings(short_dir), machine.nvml).run(install_signals=False)
    s = make_settings(short_dir, {"flags": {"failOnInitError": False}})
    async with Running(manager.Manager(s, machine.nvml)) as run:
        await within(run.manager.state.serving.wait(), "the plugin to serve", WAIT)
        assert "NVML library not found" in (run.manager.state.idle_reason or "")
        assert run.manager.state.servers == []


async def test_a_layout_the_config_rejects_is_fatal(short_dir: Path) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    s = make_settings(short_dir, {"flags": {"migStrategy": "single"}})
    with pytest.raises(manager.FatalError, match="more than one MIG device type"):
        await manager.Manager(s, machine.nvml).run(install_signals=False)


async def test_tegra_discovery_is_refused_rather_than_ignored(short_dir: Path) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    s = make_settings(short_dir, {"flags": {"deviceDiscoveryStrategy": "tegra"}})
    with pytest.raises(
        manager.FatalError, match="deviceDiscoveryStrategy 'tegra' is not supported"
    ):
        await manager.Manager(s, machine.nvml).run(install_signals=False)


async def test_cdi_strategies_write_a_valid_spec_for_every_device(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    (short_dir / "dev-root/dev").mkdir(parents=True)
    (short_dir / "dev-root/dev/nvidiactl").touch()
    lib = short_dir / "driver/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.550.54.15").touch()
    config = {
        "flags": {
            "migStrategy": "mixed",
            "nvidiaDriverRoot": "/run/nvidia/driver",
            "plugin": {
                "deviceListStrategy": ["cdi-cri"],
                "nvidiaCTKPath": "/usr/bin/nvidia-cdi-hook",
            },
        }
    }
    async with Running(manager.Manager(make_settings(short_dir, config), machine.nvml)):
        await kubelet.wait_registered(3)
        spec = json.loads((short_dir / "cdi/k8s.device-plugin.nvidia.com-gpu.json").read_text())
        stub = plugin_stub(short_dir, "nvidia-mig-3g.20gb.sock")
        mig_id = (await stub.ListAndWatch(pb.Empty()).read()).devices[0].ID
        response = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=[mig_id])]
            )
        )
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == 8 + 32 + 1
    assert names[-1] == "all"
    assert mig_id in names
    entry = next(d for d in spec["devices"] if d["name"] == mig_id)
    assert entry["containerEdits"]["deviceNodes"][0]["hostPath"] == "/run/nvidia/driver/dev/nvidia0"
    common = spec["containerEdits"]
    assert common["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"}
    ]
    assert common["mounts"][0]["hostPath"] == (
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    )
    assert common["hooks"][0]["args"] == [
        "nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"
    ]  # fmt: skip
    (container,) = response.container_responses
    assert [c.name for c in container.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={mig_id}"]
    assert dict(container.envs) == {}


MPS_CONFIG = {
    "flags": {"mpsRoot": "/run/nvidia/mps"},
    "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
}


async def test_mps_resources_wait_for_the_control_daemon_and_mount_its_pipe(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    s = make_settings(short_dir, MPS_CONFIG)
    daemons_started = asyncio.Event()
    async with Running(manager.Manager(s, machine.nvml)) as run:
        await asyncio.sleep(0)  # the plugin is now polling for the daemon
        assert kubelet.requests == []
        daemon_stop = asyncio.Event()
        daemon = asyncio.create_task(
            mps_daemon.run(s, machine.nvml, simulated=True, stop=daemon_stop,
                           install_signals=False, started=lambda _d: daemons_started.set())
        )  # fmt: skip
        try:
            await within(daemons_started.wait(), "the MPS daemon to start", WAIT)
            assert await kubelet.wait_registered(1) == ["nvidia.com/gpu"]
            root = s.mps_root_view
            assert json.loads(mps.ready_file(root).read_text())["resources"][0]["replicas"] == 2
            assert mps.started_file(root, "nvidia.com/gpu").exists()
            assert await mps.ask(root, "nvidia.com/gpu", mps.HEALTH_COMMAND) == "50"
            stub = plugin_stub(short_dir)
            ids = [d.ID for d in (await stub.ListAndWatch(pb.Empty()).read()).devices]
            response = await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:1])]
                )
            )
            (c,) = response.container_responses
            assert c.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
            assert [(m.container_path, m.host_path) for m in c.mounts] == [
                ("/mps/nvidia.com/gpu/pipe", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
                ("/dev/shm", "/run/nvidia/mps/shm"),
            ]
            assert run.manager.state.servers
        finally:
            daemon_stop.set()
            await within(daemon, "the MPS daemon to stop", WAIT)
    assert not mps.ready_file(s.mps_root_view).exists()
    assert not mps.started_file(s.mps_root_view, "nvidia.com/gpu").exists()


async def test_the_plugin_refuses_a_daemon_running_another_mps_config(short_dir: Path) -> None:
    s = make_settings(short_dir, MPS_CONFIG)
    root = s.mps_root_view
    root.mkdir(parents=True)
    mps.ready_file(root).write_text(json.dumps({"resources": []}))
    reason = await mps.not_ready(root, "nvidia.com/gpu", s.config)
    assert reason == "MPS daemon runs another sharing.mps configuration"
    mps.write_ready(root, s.config)
    reason = await mps.not_ready(root, "nvidia.com/gpu", s.config)
    assert reason is not None
    assert reason.startswith("MPS daemon is not healthy: no MPS control pipe")


async def test_mount_shm_prepares_the_shm_directory_on_a_simulated_node(short_dir: Path) -> None:
    await mps_daemon.mount_shm(short_dir / "mps", simulated=True)
    assert (short_dir / "mps/shm").is_dir()


async def test_health_endpoint_answers_ok_once_serving(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    m = manager.Manager(make_settings(short_dir), machine.nvml)
    assert endpoint.status(m)[0] == 503
    server = await endpoint.serve(m, 0, "127.0.0.1")
    port = server.sockets[0].getsockname()[1]
    try:
        async with Running(m):
            await kubelet.wait_registered(1)
            await within(m.state.serving.wait(), "the plugin to serve", WAIT)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await within(reader.read(), "the /health answer", WAIT)
            writer.close()
        head, _, body = data.decode().partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 200 OK")
        assert body.startswith("OK\nserving nvidia.com/gpu on ")
    finally:
        server.close()


def test_cli_rejects_a_bad_config_file_with_exit_status_2(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("version: v1\nflags:\n  plugin:\n    deviceListStrategy: [nope]\n")
    result = CliRunner().invoke(
        app,
        ["agent", "device-plugin", "--config-file", str(bad), "--backend", "mock",
         "--machine", "t4x4"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "deviceListStrategy" in result.output


def test_cli_refuses_a_million_replicas_per_gpu_at_once(tmp_path: Path) -> None:
    # The report: 8 GPUs with a million time-slicing replicas each were taken, and the plugin
    # spent minutes and gigabytes building the list. A child process with a deadline, so that
    # a plugin that starts serving instead fails this test rather than hanging it.
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nsharing:\n  timeSlicing:\n    replicas: 1000000\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "agent", "device-plugin", "--config-file",
         str(config), "--backend", "mock", "--machine", "dgx-a100"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "sharing.timeSlicing.replicas: 1,000,000 replicas per GPU is more than the 1,024 "
        "allowed" in result.stderr
    )


def test_cli_env_beats_the_config_file_and_flags_beat_the_env(tmp_path: Path) -> None:
    from gpu_operator.agents.device_plugin import command

    cfg = tmp_path / "config.yaml"
    cfg.write_text("flags:\n  migStrategy: mixed\n  plugin:\n    deviceIDStrategy: index\n")
    opts = command.Options(
        config_file=cfg,
        flags={"mig_strategy": "single", "device_list_strategy": "cdi-annotations,cdi-cri"},
        kubelet_socket="",
    )
    s = command.build_settings(opts)
    assert s.config.flags.mig_strategy.value == "single"
    assert s.config.flags.plugin.device_id_strategy == "index"
    assert s.config.flags.plugin.device_list_strategy == ["cdi-annotations", "cdi-cri"]
    assert s.kubelet_socket is None


def test_cli_reports_an_unknown_mock_machine(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["agent", "device-plugin", "--backend", "mock", "--machine", "nope"]
    )
    assert result.exit_code == 2
    assert "unknown machine 'nope'" in result.output


def test_cli_mps_control_daemon_mount_shm_on_the_mock(short_dir: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["agent", "mps-control-daemon", "mount-shm", "--backend", "mock", "--machine", "t4x4",
         "--mps-root-view", str(short_dir)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (short_dir / "shm").is_dir()


async def wait_until(predicate: Any, what: str, timeout: float = WAIT, state: Any = None) -> None:
    """Poll a condition of another process (a file appearing) until it holds or time runs out."""
    await eventually(predicate, what, timeout=timeout, state=state)


async def test_the_command_serves_reloads_on_sighup_and_cleans_up_on_sigterm(
    short_dir: Path,
) -> None:
    import signal
    import sys

    binary = Path(sys.executable).parent / "gpu-operator"
    proc = await asyncio.create_subprocess_exec(
        str(binary), "agent", "device-plugin", "--backend", "mock", "--machine", "t4x4",
        "--kubelet-socket", "", "--device-plugin-path", str(short_dir),
        "--cdi-root", str(short_dir / "cdi"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            lines.append(line.decode())

    def served(times: int) -> bool:
        return sum("serving nvidia.com/gpu on" in line for line in lines) >= times

    reader = asyncio.create_task(read())
    socket = short_dir / "nvidia-gpu.sock"
    try:
        await wait_until(lambda: served(1), "the plugin to serve", state=lambda: lines)
        assert socket.is_socket()
        proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: served(2), "the plugin to serve again", state=lambda: lines)
        proc.send_signal(signal.SIGTERM)
        await within(proc.wait(), "the command to exit on SIGTERM", WAIT)
        await within(reader, "the end of the command's output", WAIT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = "".join(lines)
    assert proc.returncode == 0, log
    assert not socket.exists()
    assert "Received SIGHUP: reloading the configuration" in log
    assert "stopped 1 plugin(s)" in log


def test_container_env_reads_booleans_like_go_and_beats_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("flags:\n  plugin:\n    passDeviceSpecs: false\n")
    env = {
        "CONFIG_FILE": "/config.yaml",
        "PASS_DEVICE_SPECS": "TRUE",
        "FAIL_ON_INIT_ERROR": "0",
        "DEVICE_LIST_STRATEGY": "envvar, volume-mounts",
        "KUBELET_SOCKET": "",
        "DP_DISABLE_HEALTHCHECKS": "48",
    }
    s = dp_settings.from_environment(env, lambda p: tmp_path / p.lstrip("/"))
    assert s.config.flags.plugin.pass_device_specs is True
    assert s.config.flags.fail_on_init_error is False
    assert s.config.flags.plugin.device_list_strategy == ["envvar", "volume-mounts"]
    assert s.kubelet_socket is None
    assert not s.health_policy.is_fatal(48)
    assert s.driver_root_view == tmp_path / "driver-root"
    with pytest.raises(dp_settings.pc.ConfigError, match="PASS_DEVICE_SPECS: invalid boolean 'yes"):
        dp_settings.options_from_env({"PASS_DEVICE_SPECS": "yes please"})


async def test_stopping_while_waiting_for_an_mps_daemon_does_not_wait_for_it(
    short_dir: Path,
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    s = make_settings(short_dir, MPS_CONFIG, mps_wait_timeout=3600.0)
    m = manager.Manager(s, machine.nvml)
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop=stop, install_signals=False))
    await wait_until(lambda: m.state.starts == 1, "the first start", state=lambda: m.state.starts)
    stop.set()
    await within(task, "the manager to stop", WAIT)
    assert m.state.servers == []


async def test_required_imex_channels_must_exist_and_present_ones_are_injected(
    short_dir: Path, kubelet: FakeKubelet
) -> None:
    machine = mock.MockMachine.from_preset("t4x4")
    config = {"imex": {"channelIDs": [0], "required": True}}
    s = make_settings(short_dir, config, retry_interval=3600.0)
    async with Running(manager.Manager(s, machine.nvml)) as run:
        await wait_until(lambda: run.manager.state.last_error is not None, "the IMEX error")
        assert run.manager.state.last_error == "IMEX channels ['0'] are required but not present"
        assert run.manager.state.servers == []
        assert endpoint.status(run.manager)[1].startswith("not serving: IMEX channels")
    channel = short_dir / "dev-root/dev/nvidia-caps-imex-channels/channel0"
    channel.parent.mkdir(parents=True)
    channel.touch()
    async with Running(manager.Manager(s, machine.nvml)):
        await kubelet.wait_registered(1)
        stub = plugin_stub(short_dir)
        ids = [d.ID for d in (await stub.ListAndWatch(pb.Empty()).read()).devices]
        response = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:1])]
            )
        )
        assert response.container_responses[0].envs["NVIDIA_IMEX_CHANNELS"] == "0"
