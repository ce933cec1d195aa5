"""The device plugin's figures: Allocate latency over the real socket (target p99 <= 2 ms), the
time from an injected XID to the kubelet seeing the device unhealthy (target <= 100 ms), and the
agent's resident memory.

Run: .venv/bin/python bench/device_plugin_bench.py [--allocations N] [--faults N]
Prints figures; asserts nothing. Allocate goes through a gRPC client on the plugin's unix socket
(one GPU per call on a dgx-a100 mock). The XID figure runs the plugin against kubesim's kubelet
(its device manager over real sockets) and times from `inject_xid` to the node's allocatable
dropping in the store, which the device manager writes once ListAndWatch tells it, then from
`reset` to it rising again (on an R570 driver: see `RECOVERY_DRIVER`). RSS is the
`gpu-operator agent device-plugin` process serving a dgx-a100 mock, read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

import kubesim
from gpu_operator.agents.device_plugin import manager as dp_manager
from gpu_operator.agents.device_plugin import settings as dp_settings
from gpu_operator.nvml import mock
from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

ROOT = Path(__file__).resolve().parents[1]
GPU = "nvidia.com/gpu"
# A driver with NVML's GPU recovery-action field (R565+), for the XID/reset rounds.
RECOVERY_DRIVER = "570.195.03"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _settings(base: Path, kubelet_socket: Path | None) -> dp_settings.Settings:
    plugin_dir = kubelet_socket.parent if kubelet_socket is not None else base / "plugins"
    plugin_dir.mkdir(parents=True, exist_ok=True)
    settings = dp_settings.build(
        None,
        {},
        kubelet_socket=kubelet_socket,
        plugin_dir=plugin_dir,
        cdi_root=base / "cdi",
        driver_root_view=base / "driver",
        dev_root_view=base,
        sys_root=base,
        mps_root_view=base / "mps",
    )
    # Recovery probes every 0.1 s so the fault rounds are short (the agent's default is 1 s).
    settings.recheck_interval = 0.1
    return settings


@contextlib.asynccontextmanager
async def running(manager: dp_manager.Manager) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.ensure_future(manager.run(stop=stop, install_signals=False))
    waiter = asyncio.ensure_future(manager.state.serving.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when="FIRST_COMPLETED")
    if waiter not in done:
        waiter.cancel()
        raise RuntimeError(f"the plugin did not start: {task.exception() if task.done() else ''}")
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def allocate_latency(count: int) -> list[float]:
    """Seconds per Allocate call of one GPU, over the plugin's socket."""
    base = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    try:
        machine = mock.MockMachine.from_preset("dgx-a100", seed=1)
        manager = dp_manager.Manager(_settings(base, None), machine.nvml)
        async with running(manager):
            server = manager.state.servers[0]
            ids = [d.id for d in server.resource.devices]
            async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                samples = []
                for i in range(count + 200):
                    request = pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[i % 8]])]
                    )
                    start = time.perf_counter()
                    await stub.Allocate(request)
                    if i >= 200:  # the first calls warm up the channel
                        samples.append(time.perf_counter() - start)
                return samples
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def xid_to_kubelet(rounds: int) -> tuple[list[float], list[float]]:
    """(XID -> node allocatable drops, reset -> allocatable back) in seconds, per round."""
    base = Path(tempfile.mkdtemp(prefix="dpx-", dir="/tmp"))
    detected: list[float] = []
    recovered: list[float] = []
    try:
        async with kubesim.Cluster(work_dir=base / "sim", events=False) as sim:
            sim.add_node("gpu-1")
            await sim.start_device_manager("gpu-1")
            socket = sim.node_root("gpu-1") / "var/lib/kubelet/device-plugins/kubelet.sock"
            # The plugin clears an XID only when the driver had asked for a reset and no longer
            # does; that recovery-action field exists from R565 on, and dgx-a100 ships R550
            # (where an XID 48 stays until the plugin restarts, as upstream), so the rounds run
            # the same GPUs on an R570 driver.
            machine = mock.MockMachine.from_preset("dgx-a100", seed=1, driver=RECOVERY_DRIVER)
            manager = dp_manager.Manager(_settings(base / "plugin", socket), machine.nvml)
            async with running(manager):

                def allocatable() -> str | None:
                    node = sim.store.get("nodes", "gpu-1") or {}
                    return ((node.get("status") or {}).get("allocatable") or {}).get(GPU)

                await sim.wait_for(lambda: allocatable() == "8", 10, "8 GPUs advertised")

                async def timed(action: Callable[[], None], target: str) -> float:
                    """Seconds from `action` to the store holding allocatable == target."""
                    changed = asyncio.Event()
                    stamp: list[float] = []

                    def watch(_event: object) -> None:
                        if not stamp and allocatable() == target:
                            stamp.append(time.perf_counter())
                            changed.set()

                    unsubscribe = sim.store.subscribe(watch)
                    try:
                        start = time.perf_counter()
                        action()
                        await asyncio.wait_for(changed.wait(), 10)
                    finally:
                        unsubscribe()
                    return stamp[0] - start

                for i in range(rounds):
                    gpu = i % 8
                    detected.append(
                        await timed(functools.partial(machine.inject_xid, gpu, 48), "7")
                    )
                    recovered.append(await timed(functools.partial(machine.reset, gpu), "8"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return detected, recovered


def agent_rss_mib() -> float | None:
    """VmRSS of `gpu-operator agent device-plugin` serving a dgx-a100 mock (no kubelet)."""
    base = Path(tempfile.mkdtemp(prefix="dpr-", dir="/tmp"))
    plugins = base / "plugins"
    plugins.mkdir()
    command = [
        str(ROOT / ".venv" / "bin" / "gpu-operator"), "agent", "device-plugin",
        "--backend", "mock", "--machine", "dgx-a100",
        "--kubelet-socket", "", "--device-plugin-path", str(plugins),
        "--cdi-root", str(base / "cdi"),
    ]  # fmt: skip
    if not Path(command[0]).exists():
        command[0:1] = [sys.executable, "-m", "gpu_operator.cli"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (plugins / "nvidia-gpu.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--allocations", type=int, default=2000)
    parser.add_argument("--faults", type=int, default=20)
    args = parser.parse_args()
    # The agent logs every health change; the figures are what this prints.
    logging.getLogger("gpu_operator").setLevel(logging.ERROR)

    latencies = asyncio.run(allocate_latency(args.allocations))
    ms = [s * 1000 for s in latencies]
    print(f"Allocate over the socket ({len(ms)} calls, 1 GPU each):")
    print(f"  p50 {percentile(ms, 50):.3f} ms   p99 {percentile(ms, 99):.3f} ms   "
          f"max {max(ms):.3f} ms   (target p99 <= 2 ms)")  # fmt: skip

    detected, recovered = asyncio.run(xid_to_kubelet(args.faults))
    d = [s * 1000 for s in detected]
    r = [s * 1000 for s in recovered]
    print(f"XID 48 -> kubelet marks the GPU unhealthy (node allocatable 8 -> 7), {len(d)} rounds:")
    print(f"  median {statistics.median(d):.1f} ms   p90 {percentile(d, 90):.1f} ms   "
          f"max {max(d):.1f} ms   (target <= 100 ms)")  # fmt: skip
    print("GPU reset -> healthy again (allocatable 7 -> 8), probes every 0.1 s:")
    print(f"  median {statistics.median(r):.1f} ms   max {max(r):.1f} ms")

    rss = agent_rss_mib()
    if rss is None:
        print("agent RSS: the agent did not start (see `gpu-operator agent device-plugin`)")
    else:
        print(f"agent RSS serving 8 GPUs: {rss:.1f} MiB")
    figures = {
        "allocate_p50_ms": percentile(ms, 50),
        "allocate_p99_ms": percentile(ms, 99),
        "xid_to_unhealthy_median_ms": statistics.median(d),
        "reset_to_healthy_median_ms": statistics.median(r),
    }
    if rss is not None:
        figures["agent_rss_mib"] = rss
    config = {"allocations": args.allocations, "faults": args.faults, "driver": RECOVERY_DRIVER}
    history.append("device_plugin", figures, config=config)


if __name__ == "__main__":
    main()
