"""Our GPU DRA kubelet plugin at scale, in one process: ResourceSlices published for 1,000 nodes x
8 GPUs and 1,000 claims prepared.

Publishing: per node, the plugin's planners (`slices.devices` from an NVML inventory of a mock
DGX A100, then `slices.plan`) and the slice written to kubesim's API store, as `Plugin.publish`
does on each node. Preparing: 1,000 allocated ResourceClaims (one GPU each, spread over the
nodes; every 10th time-sliced through a GpuConfig), each through `prepare.plan`, the CDI spec
written and its node's checkpoint saved twice (PrepareStarted, PrepareCompleted), as
`Plugin._prepare` does; the gRPC hop and the API read of the claim are left out (kubesim's DRA
manager bench covers the kubelet side). The NVML inventory is read once per distinct machine
(8 seeds), since every node of a real fleet reads its own GPUs in parallel.

Figures: slices published per second and devices per second, CPU seconds of each phase, prepare
latency p50/p99 (ms). Recorded in bench/history.jsonl (bench/history.py). Run:

    .venv/bin/python bench/dra_plugin_bench.py [--nodes 1000] [--claims 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import history  # bench/history.py, next to this script

import kubesim
from gpu_operator.agents import cdi as common
from gpu_operator.agents.dra_kubelet_plugin import checkpoint, gpuconfig, prepare, slices
from gpu_operator.agents.dra_kubelet_plugin.inventory import Inventory, collect
from gpu_operator.nvml import mock

MACHINE = "dgx-a100"
SEEDS = 8
NAMESPACE = "default"
SLICED = {
    "opaque": {
        "driver": slices.DRIVER,
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        },
    },
    "requests": ["gpu"],
}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def inventories(root: Path) -> list[Inventory]:
    found = []
    for seed in range(SEEDS):
        machine = mock.MockMachine.from_preset(MACHINE, seed=seed)
        lib = machine.nvml()
        lib.init()
        try:
            found.append(collect(lib, driver_root=root, sys_root=root, proc_root=root))
        finally:
            lib.shutdown()
    return found


def claim(index: int, node: str, device: str) -> dict[str, Any]:
    allocation: dict[str, Any] = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": slices.DRIVER, "pool": node, "device": device}
            ],
        }
    }
    if index % 10 == 0:
        allocation["devices"]["config"] = [{"source": "FromClaim", **SLICED}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"claim-{index}", "namespace": NAMESPACE, "uid": f"uid-{index:06d}"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": allocation},
    }


async def run(nodes: int, claims: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dra-plugin-bench-"))
    invs = inventories(work)
    gates = {**gpuconfig.DEFAULT_GATES, gpuconfig.TIME_SLICING_GATE: True}
    async with kubesim.Cluster(events=False) as sim:
        store = sim.store
        names = [f"node-{i:05d}" for i in range(nodes)]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        published_slices = devices_total = 0
        for index, node in enumerate(names):
            devices = slices.devices(invs[index % SEEDS])
            _generation, wanted = slices.plan(node, [], devices, 0)
            for item in wanted:
                store.create(item)
            published_slices += len(wanted)
            devices_total += len(devices)
        publish_s = time.perf_counter() - wall0
        publish_cpu = time.process_time() - cpu0
        assert len(store.list("resourceslices")) == published_slices

        cdi_root = work / "cdi"
        cdi_root.mkdir()
        # Each node's plugin keeps its own checkpoint (its node's claims only).
        states: dict[int, checkpoint.Checkpoint] = {}
        published = [slices.allocatable(inv) for inv in invs]
        latencies: list[float] = []
        cpu1 = time.process_time()
        for index in range(claims):
            node_index, gpu = divmod(index, 8)
            node_index %= nodes
            inv = invs[node_index % SEEDS]
            obj = claim(index, names[node_index], f"gpu-{gpu}")
            point = work / f"checkpoint-{node_index}.json"
            state = states.get(node_index, checkpoint.Checkpoint())
            began = time.perf_counter()
            plan = prepare.plan(obj, published[node_index % SEEDS], inv, gates)
            uid = plan.claim_uid
            record = checkpoint.Claim(
                state=checkpoint.PREPARE_STARTED,
                name=plan.name,
                namespace=plan.namespace,
                devices=tuple(
                    checkpoint.Device(d.request, d.pool, d.device, d.uuid, d.cdi_ids)
                    for d in plan.devices
                ),
                time_sliced=tuple(a.uuid for a in plan.sharing),
            )
            state = checkpoint.Checkpoint(state.boot_id, {**state.claims, uid: record})
            checkpoint.save(point, state)
            common.write_spec(cdi_root / prepare.spec_file_name(uid), plan.spec)
            done = checkpoint.Claim(
                checkpoint.PREPARE_COMPLETED, record.name, record.namespace, record.devices,
                record.time_sliced,
            )  # fmt: skip
            state = checkpoint.Checkpoint(state.boot_id, {**state.claims, uid: done})
            checkpoint.save(point, state)
            states[node_index] = state
            latencies.append(time.perf_counter() - began)
        prepare_cpu = time.process_time() - cpu1
        specs = len(list(cdi_root.iterdir()))
    return {
        "nodes": nodes,
        "slices": published_slices,
        "devices": devices_total,
        "publish_s": publish_s,
        "publish_cpu_s": publish_cpu,
        "slices_per_s": published_slices / publish_s if publish_s else 0.0,
        "devices_per_s": devices_total / publish_s if publish_s else 0.0,
        "claims": claims,
        "specs": specs,
        "prepare_cpu_s": prepare_cpu,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "load": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def main() -> int:
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=1000)
    args = parser.parse_args()
    r = asyncio.run(run(args.nodes, args.claims))
    print(
        f"published {r['slices']} slices ({r['devices']} devices) for {r['nodes']} nodes in "
        f"{r['publish_s']:.2f}s: {r['slices_per_s']:.0f} slices/s, {r['devices_per_s']:.0f} "
        f"devices/s ({r['publish_cpu_s']:.2f} CPU s); prepared {r['claims']} claims "
        f"({r['specs']} CDI specs) in {r['prepare_cpu_s']:.2f} CPU s: p50 {r['p50_ms']:.2f} ms, "
        f"p99 {r['p99_ms']:.2f} ms; load {r['load']}"
    )
    history.append(
        "dra_plugin",
        {
            "slices_per_s": round(r["slices_per_s"], 1),
            "publish_cpu_s": round(r["publish_cpu_s"], 2),
            "prepare_cpu_s": round(r["prepare_cpu_s"], 2),
            "prepare_p50_ms": round(r["p50_ms"], 2),
            "prepare_p99_ms": round(r["p99_ms"], 2),
        },
        config={"nodes": args.nodes, "gpus_per_node": 8, "claims": args.claims},
        higher_is_better=["slices_per_s"],
    )
    return 0 if r["specs"] == r["claims"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
