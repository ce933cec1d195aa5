"""`gpu-operator explain node` on a DRA node of the served demo (docs/dra.md, "Migrating from the
device plugin"): the node moved to DRA with the real kubectl (the stand-in DRA kubelet plugin
applied, the node labelled nvidia.com/dra-kubelet-plugin=true) explains usable through the DRA
chain (plugin registered, slices published); with the device plugin put back on it by hand
(nvidia.com/gpu.deploy.device-plugin=true) the hand-over link names the device plugin that still
serves the node."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import DEADLINE, eventually

from gpudemo import fleet

pytestmark = needs_kubectl
ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "examples" / "dra-migration" / "kubelet-plugin-standin.yaml"
DRA_NODE = "t4-1"
CLI = [sys.executable, "-m", "gpu_operator"]


async def _kubectl(kc: Path, *args: str) -> str:
    code, out = await run_kubectl(kc, *args)
    assert code == 0, out
    return out


async def _explain(kc: Path, node: str, *extra: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *CLI, "explain", "node", node, "--kubeconfig", str(kc), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def _verdict(kc: Path, node: str) -> tuple[int, dict[str, Any]]:
    code, out = await _explain(kc, node, "-o", "json")
    return code, json.loads(out)


def _links(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {link["id"]: link for link in verdict["links"]}


async def test_explain_node_follows_the_dra_chain_on_the_served_demo(tmp_path: Path) -> None:
    async with serve_demo(tmp_path, fleet.resolve("small")) as (_sim, _nodes, kc):
        await _kubectl(kc, "apply", "-f", str(STANDIN))
        await _kubectl(kc, "label", "node", DRA_NODE, "nvidia.com/dra-kubelet-plugin=true")

        async def usable() -> dict[str, Any] | None:
            code, verdict = await _verdict(kc, DRA_NODE)
            links = _links(verdict)
            slices = links.get("dra-slices", {})
            if code == 0 and slices.get("status") == "ok" and "4 device" in slices["summary"]:
                return verdict
            return None

        verdict = await eventually(
            usable, "explain node to follow the DRA chain to usable", timeout=DEADLINE, interval=1.0
        )
        links = _links(verdict)
        assert verdict["chain"] == "dra", verdict
        assert "device-plugin" not in links, verdict
        assert "allocatable" not in links, verdict
        assert links["dra-plugin"]["status"] == "ok", links["dra-plugin"]
        assert "registered with the kubelet" in links["dra-plugin"]["summary"]
        assert links["dra-handover"]["status"] == "ok", links["dra-handover"]
        assert links["deploy-labels"]["status"] == "ok", links["deploy-labels"]
        assert links["dra-claims"]["status"] == "ok", links["dra-claims"]
        code, tree = await _explain(kc, DRA_NODE)
        assert code == 0, tree
        assert "DRA kubelet plugin" in tree, tree
        assert "ResourceSlices" in tree, tree
        assert "device plugin:" not in tree, tree

        # Someone puts the device plugin back on the DRA node: the kubelet offers nvidia.com/gpu
        # again and the DRA plugin withdraws its devices; explain names the hand-over.
        await _kubectl(
            kc, "label", "node", DRA_NODE, "nvidia.com/gpu.deploy.device-plugin=true", "--overwrite"
        )

        async def handover() -> dict[str, Any] | None:
            code, verdict = await _verdict(kc, DRA_NODE)
            return verdict if code == 1 and verdict["failedLink"] == "dra-handover" else None

        verdict = await eventually(
            handover,
            "explain node to name the device plugin still serving",
            timeout=DEADLINE,
            interval=1.0,
        )
        link = _links(verdict)["dra-handover"]
        assert "the device plugin still serves the node" in link["summary"], link
        assert "nvidia.com/gpu: 4" in link["summary"], link
        assert "gpu.deploy.device-plugin=false --overwrite" in link["fix"], link
        code, tree = await _explain(kc, DRA_NODE)
        assert code == 1, tree
        assert "hand-over" in tree, tree
