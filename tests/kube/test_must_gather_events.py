"""must-gather keeps the Events the operator records in `default` about cluster-scoped objects."""

from __future__ import annotations

from typing import Any

import yaml

import kubesim
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import must_gather as mg

NS = "gpu-operator"


def event(name: str, kind: str, involved: str, reason: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "involvedObject": {"kind": kind, "name": involved},
        "reason": reason,
        "message": f"{reason} about {involved}",
        "type": "Warning",
    }


async def test_events_about_policies_drivers_and_gpu_nodes_in_default_are_gathered() -> None:
    async with kubesim.Cluster(node_filesystems=False) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        sim.add_node("gpu-a", labels={"nvidia.com/gpu.present": "true"})
        for name, kind, involved, reason in (
            ("e1", "ClusterPolicy", "cluster-policy", "StateFailed"),
            ("e2", "NVIDIADriver", "default", "DriverVersionUnsupported"),
            ("e3", "Node", "gpu-a", "StartupTaintRemoved"),
            ("e4", "Pod", "someone-elses-app", "BackOff"),
        ):
            sim.store.create(event(name, kind, involved, reason))
        client = kube_client.connect(str(sim.kubeconfig_path))
        try:
            archive = await mg.gather(client, NS, parallel=1)
        finally:
            await client.close()
    text = archive.files[f"{mg.ROOT}/namespaces/{NS}/events.yaml"].decode()
    reasons = {e["reason"] for e in yaml.safe_load_all(text) if e}
    assert {"StateFailed", "DriverVersionUnsupported", "StartupTaintRemoved"} <= reasons
    assert "BackOff" not in reasons  # about an object the operator has nothing to do with
