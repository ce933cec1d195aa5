"""kubesim's scheduler at scale: time to bind pods on a 5,000-node cluster, the cost of an attempt
that fails on every node, and status writes per pod in instant mode.

Run: .venv/bin/python bench/kubesim_scheduler_bench.py [--nodes 5000] [--pods 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import kubesim
from kubesim import KubeletConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there


def pod(name: str, gpus: int = 0, cpu: str = "500m") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "256Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}
            ]
        },
    }


async def main(nodes: int, pods: int) -> None:
    config = KubeletConfig(instant=True, lease_interval=None)
    async with kubesim.Cluster(kubelet=config, events=False) as sim:
        began = time.perf_counter()
        for index in range(nodes):
            capacity = {"nvidia.com/gpu": "8"} if index % 4 == 0 else None
            sim.add_node(f"node-{index:05d}", capacity=capacity)
        await sim.settle(timeout=600)
        print(f"nodes: {nodes} added in {time.perf_counter() - began:.2f}s")

        writes = 0

        def count(event: Any) -> None:
            nonlocal writes
            if event.key == ("", "pods") and event.type == "MODIFIED":
                writes += 1

        sim.store.subscribe(count)
        began = time.perf_counter()
        for index in range(pods):
            sim.store.create(pod(f"p-{index}", gpus=1 if index % 2 else 0))
        await sim.settle(timeout=600)
        elapsed = time.perf_counter() - began
        per_pod = elapsed / pods
        bound = sum(1 for p in sim.store.list("pods", "default") if p["spec"].get("nodeName"))
        print(
            f"pods: {bound}/{pods} bound and running in {elapsed:.2f}s "
            f"({elapsed / pods * 1000:.2f} ms per pod, {writes / pods:.2f} writes per pod "
            "incl. the binding)"
        )

        scheduler = sim.controllers["scheduler"]
        began = time.perf_counter()
        sim.store.create(pod("impossible", cpu="64"))
        await sim.settle(timeout=600)
        elapsed = time.perf_counter() - began
        assert ("default", "impossible") in getattr(scheduler, "unschedulable", set())
        print(f"one attempt rejected by all {nodes} nodes: {elapsed * 1000:.1f} ms")
        figures = {
            "ms_per_pod": per_pod * 1000,
            "writes_per_pod": writes / pods,
            "rejected_by_all_ms": elapsed * 1000,
        }
        history.append("kubesim_scheduler", figures, config={"nodes": nodes, "pods": pods})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.pods))
