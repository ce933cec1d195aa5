"""A planned driver upgrade on the served demo (the chart installed with the real helm, the real
node agents), driven and read with the real kubectl (issue 30, items 5 and 6): the ClusterPolicy
is not ready with reason DriverUpgradeInProgress and never Error=True while it runs; each node
records one upgrade-start Event, and each state's StateReady Event comes once for the upgrade,
not once per node or pass (as `kubectl get events` counts them)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE, eventually

from gpu_operator.status import conditions
from gpu_operator.upgrade import states
from gpudemo import fleet
from kubesim.store import Event

HELM = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "helm"
pytestmark = [
    needs_kubectl,
    pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup"),
]
GPU_NODES = ("dgx-a100-1", "t4-1")


async def kubectl(kubeconfig: Path, *args: str) -> str:
    code, out = await run_kubectl(kubeconfig, *args)
    assert code == 0, out
    return out


async def told(kubeconfig: Path, reason: str) -> Counter[tuple[str, str]]:
    """(object, message) -> times told, summing each Event's count as kubectl shows it."""
    out = await kubectl(
        kubeconfig, "get", "events", "-n", "default", "--field-selector", f"reason={reason}",
        "-o", "json",
    )  # fmt: skip
    counts: Counter[tuple[str, str]] = Counter()
    for item in json.loads(out)["items"]:
        counts[(item["involvedObject"]["name"], item["message"])] += int(item.get("count") or 1)
    return counts


async def test_a_planned_driver_upgrade_on_the_demo_pages_nobody(tmp_path: Path) -> None:
    # The chart turns automatic driver upgrades on, as a helm install does.
    served = serve_demo(tmp_path, fleet.NAMED["small"], install="helm")
    async with served as (sim, _, kubeconfig):
        seen: list[dict[str, Any]] = []

        def record(event: Event) -> None:
            found = (event.new.obj.get("status") or {}).get("conditions") or []
            seen.append({c.get("type"): c for c in found})

        def upgrade_states() -> dict[str, str]:
            return {
                n: str((sim.store.get("nodes", n) or {}).get("metadata", {}).get("labels", {})
                       .get(states.STATE_LABEL, ""))
                for n in GPU_NODES
            }  # fmt: skip

        await eventually(
            lambda: set(upgrade_states().values()) == {states.UPGRADE_DONE}, "nodes upgrade-done"
        )
        ready_before = await told(kubeconfig, "StateReady")
        stop = sim.store.subscribe(record, keys=[("nvidia.com", "clusterpolicies")])
        try:
            await kubectl(
                kubeconfig, "patch", "clusterpolicy", "cluster-policy", "--type", "merge",
                "-p", json.dumps({"spec": {"driver": {"version": "580.105.08"}}}),
            )  # fmt: skip

            last: dict[str, Any] = {}

            async def upgraded() -> bool:
                last["ready seen"] = [c.get("Ready", {}).get("status") for c in seen][-6:]
                last["node states"] = upgrade_states()
                if not any(c.get("Ready", {}).get("status") == "False" for c in seen):
                    return False  # not started yet
                out = await kubectl(
                    kubeconfig, "get", "clusterpolicy", "cluster-policy", "-o",
                    "jsonpath={.status.state}",
                )  # fmt: skip
                last["policy state"] = out
                done = set(upgrade_states().values()) == {states.UPGRADE_DONE}
                return done and out == "ready"

            # On expiry, say which was behind: the nodes' states or the policy's status.
            await eventually(
                upgraded, "the upgrade done and the policy ready", timeout=DEADLINE,
                state=lambda: dict(last),
            )  # fmt: skip
        finally:
            stop()
        errors = [c["Error"] for c in seen if c.get("Error", {}).get("status") == "True"]
        assert errors == [], errors[:3]
        progress = {c["Ready"]["reason"] for c in seen if c["Ready"].get("status") == "False"}
        assert progress == {conditions.DRIVER_UPGRADE_IN_PROGRESS}, seen
        started = await told(kubeconfig, states.EVENT_REASON)
        for node in GPU_NODES:
            count = sum(c for (n, m), c in started.items() if n == node and "started" in m)
            assert count == 1, (node, started)
        ready_after = await told(kubeconfig, "StateReady") - ready_before
        # The driver was replaced and the validator re-ran on both nodes: told once each.
        assert ready_after[("cluster-policy", "state-driver is ready")] == 1, ready_after
        assert all(count == 1 for count in ready_after.values()), ready_after
