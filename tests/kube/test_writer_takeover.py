"""The writer takes an object over from the field manager that wrote it before (NVIDIA's operator
updates as `gpu-operator`), on kubesim: what only that manager set and ours does not render goes
in the patch that sets ours, so no write is ever invalid, and ours ends the only owner."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from waiting import DEADLINE

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import resources
from gpu_operator.kube.writer import Writer, taken_over_yet
from gpu_operator.operands import takeover

NS = "default"
NS_REF = {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster() as cluster:
        cluster.add_node("n1")
        yield cluster


def daemonset(env: list[dict[str, Any]], selector: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": "operand"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "operand", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": selector or labels},
            "template": {
                "metadata": {"labels": {**labels, **(selector or {})}},
                "spec": {"containers": [
                    {"name": "main", "image": "registry.example/op:v1", "env": env}
                ]},
            },
        },
    }  # fmt: skip


async def created_by_nvidia(sim: kubesim.Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    """Create `obj` as NVIDIA's operator does: a plain create by manager `gpu-operator`."""
    upstream = AsyncClient(KubeConfig.from_file(str(sim.kubeconfig_path)),
                           field_manager=takeover.PREVIOUS_WRITER)  # fmt: skip
    try:
        return dict(await upstream.create(resources.wrap(copy.deepcopy(obj))))
    finally:
        await upstream.close()


def stored(sim: kubesim.Cluster) -> dict[str, Any]:
    found = sim.store.get("daemonsets", "operand", namespace=NS)
    assert found is not None
    return found


def managers(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["manager"], e["operation"]) for e in obj["metadata"].get("managedFields") or []}


async def test_a_value_from_only_the_previous_writer_set_goes_instead_of_a_422(
    sim: kubesim.Cluster,
) -> None:
    nvidias = daemonset([{"name": "NS", "valueFrom": NS_REF}, {"name": "OLD", "value": "1"}])
    await created_by_nvidia(sim, nvidias)
    ours = daemonset([{"name": "NS", "value": NS}])
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace=NS)
    try:
        # What a plain server-side apply does: it keeps NVIDIA's `valueFrom` beside our value.
        with pytest.raises(ApiError, match="may not be specified when `value` is not empty"):
            await writer.apply(ours)
        assert not taken_over_yet(stored(sim))
        await writer.take_over(ours)
    finally:
        await client.close()
    live = stored(sim)
    assert live["spec"]["template"]["spec"]["containers"][0]["env"] == [{"name": "NS", "value": NS}]
    assert managers(live) == {("gpu-operator", "Apply")}
    assert taken_over_yet(live)
    # Fields the server defaults came back as they were.
    container = live["spec"]["template"]["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert live["spec"]["revisionHistoryLimit"] == 10


async def test_an_equal_template_keeps_its_generation_and_pods(sim: kubesim.Cluster) -> None:
    nvidias = daemonset([{"name": "NS", "valueFrom": NS_REF}])
    created = await created_by_nvidia(sim, nvidias)
    await sim.wait_for(
        lambda: len(sim.store.list("pods", namespace=NS)) == 1, timeout=DEADLINE,
        message="the operand pod",
    )  # fmt: skip
    [pod] = sim.store.list("pods", namespace=NS)
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        await Writer(client, namespace=NS).take_over(nvidias)
    finally:
        await client.close()
    live = stored(sim)
    assert live["metadata"]["generation"] == created["metadata"]["generation"]
    assert managers(live) == {("gpu-operator", "Apply")}
    assert [p["metadata"]["uid"] for p in sim.store.list("pods", namespace=NS)] == [
        pod["metadata"]["uid"]
    ]


async def test_a_previous_writers_daemonset_with_another_selector_is_replaced(
    sim: kubesim.Cluster,
) -> None:
    await created_by_nvidia(sim, daemonset([]))
    old_uid = stored(sim)["metadata"]["uid"]
    new = daemonset([], {"app": "operand", "tier": "gpu"})
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        await Writer(client, namespace=NS).take_over(new)
    finally:
        await client.close()
    live = stored(sim)
    assert live["metadata"]["uid"] != old_uid
    assert live["spec"]["selector"] == new["spec"]["selector"]
    assert managers(live) == {("gpu-operator", "Apply")}
