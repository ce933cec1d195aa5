"""kubesim's DRA at scale: 1,000 nodes with 8 devices each (ResourceSlices published by hand, the
attributes a GPU driver publishes), 2,000 ResourceClaims with CEL selectors (half generated from
ResourceClaimTemplates, half created directly), one pod per claim, all scheduled.

Figures: claims allocated per second (first pod created -> last claim allocated), the scheduler's
latency per pod (pod created -> bound) p50/p99 in the burst, the process's CPU seconds, and how
many CEL evaluations the verdict cache let through. Recorded in bench/history.jsonl
(bench/history.py). Run:

    .venv/bin/python bench/kubesim_dra_bench.py [--nodes 1000] [--claims 2000] [--profile N]

`--profile N` prints cProfile's top N functions of the scheduling phase (the figures of a profiled
run are recorded under their own config).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import history  # bench/history.py, next to this script

import kubesim
from kubesim import KubeletConfig, dra_cel

DRIVER = "gpu.example.com"
PRODUCTS = (
    ("NVIDIA H100 80GB HBM3", "80Gi"),
    ("NVIDIA A100-SXM4-40GB", "40Gi"),
)
NAMESPACE = "default"
# The selectors the claims use, in turn (the class adds `device.driver == ...`).
SELECTORS = (
    f'device.attributes["{DRIVER}"].productName == "NVIDIA H100 80GB HBM3"',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
    f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA A100")'
    f' && device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("550.0.0"))',
)


def resource_slice(node: str, index: int, devices: int) -> dict[str, Any]:
    product, memory = PRODUCTS[index % len(PRODUCTS)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{d}",
                    "attributes": {
                        "index": {"int": d},
                        "uuid": {"string": f"GPU-{index:05d}{d:03d}-0000-0000-0000-000000000000"},
                        "productName": {"string": product},
                        "architecture": {"string": "Hopper" if memory == "80Gi" else "Ampere"},
                        "driverVersion": {"version": "580.95.5"},
                        "cudaComputeCapability": {"version": "9.0.0"},
                        "brand": {"string": "Nvidia"},
                        "type": {"string": "gpu"},
                    },
                    "capacity": {"memory": {"value": memory}},
                }
                for d in range(devices)
            ],
        },
    }


def claim_spec(index: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": DRIVER,
                        "selectors": [{"cel": {"expression": SELECTORS[index % len(SELECTORS)]}}],
                    },
                }
            ]
        }
    }


def pod(index: int, *, template: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "gpu"}
    if template:
        entry["resourceClaimTemplateName"] = f"tpl-{index % len(SELECTORS)}"
    else:
        entry["resourceClaimName"] = f"claim-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{index}", "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [entry],
        },
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


async def run(nodes: int, devices: int, claims: int, profile: int) -> dict[str, Any]:
    # No DRA driver runs here: the kubelets retry preparing (FailedPrepareDynamicResources) and
    # their plugin watchers look at plugins_registry once a second instead of every 50 ms (a
    # real kubelet is told by inotify), so the figures are the control plane's.
    config = KubeletConfig(instant=True, lease_interval=None, dra_plugin_watch_interval=1.0)
    async with kubesim.Cluster(kubelet=config, events=False) as sim:
        began = time.perf_counter()
        for index in range(nodes):
            sim.add_node(f"node-{index:05d}")
        await sim.settle(timeout=900)
        store = sim.store
        store.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            }
        )
        for index in range(len(SELECTORS)):
            store.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"tpl-{index}", "namespace": NAMESPACE},
                    "spec": {"spec": claim_spec(index)},
                }
            )
        for index in range(nodes):
            store.create(resource_slice(f"node-{index:05d}", index, devices))
        # Half the claims are created directly, half come from templates.
        direct = [i for i in range(claims) if i % 2]
        for index in direct:
            store.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": f"claim-{index}", "namespace": NAMESPACE},
                    "spec": claim_spec(index),
                }
            )
        await sim.settle(timeout=900)
        setup_s = time.perf_counter() - began
        print(f"set-up: {nodes} nodes, {nodes} slices x {devices} devices in {setup_s:.1f}s")

        created: dict[str, float] = {}
        bound: dict[str, float] = {}
        allocated: list[float] = []

        def watch(event: Any) -> None:
            obj = event.new.obj
            if event.key == ("", "pods") and event.type == "MODIFIED":
                name = obj["metadata"]["name"]
                if obj["spec"].get("nodeName") and name not in bound:
                    bound[name] = time.perf_counter()
            elif event.key == ("resource.k8s.io", "resourceclaims"):
                old = event.old.obj if event.old is not None else {}
                if (obj.get("status") or {}).get("allocation") and not (
                    old.get("status") or {}
                ).get("allocation"):
                    allocated.append(time.perf_counter())

        store.subscribe(watch)
        evaluations_before = dra_cel.EVALUATIONS.count
        profiler = cProfile.Profile() if profile else None
        cpu0 = time.process_time()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        for index in range(claims):
            created[f"p-{index}"] = time.perf_counter()
            store.create(pod(index, template=index % 2 == 0))
        await sim.settle(timeout=1800)
        if profiler is not None:
            profiler.disable()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        latencies = [bound[n] - created[n] for n in created if n in bound]
        last = max(allocated) if allocated else start
        result = {
            "nodes": nodes,
            "devices": nodes * devices,
            "claims": claims,
            "allocated": len(allocated),
            "bound": len(bound),
            "elapsed_s": elapsed,
            "allocate_s": last - start,
            "cpu_s": cpu,
            "claims_per_s": len(allocated) / (last - start) if allocated else 0.0,
            "p50_ms": percentile(latencies, 0.50) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000,
            "cel_evaluations": dra_cel.EVALUATIONS.count - evaluations_before,
            "load": [round(v, 2) for v in os.getloadavg()],
        }
        if profiler is not None:
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(profile)
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    result = asyncio.run(run(args.nodes, args.devices, args.claims, args.profile))
    print(
        f"claims: {result['allocated']}/{result['claims']} allocated, {result['bound']} pods bound "
        f"in {result['allocate_s']:.1f}s ({result['claims_per_s']:.0f} claims/s; "
        f"{result['cpu_s']:.1f} CPU s); scheduler latency (pod created -> bound, all pods "
        f"created at once) p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms; "
        f"CEL evaluations {result['cel_evaluations']} for {result['devices']} devices; "
        f"load {result['load']}"
    )
    history.append(
        "kubesim_dra",
        {
            "claims_per_s": round(result["claims_per_s"], 1),
            "allocate_s": round(result["allocate_s"], 2),
            "cpu_s": round(result["cpu_s"], 2),
            "latency_p50_ms": round(result["p50_ms"], 1),
            "latency_p99_ms": round(result["p99_ms"], 1),
            "cel_evaluations": result["cel_evaluations"],
        },
        config={
            "nodes": args.nodes,
            "devices_per_node": args.devices,
            "claims": args.claims,
            **({"profiled": True} if args.profile else {}),
        },
        higher_is_better=["claims_per_s"],
    )
    return 0 if result["allocated"] == result["claims"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
