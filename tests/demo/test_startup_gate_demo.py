"""The readiness gate on the demo installed with the real helm, as a user sees it through the real
kubectl: GPU nodes register with the cluster autoscaler's startup taint; a GPU pod created right
after `helm install` stays Pending with the scheduler naming the taint; the real chain (driver,
toolkit, device plugin, validator) validates the healthy node and the operator removes the taint
there, and only there: the pod runs and lists its GPU, while a node whose driver Secure Boot
refuses keeps its taint, and `explain node`, `explain policy` and the ClusterPolicy status say it
waits at the gate."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from demo_served import run_kubectl
from kubesim_helpers import needs_kubectl
from rich.console import Console
from waiting import DEADLINE, deadline, eventually

from gpu_operator.controller import nodelabels
from gpudemo import fleet, install, programs, session

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts" / "gpu-operator" / "ci" / "startup-taint-values.yaml"
HELM = ROOT / ".tools" / "bin" / "helm"
pytestmark = [
    needs_kubectl,
    pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup"),
]
KEY = fleet.STARTUP_TAINT["key"]
CLI = [sys.executable, "-m", "gpu_operator"]
CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"
# One healthy GPU node and one whose kernel refuses the operator's unsigned driver: both
# register with the startup taint, as the autoscaled node pool would.
GATED = fleet.parse(
    {
        "pools": [
            {"name": "a100", "machine": "dgx-a100", "taints": [fleet.STARTUP_TAINT]},
            {"name": "sb", "machine": "t4x4", "secureBoot": True, "taints": [fleet.STARTUP_TAINT]},
            {"name": "cpu"},
        ]
    },
    "gated.yaml",
)
GPU_POD = json.dumps(
    {
        "spec": {
            "containers": [
                {
                    "name": "smi",
                    "image": CUDA,
                    "command": ["nvidia-smi", "-L"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        }
    }
)


@dataclass
class Demo:
    kubeconfig: Path

    async def run(self, *argv: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()

    async def kubectl(self, *args: str, check: bool = True) -> str:
        code, out = await run_kubectl(self.kubeconfig, *args)
        assert code == 0 or not check, out
        return out

    async def taints(self, node: str) -> list[dict[str, str]]:
        out = await self.kubectl("get", "node", node, "-o", "jsonpath={.spec.taints}")
        return list(json.loads(out)) if out.strip() else []

    async def explain(self, *what: str) -> tuple[int, dict[str, Any]]:
        code, out = await self.run(
            *CLI, "explain", *what, "-o", "json", "--kubeconfig", str(self.kubeconfig)
        )
        return code, json.loads(out)

    async def until(
        self, check: Callable[[], Awaitable[bool]], what: str, timeout: float = DEADLINE
    ) -> None:
        await eventually(check, what, timeout=timeout, interval=0.3)


@asynccontextmanager
async def helm_demo(tmp_path: Path) -> AsyncIterator[Demo]:
    """The demo through `helm install -f startup-taint-values.yaml`, reachable with kubectl from
    the moment the cluster serves (long before it converged: the Secure Boot node never does)."""
    kubeconfig = tmp_path / "kubeconfig"
    buffer = io.StringIO()
    options = session.Options(
        fleet=GATED,
        install="helm",
        values=[VALUES],
        chart=install.find_chart(),
        serve=True,
        kubeconfig_out=kubeconfig,
        timing=programs.Timing(scale=0.0),
        timeout=180.0,
        live=False,
    )
    task = asyncio.ensure_future(session.run(options, Console(file=buffer, width=200)))
    demo = Demo(kubeconfig)

    async def serving() -> bool:
        assert not task.done(), buffer.getvalue()
        return kubeconfig.is_file() and (await run_kubectl(kubeconfig, "get", "nodes"))[0] == 0

    try:
        await demo.until(serving, "the demo cluster to serve")
        yield demo
    except BaseException:
        print(buffer.getvalue())
        raise
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.slow
async def test_autoscaled_gpu_nodes_open_to_gpu_pods_only_once_their_chain_validated(
    tmp_path: Path,
) -> None:
    async with helm_demo(tmp_path) as demo:
        # The node pool registered its GPU nodes with the startup taint.
        for node in ("a100-1", "sb-1"):
            assert [t["key"] for t in await demo.taints(node)] == [KEY]

        # Right after `helm install` started, the seed documents' GPU pod.
        async def installing() -> bool:
            out = await demo.kubectl("get", "namespace", session.NAMESPACE, check=False)
            return "Active" in out

        await demo.until(installing, "helm install to create its namespace")
        await demo.kubectl(
            "run", "smi", "--restart=Never", f"--image={CUDA}", f"--overrides={GPU_POD}"
        )

        async def unschedulable() -> bool:
            out = await demo.kubectl("describe", "pod", "smi")
            return "FailedScheduling" in out

        await demo.until(unschedulable, "the pod to be unschedulable")
        described = await demo.kubectl("describe", "pod", "smi")
        assert f"had untolerated taint {{{KEY}: true}}" in described, described

        # The chain validates a100-1 for real; the operator then removes the taint there.
        async def opened() -> bool:
            return not await demo.taints("a100-1")

        await demo.until(opened, "the startup taint to leave a100-1", timeout=deadline(90))
        events = await demo.kubectl(
            "get", "events", "--field-selector",
            f"involvedObject.name=a100-1,reason={nodelabels.GATE_REASON}",
        )  # fmt: skip
        assert f"removed the startup taint {KEY}=true:NoSchedule" in events, events

        async def done() -> bool:
            phase = await demo.kubectl("get", "pod", "smi", "-o", "jsonpath={.status.phase}")
            assert phase != "Failed", await demo.kubectl("describe", "pod", "smi")
            return phase == "Succeeded"

        await demo.until(done, "the GPU pod to run")
        assert (
            await demo.kubectl("get", "pod", "smi", "-o", "jsonpath={.spec.nodeName}")
        ) == "a100-1"
        listed = await demo.kubectl("logs", "smi")
        assert listed.startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-"), listed
        code, verdict = await demo.explain("node", "a100-1")
        assert code == 0, json.dumps(verdict, indent=1)
        gate = {link["id"]: link for link in verdict["links"]}["gate"]
        assert gate["status"] == "ok"
        assert verdict["startupGate"] is None

        # The Secure Boot node never validates: it keeps its taint, and everyone says so.
        assert [t["key"] for t in await demo.taints("sb-1")] == [KEY]
        waiting = "1 node(s) wait at the startup gate: sb-1 (no allocatable GPUs, validator not"

        async def named() -> bool:
            message = await demo.kubectl(
                "get", "clusterpolicy", session.POLICY_NAME,
                "-o", 'jsonpath={.status.conditions[?(@.type=="Ready")].message}',
            )  # fmt: skip
            return waiting in message

        await demo.until(named, "the ClusterPolicy status to name sb-1 at the gate")
        code, report = await demo.explain("policy")
        assert code == 1
        assert waiting in report["message"]
        code, verdict = await demo.explain("node", "sb-1")
        assert code == 1
        assert verdict["failedLink"] == "driver"
        still = f"the startup taint {KEY}=true:NoSchedule is still on the node"
        assert still in verdict["startupGate"]
        code, text = await demo.run(
            *CLI, "explain", "node", "sb-1", "--kubeconfig", str(demo.kubeconfig)
        )
        assert code == 1
        assert "startup gate:" in text
