"""kubesim performance: GET and merge-patch rates, 5,000-node list, watch fan-out, memory.

Run: `.venv/bin/python bench/kubesim_bench.py`. The server runs in a child process (`kubesim serve`)
so client and server do not share an interpreter; prints numbers, asserts nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

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

    # The same run on a throwaway store first, so that caches filled once per process
    # (decoding plans, codecs' key caches) are not counted per node.
    warm = Store()
    warm_kubelet = Kubelet(warm, KubeletConfig(instant=True, lease_interval=None))
    for index in range(NODES):
        warm.insert(warm.registry.resolve("nodes"), warm_kubelet.node_object(f"warm-{index}"))
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


LIST_ITEMS = 20_000


async def large_list_apply(session: aiohttp.ClientSession) -> tuple[float, float, float]:
    """Milliseconds to server-side apply a DaemonSet with 20,000 env vars: create, re-apply the
    same configuration (a no-op), re-apply with one item dropped (pruned)."""

    def config(skip: int = -1) -> bytes:
        env = [{"name": f"E{i}"} for i in range(LIST_ITEMS) if i != skip]
        template = {
            "metadata": {"labels": {"app": "big"}},
            # No node matches, so the 5,000 nodes do not each get a pod.
            "spec": {"nodeSelector": {"bench": "none"},
                     "containers": [{"name": "c", "image": "x:1", "env": env}]},
        }  # fmt: skip
        return json.dumps(
            {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": "big", "namespace": "default"},
             "spec": {"selector": {"matchLabels": {"app": "big"}}, "template": template}}
        ).encode()  # fmt: skip

    timings = []
    for body in (config(), config(), config(skip=LIST_ITEMS // 2)):
        start = time.perf_counter()
        async with session.patch(
            "/apis/apps/v1/namespaces/default/daemonsets/big",
            data=body,
            params={"fieldManager": "bench"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        ) as resp:
            await resp.read()
            assert resp.status in (200, 201), resp.status
        timings.append((time.perf_counter() - start) * 1000)
    return timings[0], timings[1], timings[2]


async def start_server(*flags: str, kubeconfig: Path | None = None) -> tuple[Any, str]:
    """`kubesim serve` with 5,000 nodes in a child process; (process, url)."""
    exe = Path(sys.executable).parent / "kubesim"
    extra = ["--kubeconfig-out", str(kubeconfig)] if kubeconfig else []
    proc = await asyncio.create_subprocess_exec(
        str(exe), "serve", "--nodes", str(NODES), "--instant", *flags, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    url = (await proc.stdout.readline()).decode().strip()
    return proc, url


async def rates(session: aiohttp.ClientSession) -> tuple[float, float, list[float]]:
    """GET and merge-patch throughput on nodes, and 5,000-node list timings."""
    get_rate = await throughput(
        session, "GET", lambda i: f"/api/v1/nodes/node-{i % NODES + 1}", None, "application/json"
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
    return get_rate, patch_rate, timings


async def service_account_token(session: aiohttp.ClientSession) -> str:
    """As the admin: a ServiceAccount allowed get/list/patch on nodes, and a token for it."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bench"}}
    role = {
        "metadata": {"name": "bench-nodes"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}],
    }
    binding = {
        "metadata": {"name": "bench-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "bench-nodes"},
        "subjects": [{"kind": "ServiceAccount", "name": "bench", "namespace": "default"}],
    }  # fmt: skip
    for path, body in (
        ("/api/v1/namespaces/default/serviceaccounts", account),
        (f"{rbac}/clusterroles", role),
        (f"{rbac}/clusterrolebindings", binding),
    ):
        async with session.post(path, json=body) as resp:
            assert resp.status == 201, await resp.text()
    async with session.post(
        "/api/v1/namespaces/default/serviceaccounts/bench/token", json={"spec": {}}
    ) as resp:
        return str((await resp.json())["status"]["token"])


async def authenticated_rates(mode: str, tmp: Path) -> tuple[float, float, list[float]]:
    """Rates over HTTPS with bearer tokens: the admin's in open mode, a ServiceAccount's in rbac."""
    config_path = tmp / f"kubeconfig-{mode}"
    proc, url = await start_server("--authorization", mode, kubeconfig=config_path)
    try:
        config = yaml.safe_load(config_path.read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
        context = ssl.create_default_context(cadata=ca.decode())
        token = config["users"][0]["user"]["token"]
        headers = {"Authorization": f"Bearer {token}"}
        connector = aiohttp.TCPConnector(limit=CONCURRENCY + 4, ssl=context)
        async with aiohttp.ClientSession(
            base_url=url, connector=connector, headers=headers
        ) as session:
            if mode == "rbac":
                token = await service_account_token(session)
                session.headers["Authorization"] = f"Bearer {token}"
            return await rates(session)
    finally:
        proc.terminate()
        await proc.wait()


async def main() -> None:
    proc, url = await start_server("--no-authentication")
    try:
        connector = aiohttp.TCPConnector(limit=CONCURRENCY + WATCHERS + 4)
        async with aiohttp.ClientSession(base_url=url, connector=connector) as session:
            get_rate, patch_rate, timings = await rates(session)
            fanout = await watch_fanout(session)
            big_create, big_again, big_drop = await large_list_apply(session)
    finally:
        proc.terminate()
        await proc.wait()
    with tempfile.TemporaryDirectory() as tmp:
        secured = {mode: await authenticated_rates(mode, Path(tmp)) for mode in ("open", "rbac")}
    total, overhead = memory_overhead()
    fanout.sort()
    print(
        f"objects stored: {NODES} nodes (+ leases), server in a child process, "
        f"client concurrency {CONCURRENCY}; plain HTTP, no authentication unless said"
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
    print(
        f"apply {LIST_ITEMS:,}-item list:  {big_create:8.0f} ms create, {big_again:.0f} ms "
        f"re-apply unchanged, {big_drop:.0f} ms dropping one item"
    )
    for mode, label in (("open", "HTTPS, admin token, open"), ("rbac", "HTTPS, SA token, RBAC")):
        mode_get, mode_patch, mode_list = secured[mode]
        print(
            f"{label + ':':31} GET {mode_get:6.0f} req/s, merge-patch {mode_patch:6.0f} req/s, "
            f"list {min(mode_list):.1f} ms best"
        )
    print(f"memory per node:        {total:8.0f} B traced, {overhead:.0f} B beyond its JSON size")
    print(f"cpu count: {os.cpu_count()}")
    figures = {
        "get_node_per_s": get_rate,
        "patch_node_per_s": patch_rate,
        "list_nodes_best_ms": min(timings),
        "watch_fanout_median_ms": fanout[len(fanout) // 2],
        "apply_list_create_ms": big_create,
        "apply_list_unchanged_ms": big_again,
        "bytes_per_node": total,
    }
    for mode in ("open", "rbac"):
        figures[f"https_{mode}_get_per_s"] = secured[mode][0]
        figures[f"https_{mode}_patch_per_s"] = secured[mode][1]
    throughputs = [name for name in figures if name.endswith("_per_s")]
    history.append("kubesim", figures, config={"nodes": NODES}, higher_is_better=throughputs)


if __name__ == "__main__":
    asyncio.run(main())
