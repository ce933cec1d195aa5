"""kubesim performance: GET and merge-patch rates, 5,000-node list, watch fan-out, memory.

Run: `.venv/bin/python bench/kubesim_bench.py`. The server runs in a child process (`kubesim serve`)
so client and server do not share an interpreter; prints numbers, asserts nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import aiohttp

NODES = 5_000
REQUESTS = 4_000
CONCURRENCY = 8
WATCHERS = 20


async def throughput(
    session: aiohttp.ClientSession, method: str, make_path, body: bytes | None, ctype: str
) -> float:
    counter = iter(range(REQUESTS))

    async def worker() -> None:
        for index in counter:
            async with session.request(
                method, make_path(index), data=body, headers={"Content-Type": ctype}
            ) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return REQUESTS / (time.perf_counter() - start)


async def watch_fanout(session: aiohttp.ClientSession) -> list[float]:
    """Milliseconds from a write's response until all watchers have its event, per trial."""
    path = "/api/v1/namespaces/default/configmaps"
    await session.post(
        path, json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fan"}}
    )
    results = []
    streams = []
    for _ in range(WATCHERS):
        resp = await session.get(path, params={"watch": "true", "resourceVersion": "0"})
        await resp.content.readline()  # initial ADDED
        streams.append(resp)
    for trial in range(20):
        start = time.perf_counter()
        patch = json.dumps({"data": {"n": str(trial)}}).encode()
        async with session.patch(
            f"{path}/fan", data=patch, headers={"Content-Type": "application/merge-patch+json"}
        ) as r:
            await r.read()
        await asyncio.gather(*(s.content.readline() for s in streams))
        results.append((time.perf_counter() - start) * 1000)
    for resp in streams:
        resp.close()
    return results


def memory_overhead() -> tuple[float, float]:
    """Bytes per stored node (dict, cached JSON, indexes, history): total and beyond JSON."""
    from kubesim.controllers.kubelet import Kubelet, KubeletConfig
    from kubesim.store import Store

    store = Store()
    kubelet = Kubelet(store, KubeletConfig(instant=True, lease_interval=None))
    rt = store.registry.resolve("nodes")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for index in range(NODES):
        store.insert(rt, kubelet.node_object(f"node-{index}"))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    json_bytes = sum(len(s.raw) for _, s in store.iter_all())
    per_object = (after - before) / NODES
    return per_object, per_object - json_bytes / NODES


async def main() -> None:
    exe = Path(sys.executable).parent / "kubesim"
    proc = await asyncio.create_subprocess_exec(
        str(exe),
        "serve",
        "--nodes",
        str(NODES),
        "--instant",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    url = (await proc.stdout.readline()).decode().strip()
    try:
        connector = aiohttp.TCPConnector(limit=CONCURRENCY + WATCHERS + 4)
        async with aiohttp.ClientSession(base_url=url, connector=connector) as session:
            get_rate = await throughput(
                session,
                "GET",
                lambda i: f"/api/v1/nodes/node-{i % NODES + 1}",
                None,
                "application/json",
            )
            patch = json.dumps({"metadata": {"labels": {"bench": "1"}}}).encode()
            patch_rate = await throughput(
                session,
                "PATCH",
                lambda i: f"/api/v1/nodes/node-{i % NODES + 1}",
                patch,
                "application/merge-patch+json",
            )
            timings = []
            for _ in range(5):
                start = time.perf_counter()
                async with session.get("/api/v1/nodes") as resp:
                    body = await resp.read()
                timings.append((time.perf_counter() - start) * 1000)
                assert len(json.loads(body)["items"]) == NODES
            fanout = await watch_fanout(session)
    finally:
        proc.terminate()
        await proc.wait()
    total, overhead = memory_overhead()
    fanout.sort()
    print(
        f"objects stored: {NODES} nodes (+ leases), server in a child process, "
        f"client concurrency {CONCURRENCY}"
    )
    print(f"GET node:               {get_rate:8.0f} req/s   (target >= 2000)")
    print(f"merge-patch node:       {patch_rate:8.0f} req/s   (target >= 2000)")
    print(
        f"list 5,000 nodes:       {min(timings):8.1f} ms best, "
        f"{sorted(timings)[len(timings) // 2]:.1f} ms median   (target <= 200)"
    )
    print(
        f"write -> {WATCHERS} watchers:   {fanout[len(fanout) // 2]:8.2f} ms median, "
        f"{fanout[-1]:.2f} ms max   (target <= 10)"
    )
    print(f"memory per node:        {total:8.0f} B traced, {overhead:.0f} B beyond its JSON size")
    print(f"cpu count: {os.cpu_count()}")


if __name__ == "__main__":
    asyncio.run(main())
