"""Status writes during quick ClusterPolicy edits, with and without coalescing (issue 19).

The operator runs as its own process on kubesim (no node filesystems, as in
bench/operator_scale.py; the kubelet takes its default ~0.1 s to start a pod, so a rolling update
of one node at a time lasts minutes at 1,000 nodes, as on a real cluster; `--instant` makes pods
start at once) with a fleet of GPU nodes; once the policy is ready, a dcgm-exporter env
value is flipped `--edits` times ~100 ms apart, and the bench counts, until the policy is ready
again and quiet: the ClusterPolicy status patches (API requests), and the operator's committed
writes per object (status of a ClusterPolicy or NVIDIADriver, spec of a DaemonSet, labels,
annotations or spec of a Node), naming the hottest object. It runs once per status write
interval (`STATUS_WRITE_INTERVAL`; 0 is "before": every change written). Run:

    .venv/bin/python bench/status_writes_bench.py --nodes 1000 --edits 20 --intervals 0 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from operator_scale import (
    FAKE_REGISTRY,
    GPU_LABELS,
    NAMESPACE,
    POLICY,
    freeze_survivors,
    start_operator,
)

import kubesim
from gpu_operator.api import crds
from kubesim.controllers.kubelet import KubeletConfig
from kubesim.store import Event

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

POLICIES = "clusterpolicies.nvidia.com"
STATUS_PATCH = ("patch", "clusterpolicies.nvidia.com/status")
# Kinds the operator writes, and what of theirs only the operator changes here (kubesim's
# controllers write DaemonSet and Node status, never these).
WATCHED: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
    ("nvidia.com", "clusterpolicies"): lambda o: o.get("status"),
    ("nvidia.com", "nvidiadrivers"): lambda o: o.get("status"),
    ("apps", "daemonsets"): lambda o: (o["metadata"].get("generation"), _meta(o)),
    ("", "nodes"): lambda o: (_meta(o), o.get("spec")),
}


def _meta(obj: dict[str, Any]) -> tuple[Any, Any]:
    meta = obj.get("metadata") or {}
    return meta.get("labels"), meta.get("annotations")


def ready(sim: kubesim.Cluster) -> bool:
    policy = sim.store.get(POLICIES, "cluster-policy") or {}
    status = policy.get("status") or {}
    generation = policy.get("metadata", {}).get("generation")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    observed = (conditions.get("Ready") or {}).get("observedGeneration")
    return status.get("state") == "ready" and observed == generation


async def quiet(sim: kubesim.Cluster, writes: Counter[str], seconds: float) -> None:
    """Wait until no operator write lands for `seconds`."""
    last, since = sum(writes.values()), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.1)
        now = sum(writes.values())
        if now != last:
            last, since = now, time.monotonic()


async def run(
    nodes: int, edits: int, gap: float, interval: float, instant: bool, log: Any
) -> dict[str, Any]:
    config = KubeletConfig(instant=instant, lease_interval=None)
    async with kubesim.Cluster(kubelet=config, node_filesystems=False, images=FAKE_REGISTRY) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        for i in range(nodes):
            sim.add_node(f"gpu-{i:05d}", labels=dict(GPU_LABELS))
        gc.collect()
        gc.freeze()
        freezer = asyncio.get_running_loop().create_task(freeze_survivors())
        operator = start_operator(sim, STATUS_WRITE_INTERVAL=str(interval))
        writes: Counter[str] = Counter()

        def count(event: Event) -> None:
            if event.type != "MODIFIED" or event.old is None:
                return
            owned = WATCHED[event.key]
            if owned(event.new.obj) != owned(event.old.obj):
                meta = event.new.obj["metadata"]
                name = "/".join(p for p in (meta.get("namespace"), meta["name"]) if p)
                writes[f"{event.new.obj['kind']} {name}"] += 1

        try:
            await sim.wait_for(lambda: sim.stats.count("watch", "nodes") > 0, 600, "operator up")
            started = time.monotonic()
            sim.store.create(POLICY)
            await sim.wait_for(lambda: ready(sim), 3600, "ClusterPolicy ready")
            log(f"  converged in {time.monotonic() - started:.1f}s")
            await sim.settle(600)
            unsubscribe = sim.store.subscribe(count, keys=list(WATCHED))
            before = sim.stats.snapshot()
            started = time.monotonic()
            for index in range(edits):
                value = str(index % 2)
                sim.store.patch(
                    POLICIES, "cluster-policy",
                    {"spec": {"dcgmExporter": {"env": [{"name": "BENCH_FLIP", "value": value}]}}},
                )  # fmt: skip
                await asyncio.sleep(gap)
            last_edit = time.monotonic()
            await sim.wait_for(lambda: ready(sim), 3600, "ClusterPolicy ready after the edits")
            ready_after = time.monotonic() - last_edit
            await quiet(sim, writes, 3.0)
            unsubscribe()
            requests = sim.stats.since(before)
            policy_writes = writes.get("ClusterPolicy cluster-policy", 0)
            hottest, hottest_writes = writes.most_common(1)[0] if writes else ("-", 0)
            result = {
                "interval": interval,
                "nodes": nodes,
                "edits": edits,
                "status_patches": requests.get(STATUS_PATCH, 0),
                "policy_status_writes": policy_writes,
                "hottest": hottest,
                "hottest_writes": hottest_writes,
                "seconds": last_edit - started + ready_after,
                "ready_after_last_edit_s": ready_after,
                "final_ready": ready(sim),
            }
            log(
                f"  interval {interval:g}s: {result['status_patches']} status patches, hottest "
                f"{hottest} ({hottest_writes} writes), ready {ready_after:.1f}s after the last edit"
            )
            return result
        finally:
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(10)
            freezer.cancel()
            gc.unfreeze()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between edits")
    parser.add_argument(
        "--intervals", type=float, nargs="+", default=[0.0, 1.0],
        help="STATUS_WRITE_INTERVAL values to compare (0: no coalescing)",
    )  # fmt: skip
    parser.add_argument("--instant", action="store_true", help="pods start and turn ready at once")
    args = parser.parse_args()
    gc.set_threshold(50_000, 20, 100)  # as bench/operator_scale.py: fewer collector passes

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = [
        "| status write interval | ClusterPolicy status patches | hottest object (writes) "
        "| edits -> ready again |",
        "|---|---|---|---|",
    ]
    for interval in args.intervals:
        log(f"{args.nodes} GPU nodes, {args.edits} edits {args.gap * 1000:.0f} ms apart:")
        result = asyncio.run(run(args.nodes, args.edits, args.gap, interval, args.instant, log))
        if not result["final_ready"]:
            log("  the ClusterPolicy's last status is not ready: the last status was lost")
            return 1
        history.append(
            "status_writes",
            {
                "status_patches": result["status_patches"],
                "hottest_writes": result["hottest_writes"],
                "seconds": result["seconds"],
                "ready_after_last_edit_s": result["ready_after_last_edit_s"],
            },
            config={"nodes": args.nodes, "edits": args.edits, "interval": interval},
        )
        rows.append(
            f"| {interval:g} s | {result['status_patches']} | {result['hottest']} "
            f"({result['hottest_writes']}) | {result['seconds']:.1f} s "
            f"({result['ready_after_last_edit_s']:.1f} s after the last edit) |"
        )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
