"""`gpu-operator explain policy` on the served demo with a GPUCluster (`--fleet dra --policy
examples/gpucluster-dra.yaml`), run as a user runs it, against the demo's kubeconfig next to the
real kubectl: the GPUCluster is ready with its states in NVIDIA's order and its requirements met
(the 580 driver read from the plugin's ResourceSlices); a ClusterPolicy created afterwards is
refused, and the explanation names it and the `kubectl delete` that resolves it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import KUBECTL
from waiting import DEADLINE, eventually

from gpu_operator.api import manifests
from gpu_operator.operands import dra_driver
from gpudemo import fleet

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gpucluster-dra.yaml"
CLI = [sys.executable, "-m", "gpu_operator"]
POLICY = ROOT / "examples" / "clusterpolicy-default.yaml"


async def explain_policy(kubeconfig: Path, *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "explain", "policy", "--kubeconfig", str(kubeconfig), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode or 0, out.decode()


async def test_explain_policy_follows_the_gpucluster_on_the_served_demo(tmp_path: Path) -> None:
    (cluster,) = [d for d in manifests.read(str(EXAMPLE)) if d.get("kind") == "GPUCluster"]
    async with serve_demo(tmp_path, fleet.resolve("dra"), policy=cluster) as (_sim, _nodes, kc):
        last: dict[str, Any] = {}

        async def ready() -> dict[str, Any] | None:
            code, out = await explain_policy(kc, "-o", "json")
            last.update(code=code, out=out)
            verdict = json.loads(out)
            return verdict if code == 0 and verdict["ready"] else None

        verdict = await eventually(ready, "explain policy to say ready", timeout=DEADLINE,
                                   interval=1.0, state=lambda: str(last))  # fmt: skip
        assert verdict["kind"] == "GPUCluster"
        assert verdict["name"] == "gpu-cluster"
        assert verdict["failedLink"] is None
        links = {link["id"]: link for link in verdict["links"]}
        assert [link["id"] for link in verdict["links"]][-4:] == list(dra_driver.STATES)
        assert links["conflict"]["status"] == "ok"
        assert links["kubernetes"]["status"] == "ok"
        # No GFD under a GPUCluster: the driver version comes from the plugin's slices.
        assert links["driver"]["status"] == "ok", links["driver"]
        assert "2 node(s)" in links["driver"]["summary"], links["driver"]
        assert "580.95.5" in links["driver"]["summary"], links["driver"]
        assert links[dra_driver.STATE_DRIVER]["status"] == "ok"
        assert (
            "nvidia-dra-driver-kubelet-plugin: 2/2 ready"
            in links[dra_driver.STATE_DRIVER]["summary"]
        )
        assert links[dra_driver.STATE_DCGM]["status"] == "skipped"
        assert links[dra_driver.STATE_VALIDATION]["status"] == "ok"

        code, tree = await explain_policy(kc)
        assert code == 0, tree
        assert "GPUCluster gpu-cluster (namespace gpu-operator): ready" in tree, tree
        order = [tree.index(state) for state in dra_driver.STATES]
        assert order == sorted(order), tree

        # A ClusterPolicy created now is refused (the GPUCluster runs); explain says which and
        # what to delete, and shows the refused ClusterPolicy's own status below.
        code, out = await run_kubectl(kc, "apply", "-f", str(POLICY))
        assert code == 0, out

        async def warned() -> dict[str, Any] | None:
            code, out = await explain_policy(kc, "-o", "json")
            last.update(code=code, out=out)
            verdict = json.loads(out)
            refused = (verdict.get("clusterPolicy") or {}).get("message") or ""
            return verdict if "conflict" in verdict["warnings"] and "refused" in refused else None

        verdict = await eventually(
            warned, "explain policy to name the conflict", timeout=DEADLINE, interval=1.0,
            state=lambda: str(last),
        )  # fmt: skip
        conflict = next(link for link in verdict["links"] if link["id"] == "conflict")
        assert "ClusterPolicy cluster-policy is refused" in conflict["summary"]
        assert conflict["fix"].startswith("kubectl delete clusterpolicy cluster-policy")
        assert verdict["clusterPolicy"]["ready"] is False
        code, tree = await explain_policy(kc)
        assert code == 0, tree  # the GPUCluster runs; the conflict is a warning
        assert "kubectl delete clusterpolicy cluster-policy" in tree, tree
        assert "ClusterPolicy cluster-policy: not ready" in tree, tree
        code, out = await run_kubectl(kc, "delete", "clusterpolicy", "cluster-policy")
        assert code == 0, out
