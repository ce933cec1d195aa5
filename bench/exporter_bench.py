"""The metrics exporter under load: scrape latency, memory and CPU per scrape (figures only).

Run: .venv/bin/python bench/exporter_bench.py [--scrapes N] [--machine PRESET]

The exporter runs as its own process (`python -m gpu_operator.agents.dcgm_exporter --backend
mock`, the flags of `gpu-operator agent dcgm-exporter`) on an
8-GPU node with the default counters and pod attribution on; a fake kubelet in this process
answers the pod-resources `List` with 30 GPU pods (time-sliced: several pods per GPU, the case
where upstream duplicates work per scrape). Prints scrape latency p50/p99 over HTTP (target p99
<= 10 ms), the exporter's RSS (target <= 60 MB; dcgm-exporter is reported at 400-512 MiB), CPU
time per scrape, and the cost of one collection (what runs every interval, off the scrape path).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from grpc import aio

from gpu_operator.agents.dcgm_exporter import collector, exposition, podresources
from gpu_operator.nvml import mock
from kubeletapi.podresources.v1 import api_pb2 as pr
from kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

PODS = 30
CLK_TCK = os.sysconf("SC_CLK_TCK")


def device_ids(machine: mock.MockMachine) -> tuple[str, list[str]]:
    """The resource and one device id per pod: MIG devices where the GPUs have them, else
    time-sliced replicas of the whole GPUs (several pods per GPU)."""
    lib = machine.nvml()
    lib.init()
    migs = []
    for i in range(lib.device_count()):
        gpu = lib.device_by_index(i)
        for j in range(gpu.max_mig_device_count()):
            migs.append(gpu.mig_device_by_index(j))
    if migs:
        profile = migs[0].name().rsplit(" ", 1)[1]
        return f"nvidia.com/mig-{profile}", [migs[i % len(migs)].uuid() for i in range(PODS)]
    uuids = [g.uuid for g in machine.gpus]
    return "nvidia.com/gpu", [f"{uuids[i % len(uuids)]}::{i}" for i in range(PODS)]


class Kubelet(pr_grpc.PodResourcesListerServicer):
    """Answers List with `PODS` pods, one device each."""

    def __init__(self, resource: str, ids: list[str]) -> None:
        pods = []
        for i, device_id in enumerate(ids):
            devices = [pr.ContainerDevices(resource_name=resource, device_ids=[device_id])]
            container = pr.ContainerResources(name="main", devices=devices)
            pods.append(
                pr.PodResources(name=f"job-{i:02d}", namespace="ml", containers=[container])
            )
        self.response = pr.ListPodResourcesResponse(pod_resources=pods)

    async def List(
        self, request: pr.ListPodResourcesRequest, context: aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        return self.response


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_stats(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS bytes, anonymous RSS bytes) of a process from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    sizes = {"VmRSS:": 0, "RssAnon:": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(" ", 1)[0].split("\t", 1)[0]
        if key in sizes:
            sizes[key] = int(line.split()[1]) * 1024
    return cpu, sizes["VmRSS:"], sizes["RssAnon:"]


def collection_ms(machine_name: str, resource: str, ids: list[str], rounds: int = 50) -> float:
    """Median time of one collection (NVML reads + attribution + rendering), in process."""
    allocations = [
        podresources.Allocation("ml", f"job-{i:02d}", "main", resource, device_id)
        for i, device_id in enumerate(ids)
    ]
    mapper = podresources.PodMapper(lambda: asyncio.sleep(0, allocations))  # type: ignore[arg-type,return-value]
    mapper.current = tuple(allocations)
    logging.getLogger("gpu_operator.agents.dcgm_exporter").setLevel(logging.ERROR)
    machine = mock.MockMachine.from_preset(machine_name)
    c = collector.Collector(
        machine.nvml, collector.Settings(options=exposition.Options(hostname="bench")), mapper
    )
    c.start()
    try:
        samples = []
        for _ in range(rounds):
            start = time.perf_counter()
            c.render_once()
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        c.stop()
    return statistics.median(samples)


async def run(args: argparse.Namespace) -> None:
    machine = mock.MockMachine.from_preset(args.machine)
    resource, ids = device_ids(machine)
    with tempfile.TemporaryDirectory(prefix="xb") as tmp:
        sock = Path(tmp) / "kubelet.sock"
        server = aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(Kubelet(resource, ids), server)
        server.add_insecure_port(f"unix://{sock}")
        await server.start()
        port = free_port()
        # The exporter's own entry point (`gpu-operator agent dcgm-exporter` takes the same
        # flags but also loads the rest of the command line: CRD models and all).
        command = [sys.executable, "-m", "gpu_operator.agents.dcgm_exporter"]
        proc = await asyncio.create_subprocess_exec(
            *command, "--backend", "mock", "--machine", args.machine,
            "-a", f"127.0.0.1:{port}", "-k", "--pod-resources-kubelet-socket", str(sock),
            env={**os.environ, "NODE_NAME": "bench-node"},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            async with aiohttp.ClientSession() as http:
                body = ""
                for _ in range(200):  # the port opens after the first collection
                    try:
                        async with http.get(url) as resp:
                            body = await resp.text()
                        if 'pod="job-' in body:
                            break
                    except aiohttp.ClientConnectorError:
                        pass
                    await asyncio.sleep(0.05)
                for _ in range(50):  # warm-up
                    async with http.get(url) as resp:
                        await resp.read()
                cpu_before, _, _ = proc_stats(proc.pid)
                latencies = []
                for _ in range(args.scrapes):
                    start = time.perf_counter()
                    async with http.get(url) as resp:
                        await resp.read()
                    latencies.append((time.perf_counter() - start) * 1000)
                cpu_after, rss, anon = proc_stats(proc.pid)
        finally:
            proc.terminate()
            await proc.wait()
            await server.stop(None)
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    attributed = body.count('pod="job-')
    print(
        f"machine {args.machine}: {len(machine.gpus)} GPUs, default counters, {PODS} GPU pods"
        f" ({resource})"
    )
    print(f"  /metrics body: {len(body)} bytes, {samples} samples, {attributed} attributed")
    print(f"  scrape latency over HTTP ({args.scrapes} scrapes): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
          " (target p99 <= 10 ms)")  # fmt: skip
    print(f"  exporter RSS: {rss / 2**20:.1f} MiB (target <= 60 MB)")
    print(
        f"    RssAnon {anon / 2**20:.1f} MiB; the mock GPU layer (and its pydantic machine"
        " models) is loaded here, a real-GPU exporter loads nvidia-ml-py instead"
    )
    print(f"  exporter CPU per scrape: {(cpu_after - cpu_before) / args.scrapes * 1000:.3f} ms")
    collection = collection_ms(args.machine, resource, ids)
    print(f"  one collection (every interval, not per scrape): {collection:.2f} ms")
    figures = {
        "scrape_p50_ms": p50,
        "scrape_p99_ms": p99,
        "rss_mib": rss / 2**20,
        "cpu_ms_per_scrape": (cpu_after - cpu_before) / args.scrapes * 1000,
        "collection_ms": collection,
    }
    config = {"scrapes": args.scrapes, "machine": args.machine}
    history.append("exporter", figures, config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--machine", default="dgx-a100")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
