"""Real clients against kubesim: lightkube (the operator's client) and the kubectl binary."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from kubesim_helpers import KUBECTL, kubectl, needs_kubectl
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.types import on_error_retry
from waiting import DEADLINE, within

import kubesim


async def test_lightkube_crud_watch_and_apply(sim: kubesim.Cluster) -> None:
    client = AsyncClient(KubeConfig.from_file(sim.kubeconfig_path))
    try:
        assert [n.metadata.name async for n in client.list(Node)] == ["node-1", "node-2"]
        await client.create(
            ConfigMap(metadata=ObjectMeta(name="c", namespace="default"), data={"a": "1"})
        )
        events: list[tuple[str, str]] = []

        async def watch() -> None:
            async for event_type, obj in client.watch(ConfigMap, namespace="default"):
                events.append((event_type, obj.metadata.name))
                if event_type == "MODIFIED":
                    return

        task = asyncio.ensure_future(watch())
        await sim.wait_for(lambda: sim.store.watcher_count() == 1, DEADLINE)
        await client.patch(ConfigMap, "c", {"data": {"a": "2"}}, namespace="default")
        await within(task, "the ADDED and MODIFIED watch events")
        assert events == [("ADDED", "c"), ("MODIFIED", "c")]
        manifest = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "d", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "d"}},
                "template": {
                    "metadata": {"labels": {"app": "d"}},
                    "spec": {"containers": [{"name": "c", "image": "x:1"}]},
                },
            },
        }
        ds = await client.apply(DaemonSet.from_dict(manifest), field_manager="operator")
        assert ds.metadata.managedFields[0].manager == "operator"
        manifest["spec"]["template"]["spec"]["containers"][0]["image"] = "x:2"
        with pytest.raises(ApiError) as conflict:
            await client.apply(DaemonSet.from_dict(manifest), field_manager="intruder")
        assert conflict.value.status.code == 409
        forced = await client.apply(
            DaemonSet.from_dict(manifest), field_manager="intruder", force=True
        )
        assert forced.spec.template.spec.containers[0].image == "x:2"
        assert forced.metadata.generation == 2
    finally:
        await client.close()


async def test_lightkube_watch_recovers_from_gone(sim: kubesim.Cluster) -> None:
    client = AsyncClient(KubeConfig.from_file(sim.kubeconfig_path))
    seen: list[str] = []
    try:
        sim.store.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "a", "namespace": "default"},
            }
        )
        sim.faults.expire_next_watch()

        async def watch() -> None:
            async for _, obj in client.watch(
                ConfigMap, namespace="default", resource_version="1", on_error=on_error_retry
            ):
                seen.append(obj.metadata.name)
                return

        await within(watch(), "the watch to recover and deliver a")
        assert seen == ["a"]
    finally:
        await client.close()


# ----- kubectl ---------------------------------------------------------------------------------


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: c
        image: nginx:1.27
        env: [{name: A, value: "%s"}]
"""

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns: [{name: Size, type: integer, jsonPath: .spec.size}]
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
"""


@needs_kubectl
async def test_kubectl_get_describe_label_annotate_cordon(sim: kubesim.Cluster) -> None:
    out = await kubectl(sim, "get", "nodes")
    assert "node-1   Ready" in out
    assert "v1.35.0" in out
    assert "Kernel Version:" in await kubectl(sim, "describe", "node", "node-1")
    await kubectl(sim, "label", "node", "node-1", "tier=gold")
    await kubectl(sim, "annotate", "node", "node-1", "note=hi")
    node = sim.store.get("nodes", "node-1") or {}
    assert node["metadata"]["labels"]["tier"] == "gold"
    assert node["metadata"]["annotations"]["note"] == "hi"
    await kubectl(sim, "cordon", "node-1")
    assert "SchedulingDisabled" in await kubectl(sim, "get", "node", "node-1")
    await kubectl(sim, "uncordon", "node-1")
    assert not (sim.store.get("nodes", "node-1") or {})["spec"].get("unschedulable")


@needs_kubectl
async def test_kubectl_apply_client_and_server_side_then_pods(sim: kubesim.Cluster) -> None:
    assert "created" in await kubectl(sim, "apply", "-f", "-", stdin=DEPLOYMENT % "1")
    assert "configured" in await kubectl(sim, "apply", "-f", "-", stdin=DEPLOYMENT % "2")
    assert "serverside-applied" in await kubectl(
        sim, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=DEPLOYMENT % "3"
    )
    deploy = sim.store.get("deployments", "web", "default") or {}
    assert deploy["spec"]["template"]["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "3"}
    ]
    await sim.wait_for(
        lambda: (
            len(
                [
                    p
                    for p in sim.store.list("pods", "default")
                    if p["status"].get("phase") == "Running"
                ]
            )
            == 2
        ),
        DEADLINE,
    )
    await sim.settle(timeout=DEADLINE)
    pods = await kubectl(sim, "get", "pods", "-o", "wide")
    assert pods.count("Running") == 2
    name = sim.store.list("pods", "default")[0]["metadata"]["name"]
    assert "Controlled By:  ReplicaSet/web-" in await kubectl(sim, "describe", "pod", name)
    await kubectl(sim, "delete", "deployment", "web")
    await sim.wait_for(lambda: not sim.store.list("pods", "default"), DEADLINE)


@needs_kubectl
async def test_kubectl_drain_is_blocked_by_pdb_then_allowed(sim: kubesim.Cluster) -> None:
    await kubectl(sim, "apply", "-f", "-", stdin=DEPLOYMENT % "1")
    await sim.wait_for(
        lambda: (
            sum(
                1
                for p in sim.store.list("pods", "default")
                if p["status"].get("phase") == "Running"
            )
            == 2
        ),
        DEADLINE,
    )
    await sim.settle(timeout=DEADLINE)
    pdb = (
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web}\n"
        "spec: {minAvailable: 2, selector: {matchLabels: {app: web}}}\n"
    )
    await kubectl(sim, "apply", "-f", "-", stdin=pdb)
    blocked = await kubectl(
        sim, "drain", "node-1", "--ignore-daemonsets", "--timeout=1s", check=False
    )
    assert "disruption budget" in blocked
    await kubectl(sim, "delete", "pdb", "web")
    out = await kubectl(sim, "drain", "node-1", "--ignore-daemonsets", f"--timeout={DEADLINE:g}s")
    assert "drained" in out
    assert all(p["spec"]["nodeName"] == "node-2" for p in sim.store.list("pods", "default"))


@needs_kubectl
async def test_kubectl_crd_custom_resource_watch_and_delete(sim: kubesim.Cluster) -> None:
    await kubectl(sim, "apply", "-f", "-", stdin=CRD)
    widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n"
    await kubectl(sim, "apply", "-f", "-", stdin=widget)
    out = await kubectl(sim, "get", "wd")
    assert "SIZE" in out
    assert "w1     3" in out
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    watcher = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "get",
        "widgets",
        "-w",
        f"--request-timeout={3 * DEADLINE:g}s",  # open for the whole test
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert watcher.stdout is not None
    try:
        first = await within(watcher.stdout.readline(), "the watch header")
        assert b"NAME" in first
        await within(watcher.stdout.readline(), "the w1 row")
        await kubectl(sim, "patch", "widget", "w1", "--type=merge", "-p", '{"spec":{"size":7}}')
        changed = await within(watcher.stdout.readline(), "the changed w1 row")
        assert b"w1" in changed
        assert b"7" in changed
    finally:
        watcher.kill()
        await watcher.wait()
    await kubectl(sim, "delete", "widget", "w1")
    assert sim.store.list("widgets", "default") == []
    await kubectl(sim, "delete", "crd", "widgets.example.com")
    assert "NotFound" in await kubectl(sim, "get", "widgets", check=False)


async def test_cli_serve_writes_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        str(Path(os.sys.executable).parent / "kubesim"),
        "serve",
        "--nodes",
        "2",
        "--kubeconfig-out",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        url = (await within(proc.stdout.readline(), "the served URL")).decode().strip()
        assert url.startswith("https://127.0.0.1:")  # authenticating by default: HTTPS
        client = AsyncClient(KubeConfig.from_file(config))
        assert len([n async for n in client.list(Node)]) == 2
        await client.close()
    finally:
        proc.terminate()
        assert await within(proc.wait(), "kubesim serve to exit") == 0
