"""The writer replaces a DaemonSet whose selector changed (selectors are immutable), on kubesim."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube.writer import Writer, labels_match, selector_text

NS = "default"


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES) as cluster:
        cluster.add_node("n1")
        yield cluster


def daemonset(
    selector: dict[str, str], pod_labels: dict[str, str], strategy: str
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "operand", "namespace": NS, "labels": {"app": "operand"}},
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": strategy},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [{"name": "main", "image": "registry.local/op:v1"}]},
            },
        },
    }


def pods(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return [
        p
        for p in sim.store.list("pods", namespace=NS)
        if not p["metadata"].get("deletionTimestamp")
    ]


def owner_uid(pod: dict[str, Any]) -> str | None:
    refs = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return refs[0]["uid"] if refs else None


async def running_pod(sim: kubesim.Cluster) -> dict[str, Any]:
    def one_running() -> bool:
        found = pods(sim)
        return len(found) == 1 and (found[0].get("status") or {}).get("phase") == "Running"

    await eventually(
        one_running,
        "one running operand pod",
        state=lambda: [
            (p["metadata"]["name"], (p.get("status") or {}).get("phase")) for p in pods(sim)
        ],
    )
    return pods(sim)[0]


def events(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return [e for e in sim.store.list("events", namespace=NS) if e["reason"] == "SelectorChanged"]


async def test_new_selector_matching_the_old_pods_keeps_and_adopts_them(
    sim: kubesim.Cluster,
) -> None:
    # As NVIDIA's operator's validator looked before: selected on app only.
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace=NS)
    labels = {"app": "operand", "app.kubernetes.io/part-of": "gpu-operator"}
    try:
        await writer.apply(daemonset({"app": "operand"}, labels, "OnDelete"))
        before = await running_pod(sim)
        old_uid = sim.store.get("daemonsets", "operand", namespace=NS)["metadata"]["uid"]

        await writer.apply(daemonset(labels, labels, "OnDelete"))

        live = sim.store.get("daemonsets", "operand", namespace=NS)
        assert live["spec"]["selector"]["matchLabels"] == labels
        assert live["metadata"]["uid"] != old_uid
        await sim.wait_for(
            lambda: [owner_uid(p) for p in pods(sim)] == [live["metadata"]["uid"]],
            timeout=DEADLINE,
            message="the old pod adopted by the new DaemonSet",
        )
        assert pods(sim)[0]["metadata"]["uid"] == before["metadata"]["uid"]  # never restarted
        [event] = events(sim)
        assert event["type"] == "Warning"
        assert event["involvedObject"]["uid"] == live["metadata"]["uid"]
        assert (
            "app=operand to app=operand,app.kubernetes.io/part-of=gpu-operator"
            in (event["message"])
        )
        assert "1 pod(s) were kept and adopted" in event["message"]
    finally:
        await client.close()


async def test_new_selector_not_matching_the_old_pods_replaces_them(
    sim: kubesim.Cluster,
) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace=NS)
    try:
        await writer.apply(daemonset({"app": "operand"}, {"app": "operand"}, "RollingUpdate"))
        before = await running_pod(sim)
        new = {"app": "operand", "tier": "gpu"}

        await writer.apply(daemonset(new, new, "RollingUpdate"))

        after = await running_pod(sim)
        assert after["metadata"]["uid"] != before["metadata"]["uid"]
        assert after["metadata"]["labels"]["tier"] == "gpu"
        [event] = events(sim)
        assert "its pods are replaced" in event["message"]
    finally:
        await client.close()


async def test_other_rejections_are_not_treated_as_selector_changes(
    sim: kubesim.Cluster,
) -> None:
    client = kube_client.connect(str(sim.kubeconfig_path))
    writer = Writer(client, namespace=NS)
    bad = daemonset({"app": "operand"}, {"app": "other"}, "OnDelete")  # selector misses template
    try:
        with pytest.raises(Exception, match="selector"):
            await writer.apply(bad)
        assert sim.store.list("daemonsets", namespace=NS) == []
        assert events(sim) == []
    finally:
        await client.close()


def test_selector_helpers() -> None:
    assert labels_match({"app": "a"}, {"app": "a", "x": "1"})
    assert not labels_match({"app": "a", "x": "2"}, {"app": "a", "x": "1"})
    assert not labels_match({"app": "a"}, None)
    assert selector_text({"b": "2", "a": "1"}) == "a=1,b=2"
    assert selector_text({}) == "<none>"
