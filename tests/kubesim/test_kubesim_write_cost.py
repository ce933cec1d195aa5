"""What a fleet rollout costs kubesim per pod: the kubelet's status writes are built in the form
the API server stores (so the store need not decode them again), and Events are recorded and
aggregated as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, instant
from waiting import eventually

import kubesim
from kubesim import validation
from kubesim.store import Store


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "init", "image": "example/app:1"}],
            "containers": [{"name": "main", "image": "example/app:1"}],
            **spec,
        },
    }


async def test_kubelet_status_writes_are_stored_without_decoding_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status_decodes: list[str] = []
    trusted_writes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    decode = validation.decode
    replace = Store.replace

    def counting_decode(rt: Any, obj: dict[str, Any], old: Any = None) -> None:
        if rt.kind == "Pod" and set(obj) == {"apiVersion", "kind", "metadata", "status"}:
            status_decodes.append(obj["metadata"]["name"])
        decode(rt, obj, old)

    def checking_replace(self: Store, rt: Any, obj: dict[str, Any], **kw: Any) -> Any:
        if kw.get("trusted"):
            # What decoding would have made of the body: it must be the body itself.
            decoded = copy.deepcopy(obj)
            decode(rt, decoded, None)
            trusted_writes.append((copy.deepcopy(obj), decoded))
        return replace(self, rt, obj, **kw)

    monkeypatch.setattr(validation, "decode", counting_decode)
    monkeypatch.setattr(Store, "replace", checking_replace)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.store.create(pod("web"))
        sim.store.create(pod("gone", restartPolicy="Never"))

        def running() -> bool:
            found = sim.store.get("pods", "web", "default") or {}
            return (found.get("status") or {}).get("phase") == "Running"

        await eventually(running, "pod web Running")
        stored = sim.store.get("pods", "web", "default")
        assert stored is not None

    assert trusted_writes, "the kubelet wrote no status"
    assert status_decodes == []  # before: every kubelet status write was decoded again
    for body, decoded in trusted_writes:
        assert body == decoded
    # The conditions carry what the real API server returns for them, minus null fields.
    for condition in stored["status"]["conditions"]:
        assert set(condition) >= {"type", "status", "lastTransitionTime"}
        assert "lastProbeTime" not in condition


async def test_client_status_writes_are_still_decoded() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.store.create(pod("web"))
        rt = sim.store.registry.resolve("pods")
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "status": {"phase": 7},
        }
        with pytest.raises(kubesim.ApiError, match="phase"):
            sim.store.replace(rt, body, namespace="default", name="web", subresource="status")
        # `trusted` is for the store's in-process writers; a wrong type there is still refused
        # for a body that is not a status write.
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": 3},
        }
        with pytest.raises(kubesim.ApiError, match="containers"):
            sim.store.replace(rt, body, namespace="default", name="web", trusted=True)


async def test_repeated_events_still_aggregate_into_one_with_a_count() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.store.create(pod("web"))
        web = sim.store.get("pods", "web", "default")
        assert web is not None
        recorder = sim.kubelet.events
        for _ in range(3):
            recorder.record(web, "Warning", "BackOff", "Back-off", component="kubelet", host="n")
        found = [
            e
            for e in sim.store.list("events", "default")
            if e["reason"] == "BackOff" and e["involvedObject"]["name"] == "web"
        ]
        assert [e["count"] for e in found] == [3]
