"""Big label-selected lists on kubesim while 1,000 GPU nodes converge under our operator.

kubesim runs in this process with an instant kubelet (as in bench/operator_scale.py); our operator
runs as its own process and converges a ClusterPolicy on the fleet. A third process, the client,
plays two parts at once over HTTP:

- the probe: `GET pods?labelSelector=app=nvidia-driver-daemonset` across all namespaces every
  `--period` seconds, cycling through the three encodings a client asks for (protobuf as client-go's
  typed clients prefer it, JSON, and the Table `kubectl get -o wide` asks for); every response is
  read to its last byte and timed;
- NVIDIA's operator's client pattern (its Go binary cannot run here): controller-runtime's leader
  election with its default flags (LeaseDuration 15 s, RenewDeadline 10 s, RetryPeriod 2 s), a
  GET and a PUT of the Lease every 2 s, lost when no renewal succeeds within 10 s; plus its big
  label-selected pod and DaemonSet lists at the rate measured against kubesim (26 driver-pod
  lists per 104 s convergence: one every 4 s).

It prints the probe's p50/p99 latency per encoding and overall, the worst gap between two
successful Lease renewals and whether the lease would have been lost, and appends the figures to
bench/history.jsonl. Run:

    .venv/bin/python bench/kubesim_list_bench.py --nodes 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAMESPACE = "gpu-operator"
DRIVER_APP = "nvidia-driver-daemonset"
LEASE_NAME = "53822513.nvidia.com"  # the Lease NVIDIA's operator campaigns for
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
NVIDIA_LIST_PERIOD = 104.0 / 26  # its driver-pod lists, measured against kubesim
PROTOBUF = "application/vnd.kubernetes.protobuf,application/json"
JSON = "application/json"
TABLE = (  # what kubectl get sends
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
ENCODINGS = {"protobuf": PROTOBUF, "json": JSON, "table": TABLE}
GC_YOUNG_THRESHOLD = 15_000
FREEZE_PERIOD = 0.25


# ----- the client process --------------------------------------------------------------------


async def _timed_get(session: Any, url: str, accept: str) -> tuple[float, int, bytes]:
    started = time.monotonic()
    async with session.get(url, headers={"Accept": accept}) as response:
        body = await response.read()
        return time.monotonic() - started, response.status, body


async def _probe(base: str, period: float, stop: asyncio.Event, out: dict[str, Any]) -> None:
    import aiohttp

    url = f"{base}/api/v1/pods?labelSelector=app%3D{DRIVER_APP}"
    names = list(ENCODINGS)
    index = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            name = names[index % len(names)]
            index += 1
            elapsed, status, body = await _timed_get(session, url, ENCODINGS[name])
            items = _count_items(name, body) if status == 200 else -1
            out["lists"].append({"encoding": name, "s": elapsed, "status": status, "items": items})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


def _count_items(encoding: str, body: bytes) -> int:
    """About how many items a response holds, from its bytes: parsing a big body would stall
    this process's loop, and with it the Lease renewals measured here."""
    if encoding == "table":
        return body.count(b'"cells":')
    return body.count(
        b"\x12\x18nvidia-driver-daemonset-" if encoding == "protobuf" else b'"kind":"Pod"'
    )


async def _nvidia_lists(base: str, stop: asyncio.Event, out: dict[str, Any]) -> None:
    import aiohttp

    pods = f"{base}/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app%3D{DRIVER_APP}"
    daemonsets = (
        f"{base}/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets?labelSelector=app%3D{DRIVER_APP}"
    )
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            for url in (pods, daemonsets):
                elapsed, status, _ = await _timed_get(session, url, PROTOBUF)
                out["nvidia_lists"].append({"s": elapsed, "status": status})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), NVIDIA_LIST_PERIOD)


async def _leader(base: str, stop: asyncio.Event, out: dict[str, Any]) -> None:
    """controller-runtime's leader election loop: GET then PUT of the Lease every RetryPeriod;
    each attempt bounded by the RenewDeadline; lost when no renewal succeeded for that long."""
    import aiohttp

    url = f"{base}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE_NAME}"
    timeout = aiohttp.ClientTimeout(total=RENEW_DEADLINE)
    last = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            attempt = time.monotonic()
            try:
                async with session.get(url, headers={"Accept": JSON}) as response:
                    lease = await response.json()
                lease["spec"]["renewTime"] = time.strftime(
                    "%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()
                )
                async with session.put(url, json=lease) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError, KeyError):
                ok = False
            done = time.monotonic()
            out["lease_rtt"].append(done - attempt)
            if ok:
                out["renew_gaps"].append(done - last)
                last = done
            elif done - last > RENEW_DEADLINE:
                out["lost"] = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, RETRY_PERIOD - (done - attempt)))
    out["renew_gaps"].append(time.monotonic() - last)


async def client_main(base: str, period: float) -> None:
    """Run until stdin closes, then print the figures as one JSON line."""
    out: dict[str, Any] = {"lists": [], "nvidia_lists": [], "lease_rtt": [], "renew_gaps": []}
    out["lost"] = False
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    waiter = loop.run_in_executor(None, sys.stdin.read)
    tasks = [
        loop.create_task(_probe(base, period, stop, out)),
        loop.create_task(_nvidia_lists(base, stop, out)),
        loop.create_task(_leader(base, stop, out)),
    ]
    await waiter
    stop.set()
    await asyncio.gather(*tasks)
    print(json.dumps(out), flush=True)


# ----- the kubesim side ----------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def run(nodes: int, period: float, after: float, log: Any) -> dict[str, Any]:
    import operator_scale as scale

    import kubesim
    from gpu_operator.api import crds
    from kubesim.controllers.kubelet import KubeletConfig

    config = KubeletConfig(instant=True, lease_interval=None)
    async with kubesim.Cluster(
        kubelet=config, events=True, node_filesystems=False, images=scale.FAKE_REGISTRY
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        sim.store.create(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": NAMESPACE},
                "spec": {
                    "holderIdentity": "nvidia-gpu-operator_bench",
                    "leaseDurationSeconds": int(LEASE_DURATION),
                },
            }
        )
        for i in range(nodes):
            sim.add_node(f"gpu-{i:05d}", labels=dict(scale.GPU_LABELS))
        gc.collect()
        gc.freeze()
        freezer = asyncio.get_running_loop().create_task(scale.freeze_survivors(FREEZE_PERIOD))
        operator = scale.start_operator(sim)
        client: asyncio.subprocess.Process | None = None
        try:
            await sim.wait_for(lambda: sim.stats.count("watch", "nodes") > 0, 600, "operator up")
            cpu_before = scale.cpu_seconds()
            started = time.monotonic()
            client = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--client", sim.url, "--period", str(period),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            sim.store.create(scale.POLICY)
            await sim.wait_for(lambda: scale.state(sim) == "ready", 3600, "ClusterPolicy ready")
            converge = time.monotonic() - started
            log(f"  converged in {converge:.1f}s; probing {after:.0f}s more")
            await asyncio.sleep(after)
            assert client.stdin is not None
            client.stdin.close()
            stdout, _ = await client.communicate()
            result: dict[str, Any] = json.loads(stdout)
            result["converge_s"] = converge
            result["kubesim_cpu_s"] = scale.cpu_seconds() - cpu_before
            result["driver_pods"] = len(sim.store.list("pods", label_selector=f"app={DRIVER_APP}"))
        finally:
            if client is not None and client.returncode is None:
                client.kill()
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(10)
            freezer.cancel()
            gc.unfreeze()
    return result


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The figures bench/history.jsonl keeps (all lower-is-better)."""
    big = [r for r in result["lists"] if r["items"] >= 0.9 * result["driver_pods"]]
    out: dict[str, float] = {
        "list_p50_ms": _percentile([r["s"] for r in big], 0.5) * 1000,
        "list_p99_ms": _percentile([r["s"] for r in big], 0.99) * 1000,
        "worst_renew_gap_s": max(result["renew_gaps"] or [0.0]),
        "lease_rtt_p99_ms": _percentile(result["lease_rtt"], 0.99) * 1000,
        "lease_lost": float(bool(result["lost"]) or max(result["renew_gaps"]) > RENEW_DEADLINE),
        "kubesim_cpu_s": result["kubesim_cpu_s"],
        "converge_s": result["converge_s"],
    }
    for name in ENCODINGS:
        chosen = [r["s"] for r in big if r["encoding"] == name]
        out[f"list_{name}_p50_ms"] = _percentile(chosen, 0.5) * 1000
        out[f"list_{name}_p99_ms"] = _percentile(chosen, 0.99) * 1000
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--period", type=float, default=0.25, help="seconds between probes")
    parser.add_argument("--after", type=float, default=20.0, help="probe seconds after ready")
    parser.add_argument("--note", default=None, help="a note kept with the history record")
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(client_main(args.client, args.period))
        return 0
    # Young passes every 15,000 allocations (bench/operator_scale.py's 50,000 made single
    # passes of 10-30 ms that landed inside lists; 15,000: under 10 ms, the same total time),
    # and survivors frozen every quarter second so that older passes stay short too.
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    log(f"{args.nodes} GPU nodes:")
    result = asyncio.run(run(args.nodes, args.period, args.after, log))
    found = figures(result)
    big = sum(1 for r in result["lists"] if r["items"] >= 0.9 * result["driver_pods"])
    errors = sum(1 for r in result["lists"] if r["status"] != 200)
    print(f"driver pods listed: {result['driver_pods']} ({big} full lists, {errors} errors)")
    for name in ENCODINGS:
        print(
            f"  {name:8s} p50 {found[f'list_{name}_p50_ms']:7.1f} ms"
            f"  p99 {found[f'list_{name}_p99_ms']:7.1f} ms"
        )
    print(f"  all      p50 {found['list_p50_ms']:7.1f} ms  p99 {found['list_p99_ms']:7.1f} ms")
    print(
        f"NVIDIA-pattern leader election: worst renewal gap {found['worst_renew_gap_s']:.2f} s "
        f"(lost after {RENEW_DEADLINE:.0f} s), "
        f"Lease GET+PUT p99 {found['lease_rtt_p99_ms']:.1f} ms, "
        f"lease {'LOST' if found['lease_lost'] else 'kept'}"
    )
    print(
        f"converged in {found['converge_s']:.1f} s, kubesim CPU {found['kubesim_cpu_s']:.1f} s, "
        f"load {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    import history

    history.append(
        "kubesim_list",
        found,
        config={"nodes": args.nodes, "period_s": args.period},
        note=args.note,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
