"""The demo's closing summary tells what the ClusterPolicy adds to "ready": coexistence findings and
nodes waiting at the startup gate, read from its Ready condition."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import crds
from gpu_operator.demo import view
from kubesim.store import Store

POLICIES = "clusterpolicies.nvidia.com"
# The fields the CRD requires (each may be empty).
REQUIRED = ("operator", "daemonsets", "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm",
            "nodeStatusExporter", "gfd")  # fmt: skip
SPEC: dict[str, Any] = {key: {} for key in REQUIRED}
FINDING = "coexistence: managed-driver on 2 node(s) (t4-1, t4-2): adapt (see node events)"


def _store(*policies: dict[str, Any]) -> Store:
    store = Store()
    store.create(crds.all_crds()["nvidia.com_clusterpolicies.yaml"])
    for policy in policies:
        created = store.create(policy)
        store.update({**created, "status": policy["status"]}, status=True)
    return store


def _policy(name: str, state: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
        "spec": SPEC,
        "status": {"state": state, "conditions": [{"type": "Ready", "message": message}]},
    }  # fmt: skip


def test_the_summary_shows_the_active_policys_notes() -> None:
    store = _store(
        _policy("old", "ignored", "ignored; another policy is active"),
        _policy("cluster-policy", "ready", f"all operand states ready on 2 GPU node(s); {FINDING}"),
    )
    summary = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [], policy_notes=view._policy_notes(store))
    assert summary.policy_notes == FINDING
    assert f"  policy notes:     {FINDING}" in view.summary_lines(summary)


def test_a_plain_ready_policy_adds_no_line() -> None:
    store = _store(_policy("cluster-policy", "ready", "all operand states ready on 2 GPU node(s)"))
    assert view._policy_notes(store) == ""
    summary = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [])
    assert not [line for line in view.summary_lines(summary) if "policy notes" in line]
