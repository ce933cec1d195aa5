"""must-gather on a large kubesim cluster: wall time, API requests, log reads and archive size
for N GPU nodes, each with the chain's pods (driver with its driver-manager init container,
toolkit, device plugin, validator) writing a few log lines. The simulated API server runs in a
child process (its own core, as a real API server) and adds `--log-latency` seconds to every
log read, the API server -> kubelet round trip a real cluster has. Run:

    .venv/bin/python bench/must_gather_bench.py --nodes 5000 --parallel 1,16
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import must_gather
from kubesim.controllers.kubelet import KubeletConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

NAMESPACE = "gpu-operator"
APPS = ("nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset", "nvidia-operator-validator")  # fmt: skip


async def agent(run: kubesim.ProgramRun) -> int | None:
    """A container that logs `argv[1]` lines, then keeps running (`--exit`: ends at once)."""
    for i in range(int(run.argv[1])):
        run.stdout.write(f"{run.view.container_name}: step {i} on {run.view.node_name} done\n")
    if "--exit" in run.argv:
        return 0
    await asyncio.Event().wait()
    return None


def pod(app: str, i: int, lines: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": f"gpu-{i}",
        "containers": [{"name": "c", "image": "busybox:1.36", "command": ["agent", str(lines)]}],
    }
    if app == APPS[0]:
        spec["initContainers"] = [
            {
                "name": "k8s-driver-manager",
                "image": "busybox:1.36",
                "command": ["agent", str(lines), "--exit"],
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{app}-{i}", "namespace": NAMESPACE, "labels": {"app": app}},
        "spec": spec,
    }


async def serve(nodes: int, lines: int, latency: float, conn: Connection) -> None:
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True), node_filesystems=False) as sim:
        sim.register_program("agent", agent)
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        for i in range(nodes):
            labels = {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                keys.GPU_PRESENT: "true",
            }
            sim.add_node(f"gpu-{i}", labels=labels)
            for app in APPS:
                sim.store.create(pod(app, i, lines))

        def running() -> bool:
            pods = sim.store.list("pods", NAMESPACE)
            return all((p.get("status") or {}).get("phase") == "Running" for p in pods)

        await sim.wait_for(running, 900, "every pod running")
        if latency > 0:
            sim.faults.add(verb="get", resource="pods/log", error_rate=0.0, latency=latency)
        conn.send(str(sim.kubeconfig_path))
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, conn.recv) == "stats":
            conn.send(sim.stats.snapshot())


def serve_process(nodes: int, lines: int, latency: float, conn: Connection) -> None:
    asyncio.run(serve(nodes, lines, latency, conn))


async def measure(kubeconfig: str, conn: Connection, nodes: int, parallel: int) -> dict[str, float]:
    client = kube_client.connect(kubeconfig, timeout=120)
    conn.send("stats")
    before = conn.recv()
    start = time.monotonic()
    archive = await must_gather.gather(client, NAMESPACE, parallel=parallel)
    elapsed = time.monotonic() - start
    conn.send("stats")
    counts = {k: n - before.get(k, 0) for k, n in conn.recv().items()}
    await client.close()
    data = archive.tar_gz()
    logs = sum(1 for name in archive.files if name.startswith(f"{must_gather.ROOT}/logs/"))
    print(
        f"parallel {parallel:>3}: {elapsed:6.1f} s, {sum(counts.values())} requests "
        f"({counts.get(('get', 'pods/log'), 0)} log reads), {len(archive.files)} files "
        f"({logs} logs), {len(data) / 1e6:.1f} MB compressed, "
        f"{sum(map(len, archive.files.values())) / 1e6:.1f} MB uncompressed; "
        f"left out: {len(archive.left_out)}",
        flush=True,
    )
    return {
        f"parallel_{parallel}_s": elapsed,
        f"parallel_{parallel}_requests": float(sum(counts.values())),
        f"parallel_{parallel}_compressed_mb": len(data) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--parallel", default="1,16", help="comma-separated values to compare")
    parser.add_argument("--lines", type=int, default=20, help="log lines per container")
    parser.add_argument("--log-latency", type=float, default=0.01, help="seconds per log read")
    args = parser.parse_args()
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=serve_process, args=(args.nodes, args.lines, args.log_latency, theirs)
    )
    server.start()
    try:
        start = time.monotonic()
        kubeconfig = ours.recv()
        print(
            f"must-gather: {args.nodes} GPU nodes, {args.nodes * len(APPS)} pods, "
            f"{args.lines} lines per log, {args.log_latency * 1000:.0f} ms per log read "
            f"(cluster up in {time.monotonic() - start:.0f} s)",
            flush=True,
        )
        figures: dict[str, float] = {}
        for parallel in (int(p) for p in args.parallel.split(",")):
            figures.update(asyncio.run(measure(kubeconfig, ours, args.nodes, parallel)))
        config = {"nodes": args.nodes, "lines": args.lines, "log_latency": args.log_latency}
        history.append("must_gather", figures, config=config)
    finally:
        ours.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()


if __name__ == "__main__":
    main()
