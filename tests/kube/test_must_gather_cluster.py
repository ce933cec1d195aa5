"""must-gather against a simulated API server: each kind is listed once for all nodes, only logs
that exist are requested (previous runs only after a restart), and a log source that stops
answering is cut at the deadline and named in MANIFEST.txt."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from waiting import DEADLINE

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import must_gather as mg
from kubesim import KubeletConfig

NS = "gpu-operator"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"
GPU_NODES = ("gpu-a", "gpu-b", "gpu-c")
runs: Counter[str] = Counter()


async def agent(run: kubesim.ProgramRun) -> int | None:
    """Logs a line; `crash-once` fails its first run (leaving a previous log with a token)."""
    key = f"{run.view.pod['metadata']['name']}/{run.view.container_name}"
    runs[key] += 1
    if "crash-once" in run.argv and runs[key] == 1:
        run.stdout.write(f"using token={JWT}\nfatal: cannot reach the API\n")
        return 1
    run.stdout.write(f"{run.view.container_name} started on {run.view.node_name}\n")
    if "exit" in run.argv:
        return 0
    await asyncio.Event().wait()  # runs until its container is stopped
    return None


def pod(name: str, node: str, command: list[str], init: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "main", "image": "busybox:1.36", "command": command}],
    }
    if init:
        spec["initContainers"] = [
            {"name": "prep", "image": "busybox:1.36", "command": ["agent", "exit"]}
        ]
    labels = {"app": name.rsplit("-", 1)[0]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with gpu_cluster() as cluster:
        yield cluster


@asynccontextmanager
async def gpu_cluster() -> AsyncIterator[kubesim.Cluster]:
    runs.clear()
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True)) as cluster:
        cluster.register_program("agent", agent)
        cluster.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for crd in crds.all_crds().values():
            cluster.store.create(crd)
        cluster.add_node("cpu-1")
        for node in GPU_NODES:
            cluster.add_node(node, labels={keys.GPU_PRESENT: "true"})
            suffix = node.removeprefix("gpu-")
            cluster.store.create(pod(f"driver-{suffix}", node, ["agent"], init=True))
            cluster.store.create(pod(f"plugin-{suffix}", node, ["agent"]))
        cluster.store.create(pod("validator-a", "gpu-a", ["agent", "crash-once"]))
        cluster.store.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "ngc", "namespace": NS},
                "stringData": {"NGC_API_KEY": "nvapi-never-in-the-archive"},
            }
        )

        def settled() -> bool:
            pods = cluster.store.list("pods", NS)
            validator = cluster.store.get("pods", "validator-a", NS) or {}
            [status] = (validator.get("status") or {}).get("containerStatuses") or [{}]
            return status.get("restartCount") == 1 and all(
                (p.get("status") or {}).get("phase") == "Running" for p in pods
            )

        await cluster.wait_for(settled, DEADLINE, "every pod running, the validator restarted once")
        yield cluster


def members(archive: mg.Archive) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(archive.tar_gz()), mode="r:gz") as tar:
        return {
            m.name.removeprefix("must-gather/"): (tar.extractfile(m) or io.BytesIO())
            .read()
            .decode()
            for m in tar.getmembers()
        }


async def test_each_kind_is_listed_once_for_all_nodes_and_only_existing_logs_are_read(
    sim: kubesim.Cluster,
) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    before = sim.stats.snapshot()
    try:
        archive = await mg.gather(client, NS, parallel=4)
    finally:
        await client.close()
    requests = sim.stats.since(before)
    log_reads = requests.pop(("get", "pods/log"))
    # 3 drivers (init + main), 3 plugins, the validator (current + previous after its restart).
    assert log_reads == 3 * 2 + 3 + 2
    assert requests == {
        ("list", "clusterpolicies.nvidia.com"): 1, ("list", "nvidiadrivers.nvidia.com"): 1,
        ("list", "nodes"): 1, ("list", "pods"): 1, ("list", "daemonsets.apps"): 1,
        ("list", "deployments.apps"): 1, ("list", "events"): 2,
    }  # fmt: skip
    files = members(archive)
    assert sorted(p for p in files if p.startswith("explain/")) == [
        f"explain/{n}.json" for n in GPU_NODES
    ]
    logs = sorted(p for p in files if p.startswith("logs/"))
    assert logs == sorted([
        *(f"logs/driver-{n}/{c}.log" for n in "abc" for c in ("prep", "main")),
        *(f"logs/plugin-{n}/main.log" for n in "abc"),
        "logs/validator-a/main.log", "logs/validator-a/main.previous.log",
    ])  # fmt: skip
    assert files["logs/driver-b/main.log"] == "main started on gpu-b\n"
    assert "fatal: cannot reach the API" in files["logs/validator-a/main.previous.log"]
    everything = "".join(files.values())
    assert JWT not in everything
    assert "nvapi-never-in-the-archive" not in everything
    manifest = files["MANIFEST.txt"]
    assert "11 log request(s) (4 at a time)" in manifest
    assert "left out:\n  nothing\n" in manifest


async def test_logs_not_read_by_the_deadline_are_listed_in_the_manifest(
    sim: kubesim.Cluster,
) -> None:
    # A kubelet that does not answer log requests within the run's deadline.
    sim.faults.add(verb="get", resource="pods/log", error_rate=0.0, latency=6)
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        archive = await mg.gather(client, NS, deadline=2, parallel=4)
    finally:
        await client.close()
    files = members(archive)
    assert not [p for p in files if p.startswith("logs/")]
    assert "explain/gpu-a.json" in files  # everything but the logs is there
    manifest = files["MANIFEST.txt"]
    left = manifest.split("left out:\n", 1)[1].split("files:\n", 1)[0].splitlines()
    assert "  logs/validator-a/main.previous.log: deadline" in left
    assert len(left) == 11
    assert all(line.endswith(": deadline") for line in left)
