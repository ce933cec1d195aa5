"""`gpu-operator explain node` on the demo, run as a user runs it (the command against the demo's
kubeconfig, next to the real kubectl): a healthy node exits 0; each broken link of the chain
(a driver Secure Boot refuses, an unwritable containerd drop-in, a GPU with an ECC error, an AKS
preinstalled driver) is named first and exits 1."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from demo_served import serve_demo
from kubesim_helpers import KUBECTL, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.nodes.coexist import CoexistPolicy
from gpudemo import fleet, session

pytestmark = needs_kubectl
NS = session.NAMESPACE
CLI = [sys.executable, "-m", "gpu_operator"]


@dataclass
class Demo:
    sim: kubesim.Cluster
    kubeconfig: Path

    async def run(self, *argv: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()

    async def kubectl(self, *args: str) -> str:
        code, out = await self.run(str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args)
        assert code == 0, out
        return out

    async def explain(self, node: str) -> tuple[int, dict[str, Any]]:
        code, out = await self.run(
            *CLI, "explain", "node", node, "-o", "json", "--kubeconfig", str(self.kubeconfig)
        )
        return code, json.loads(out)

    async def until_link(self, node: str, link: str, timeout: float = DEADLINE) -> dict[str, Any]:
        """The explain verdict once it names `link` first (the fault takes a moment to show)."""
        last: dict[str, Any] = {}

        async def named() -> dict[str, Any] | None:
            code, verdict = await self.explain(node)
            last.update(code=code, verdict=verdict)
            if verdict.get("failedLink") != link:
                return None
            assert code == 1
            return verdict

        return await eventually(
            named,
            f"explain to name {link} on {node}",
            timeout=timeout,
            interval=0.5,
            state=lambda: json.dumps(last, indent=1),
        )

    def pod_name(self, app: str, node: str) -> str:
        for pod in self.sim.store.list("pods", NS):
            labels = pod["metadata"].get("labels") or {}
            if labels.get("app") == app and pod["spec"].get("nodeName") == node:
                return str(pod["metadata"]["name"])
        raise AssertionError(f"no {app} pod on {node}")

    async def until(self, check: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
        await eventually(check, what, timeout=timeout)


@asynccontextmanager
async def served(
    pools: list[dict[str, Any]] | str, tmp_path: Path, *, timeout: float = DEADLINE, **options: Any
) -> AsyncIterator[Demo]:
    chosen = fleet.NAMED[pools] if isinstance(pools, str) else fleet.parse({"pools": pools})
    wait = timeout + DEADLINE
    async with serve_demo(tmp_path, chosen, timeout=timeout, wait=wait, **options) as served_:
        yield Demo(served_[0], served_[2])


A100 = [{"name": "a100", "machine": "dgx-a100"}, {"name": "cpu"}]
ECC_ERROR = "uncorrectable ECC error encountered"


async def test_explain_holds_on_a_healthy_node_and_names_a_failing_cuda_workload(
    tmp_path: Path,
) -> None:
    async with served(A100, tmp_path) as demo:
        code, verdict = await demo.explain("a100-1")
        assert code == 0, json.dumps(verdict, indent=1)
        assert verdict["usable"] is True
        links = {link["id"]: link for link in verdict["links"]}
        assert links["allocatable"]["summary"] == "8 GPU(s) allocatable"
        assert links["driver"]["status"] == "ok"

        # The human form: a tree that says so.
        code, text = await demo.run(
            *CLI, "explain", "node", "a100-1", "--kubeconfig", str(demo.kubeconfig)
        )
        assert code == 0, text
        assert "node a100-1: usable" in text, text

        code, verdict = await demo.explain("cpu-1")
        assert code == 1
        assert verdict["failedLink"] == "gpu-detected"
        code, out = await demo.run(
            *CLI, "explain", "node", "nope", "--kubeconfig", str(demo.kubeconfig)
        )
        assert code == 2, out
        assert out.strip() == "error: node 'nope' not found", out

        # A GPU with an uncorrectable ECC error: the CUDA validation workload fails.
        driver = demo.pod_name("nvidia-driver-daemonset", "a100-1")
        await demo.kubectl(
            "-n", NS, "exec", driver, "-c", "nvidia-driver-ctr", "--", "demo-gpu-fault", "ecc", "0"
        )
        validator = demo.pod_name("nvidia-operator-validator", "a100-1")
        await demo.kubectl("-n", NS, "delete", "pod", validator, "--wait=false")
        verdict = await demo.until_link("a100-1", "validator")
        failed = verdict["links"][-1]
        assert failed["summary"].startswith("cuda-validation: "), failed
        assert ECC_ERROR in json.dumps(failed["evidence"]), failed
        assert "nvidia-smi -r" in failed["fix"]

        # The same chain, from the operator's caches, names the link in the policy's status.
        jsonpath = '{.status.conditions[?(@.type=="Ready")].message}'

        # Waited for as kubectl shows it: while the validator pod restarts, the message may name
        # its init containers starting again (plugin-validation in PodInitializing) for a while.
        wanted = "first failing link: node a100-1: validator failed: cuda-validation"
        shown = [""]

        async def named() -> bool:
            shown[0] = await demo.kubectl("get", "clusterpolicy", session.POLICY_NAME, "-o",
                                          f"jsonpath={jsonpath}")  # fmt: skip
            return wanted in shown[0]

        await eventually(
            named,
            "the Ready message to name the failing link",
            interval=0.2,
            state=lambda: shown[0],
        )


@pytest.mark.slow
async def test_explain_names_a_driver_secure_boot_refuses(tmp_path: Path) -> None:
    pools = [{"name": "sb", "machine": "t4x4", "secureBoot": True}]
    async with served(pools, tmp_path, timeout=3.0) as demo:
        verdict = await demo.until_link("sb-1", "driver")
        failed = verdict["links"][-1]
        refusal = "Key was rejected by service"
        assert refusal in failed["summary"] or refusal in json.dumps(failed["evidence"]), failed
        assert "Secure Boot" in failed["fix"]
        assert [link["id"] for link in verdict["links"]][-2:] == ["driver-manager", "driver"]


@pytest.mark.slow
async def test_explain_names_an_unwritable_containerd_drop_in(tmp_path: Path) -> None:
    async with served(A100, tmp_path) as demo:
        drop_in = demo.sim.node_root("a100-1") / "etc/containerd/conf.d/99-nvidia.toml"
        toolkit = demo.pod_name("nvidia-container-toolkit-daemonset", "a100-1")
        await demo.kubectl("-n", NS, "delete", "pod", toolkit, "--wait=false")
        await demo.until(lambda: not drop_in.exists(), "the old toolkit pod to restore the node")
        drop_in.mkdir()
        verdict = await demo.until_link("a100-1", "toolkit")
        failed = verdict["links"][-1]
        assert "configuring containerd failed" in json.dumps(failed), failed


async def test_explain_says_nfd_found_the_aks_preinstalled_driver_and_the_node_works(
    tmp_path: Path,
) -> None:
    async with served("aks-preinstalled", tmp_path) as demo:
        code, verdict = await demo.explain("t4-1")
        assert code == 0, json.dumps(verdict, indent=1)
        driver = next(link for link in verdict["links"] if link["id"] == "driver")
        assert driver["status"] == "ok", driver
        text = json.dumps(driver["evidence"])
        assert "set by the operator's coexistence detector" in text, text
        assert "NFD saw the kernel module nvidia loaded (NodeFeature gpu-operator/t4-1" in text


@pytest.mark.slow
async def test_explain_names_an_aks_preinstalled_driver(tmp_path: Path) -> None:
    # The detector told to ignore it: the driver manager finds the host driver instead.
    ignore = {"coexist": CoexistPolicy(managed_driver="ignore")}
    async with served("aks-preinstalled", tmp_path, operator_settings=ignore) as demo:
        verdict = await demo.until_link("t4-1", "driver")
        failed = verdict["links"][-1]
        assert "preinstalled NVIDIA driver while driver.enabled=true" in failed["summary"]
        assert "--gpu-driver none" in failed["fix"]


# What docs/troubleshooting.md says the archive holds (paths under must-gather/).
DOCUMENTED = (
    "MANIFEST.txt", "cluster/clusterpolicies.yaml", "cluster/nvidiadrivers.yaml",
    "cluster/gpu-nodes.yaml", "namespaces/gpu-operator/pods.yaml",
    "namespaces/gpu-operator/daemonsets.yaml", "namespaces/gpu-operator/deployments.yaml",
    "namespaces/gpu-operator/events.yaml", "rendered.yaml", "explain/a100-1.json",
)  # fmt: skip


async def test_must_gather_archives_what_the_docs_list_and_never_a_secret(tmp_path: Path) -> None:
    import tarfile

    async with served(A100, tmp_path) as demo:
        secret = "s3cr3t-value-never-in-the-archive"
        await demo.kubectl("-n", NS, "create", "secret", "generic", "ngc",
                           f"--from-literal=NGC_API_KEY={secret}")  # fmt: skip
        target = tmp_path / "mg.tar.gz"
        code, out = await demo.run(
            *CLI, "must-gather", "-o", str(target), "--kubeconfig", str(demo.kubeconfig)
        )
        assert code == 0, out
        assert f"wrote {target}" in out
        # The demo holds no credential: the operator's own objects and logs are not taken for one.
        assert ", 0 value(s) redacted" in out, out
        with tarfile.open(target, "r:gz") as tar:
            contents = {m.name.removeprefix("must-gather/"): m for m in tar.getmembers()}
            for path in DOCUMENTED:
                assert path in contents, sorted(contents)
            assert "explain/cpu-1.json" not in contents  # GPU nodes only
            logs = [p for p in contents if p.startswith("logs/")]
            assert any(p.endswith("/nvidia-driver-ctr.log") for p in logs), logs
            assert any("/k8s-driver-manager.log" in p for p in logs), logs
            text = b"".join(
                (tar.extractfile(m) or io.BytesIO()).read() for m in contents.values()
            ).decode()
        assert "kind: Secret" not in text
        assert secret.encode().hex() not in text
        assert secret not in text
        assert "eyJ" not in text  # no service account token
        manifest = text  # the manifest lists the limits it ran under
        assert "2000 lines and 262144 bytes per log" in manifest


CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"
STALE_MIG = "label says nvidia.com/mig.config=all-1g.5gb but the MIG manager is disabled"


async def test_explain_flags_stale_mig_and_workload_labels_and_agrees_with_the_ready_policy(
    tmp_path: Path,
) -> None:
    # The MIG manager disabled, an A100 node still labelled with a MIG config (and the state a
    # MIG manager once wrote) although its GPUs are whole; sandbox workloads off, a T4 node
    # labelled for VM passthrough that serves its GPUs to pods.
    policy = copy.deepcopy(session.DEFAULT_POLICY)
    policy["spec"]["migManager"] = {"enabled": False}
    stale = {"nvidia.com/mig.config": "all-1g.5gb", "nvidia.com/mig.config.state": "success"}
    pools = [
        {"name": "a100", "machine": "dgx-a100", "labels": stale},
        {"name": "vm", "machine": "t4x4", "workload": "vm-passthrough"},
    ]
    async with served(pools, tmp_path, policy=policy) as demo:
        # What kubectl shows: a ready policy, the stale label, eight whole GPUs allocatable.
        status = json.loads(await demo.kubectl("get", "clusterpolicy", session.POLICY_NAME,
                                               "-o", "jsonpath={.status}"))  # fmt: skip
        assert status["state"] == "ready", status
        node = json.loads(await demo.kubectl("get", "node", "a100-1", "-o", "json"))
        assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.5gb"
        allocatable = node["status"]["allocatable"]
        assert allocatable["nvidia.com/gpu"] == "8", allocatable
        assert not [k for k in allocatable if k.startswith("nvidia.com/mig-")], allocatable

        code, verdict = await demo.explain("a100-1")
        assert code == 0, json.dumps(verdict, indent=1)
        assert verdict["usable"] is True
        mig = next(link for link in verdict["links"] if link["id"] == "mig")
        assert mig["summary"].startswith(STALE_MIG), mig
        assert mig["status"] == "warning"
        assert verdict["warnings"] == ["mig"], json.dumps(verdict, indent=1)
        assert mig["summary"].endswith(
            "and the GPUs show no MIG devices (whole GPUs, no MIG devices): the label is stale"
        )
        assert "applied" not in mig["summary"]
        assert {"kind": "resource", "ref": "allocatable", "text": "nvidia.com/gpu: 8"} in (
            mig["evidence"]
        )
        assert "kubectl label node a100-1 nvidia.com/mig.config-" in mig["fix"]
        code, text = await demo.run(
            *CLI, "explain", "node", "a100-1", "--kubeconfig", str(demo.kubeconfig)
        )
        assert code == 0, text
        assert "node a100-1: usable, 1 warning" in text, text
        assert "! MIG: label says nvidia.com/mig.config=all-1g.5gb but" in text, text

        # The VM label has no effect: the node serves pods (one holds two of its GPUs).
        pod = tmp_path / "two.json"
        pod.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two-gpus"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "vm-1"},
                     "containers": [{"name": "work", "image": CUDA,
                                     "command": ["sleep", "infinity"],
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        }))  # fmt: skip
        await demo.kubectl("create", "-f", str(pod))
        await demo.kubectl(
            "wait", "pod/two-gpus", "--for=condition=Ready", f"--timeout={DEADLINE:g}s"
        )
        code, verdict = await demo.explain("vm-1")
        assert code == 0, json.dumps(verdict, indent=1)
        assert verdict["warnings"] == ["deploy-labels"], json.dumps(verdict, indent=1)
        links = {link["id"]: link for link in verdict["links"]}
        assert links["deploy-labels"]["summary"] == (
            "label says nvidia.com/gpu.workload.config=vm-passthrough but "
            "sandboxWorkloads.enabled=false: the label has no effect and the node is a container "
            "node (allocatable nvidia.com/gpu: 4, 2 in use by 1 pod(s))"
        )
        assert links["allocatable"]["summary"] == "4 GPU(s) allocatable, 2 in use by 1 pod(s)"
