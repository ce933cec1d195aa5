"""The chart and the CRD hook command against kubesim, with the real kubectl."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import DEADLINE

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.controller.operator import Operator, Settings
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import crd_install
from kubesim.controllers.kubelet import KubeletConfig

from .conftest import CHART, HELM, KUBECTL, NAMESPACE, needs_helm

CP_CRD = "clusterpolicies.nvidia.com"
GPU_OPERATOR = Path(sys.executable).parent / "gpu-operator"


async def run(
    *argv: str, sim: kubesim.Cluster, stdin: str | None = None, kubeconfig: Path | None = None
) -> tuple[int, str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig or sim.kubeconfig_path)}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin else None, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 120)
    return proc.returncode or 0, out.decode()


def managers(obj: dict[str, Any]) -> set[str]:
    return {str(m.get("manager")) for m in obj["metadata"].get("managedFields") or []}


@pytest.fixture
async def sim() -> Any:
    async with kubesim.Cluster(authorization="rbac") as cluster:
        yield cluster


def hook_kubeconfig(sim: kubesim.Cluster, packaged_chart: Path, hook: str, *sets: str) -> Path:
    """Install one CRD hook's ServiceAccount and RBAC as rendered; a kubeconfig for that account."""
    args = [str(HELM), "template", "gpu-operator", str(packaged_chart), "-n", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    if sim.store.get("namespaces", NAMESPACE) is None:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    for doc in yaml.safe_load_all(proc.stdout):
        if doc and doc["kind"] in kinds and doc["metadata"]["name"] == hook:
            sim.store.create(doc)
    token = sim.auth.token_for_service_account(NAMESPACE, hook)
    return sim.auth.write_kubeconfig(token, sim.kubeconfig_path.with_name(hook))


async def test_apply_installs_then_upgrades_an_old_crd_without_conflicts(
    sim: kubesim.Cluster,
) -> None:
    old = crds.clusterpolicy_crd()
    del old["metadata"]["annotations"]
    schema = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["status"]["properties"]["states"]  # what an older schema lacks
    sim.store.create(old)
    assert crds.is_older(sim.store.get("customresourcedefinitions", CP_CRD) or {})
    client = kube_client.connect(str(sim.kubeconfig_path))
    try:
        names = await crd_install.apply(client, crds.all_crds().values())
        again = await crd_install.apply(client, crds.all_crds().values())
    finally:
        await client.close()
    assert names == again == [
        CP_CRD, "gpuclusters.nvidia.com", "nvidiadrivers.nvidia.com",
        "computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com",
    ]  # fmt: skip
    installed = sim.store.get("customresourcedefinitions", CP_CRD)
    assert installed is not None
    assert not crds.is_older(installed)
    assert "gpu-operator" in managers(installed)
    status = installed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "states" in status["properties"]


@needs_helm
async def test_crds_command_applies_and_deletes_with_the_hook_jobs_rbac(
    sim: kubesim.Cluster, packaged_chart: Path
) -> None:
    upgrade = hook_kubeconfig(sim, packaged_chart, "gpu-operator-upgrade-crd")
    cleanup = hook_kubeconfig(
        sim, packaged_chart, "gpu-operator-cleanup-crd", "operator.cleanupCRD=true"
    )
    code, out = await run(str(GPU_OPERATOR), "crds", "--apply", sim=sim, kubeconfig=upgrade)
    assert code == 0, out
    assert (
        f"customresourcedefinition/{CP_CRD} applied (schema version {crds.SCHEMA_VERSION})" in out
    )
    assert sim.store.get("customresourcedefinitions", "nvidiadrivers.nvidia.com") is not None
    assert sim.store.get("customresourcedefinitions", "gpuclusters.nvidia.com") is not None
    for crd in ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"):
        assert sim.store.get("customresourcedefinitions", crd) is not None
    # The upgrade hook's account may touch only our CRDs, and may not delete them.
    code, out = await run(str(KUBECTL), "delete", "crd", CP_CRD, sim=sim, kubeconfig=upgrade)
    assert code != 0
    assert "cannot delete resource" in out
    code, out = await run(str(GPU_OPERATOR), "crds", "--delete", sim=sim, kubeconfig=cleanup)
    assert code == 0, out
    assert sim.store.get("customresourcedefinitions", CP_CRD) is None
    assert sim.store.get("customresourcedefinitions", "computedomains.resource.nvidia.com") is None
    code, out = await run(str(GPU_OPERATOR), "crds", "--delete", sim=sim, kubeconfig=cleanup)
    assert code == 0, out  # nothing left to delete is not an error


async def test_crds_command_reports_an_unusable_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    proc = await asyncio.create_subprocess_exec(
        str(GPU_OPERATOR), "crds", "--apply", "--kubeconfig", str(missing),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 1
    assert "cannot load cluster configuration" in out.decode()


@needs_helm
@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed: run scripts/setup")
async def test_rendered_chart_applies_with_kubectl(
    sim: kubesim.Cluster, packaged_chart: Path
) -> None:
    sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    proc = await asyncio.create_subprocess_exec(
        str(CHART.parents[1] / ".tools" / "bin" / "helm"), "template", "gpu-operator",
        str(packaged_chart), "-n", NAMESPACE, "--include-crds", "--skip-tests",
        "-f", str(CHART / "ci" / "aks-rdma-values.yaml"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    manifest, errors = await proc.communicate()
    assert proc.returncode == 0, errors.decode()
    # Hooks run around install in a real release; here only the release objects are applied.
    docs = [d for d in yaml.safe_load_all(manifest) if d and "helm.sh/hook" not in (
        d["metadata"].get("annotations") or {})]  # fmt: skip
    crd_docs = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    for batch in (crd_docs, rest):
        code, out = await run(
            str(KUBECTL), "apply", "--server-side", "-f", "-", sim=sim,
            stdin=yaml.safe_dump_all(batch),
        )  # fmt: skip
        assert code == 0, out
    policy = sim.store.get("clusterpolicies.nvidia.com", "cluster-policy")
    assert policy is not None
    assert policy["spec"]["driver"]["rdma"] == {"enabled": True, "useHostMofed": False}
    assert sim.store.get("deployments", "gpu-operator", namespace=NAMESPACE) is not None
    assert sim.store.get("clusterroles", "gpu-operator") is not None
    code, out = await run(str(KUBECTL), "get", "clusterpolicy", sim=sim)
    assert code == 0, out
    assert "cluster-policy" in out


def rendered_release(packaged_chart: Path, values: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(HELM), "template", "gpu-operator", str(packaged_chart), "-n", NAMESPACE,
         "--include-crds", "-f", str(values)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [
        d
        for d in yaml.safe_load_all(proc.stdout)
        if d and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    ]


@needs_helm
async def test_operator_reconciles_the_installed_chart_to_ready(packaged_chart: Path) -> None:
    docs = rendered_release(packaged_chart, CHART / "ci" / "aks-rdma-values.yaml")
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-operator"
    )
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    gpu_labels = {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        keys.NFD_OS_ID: "ubuntu",
        keys.NFD_OS_VERSION_ID: "22.04",
        keys.NFD_KERNEL_FULL: "6.8.0-52-generic",
    }
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True), authorization="rbac") as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for doc in sorted(docs, key=lambda d: d["kind"] != "CustomResourceDefinition"):
            if doc["kind"] != "Deployment":  # the operator runs in-process instead
                sim.store.create(doc)
        sim.add_node("gpu-1", labels=gpu_labels)
        # The operator runs as the Deployment's ServiceAccount, under the chart's RBAC.
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = sim.auth.token_for_service_account(NAMESPACE, account)
        kubeconfig = sim.auth.write_kubeconfig(token, sim.kubeconfig_path.with_name("operator"))
        client = kube_client.connect(str(kubeconfig))
        operator = Operator(client, Settings(namespace=NAMESPACE, operator_env=env))
        task = asyncio.create_task(operator.run())
        try:

            def ready() -> bool:
                policy = sim.store.get("clusterpolicies.nvidia.com", "cluster-policy") or {}
                return bool((policy.get("status") or {}).get("state") == "ready")

            await sim.wait_for(ready, timeout=DEADLINE, message="cluster-policy ready")
            daemonsets = {
                d["metadata"]["name"] for d in sim.store.list("daemonsets", namespace=NAMESPACE)
            }
            assert "nvidia-driver-daemonset" in daemonsets
            assert "nvidia-mig-manager" not in daemonsets  # disabled by the AKS values
            assert not sim.auth.denials, list(sim.auth.denials)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


@needs_helm
@pytest.mark.parametrize(
    "values", sorted(p.name for p in (CHART / "ci").glob("*.yaml")), ids=lambda v: v[:-12]
)
async def test_the_operator_never_hits_a_403_under_the_charts_rbac(
    packaged_chart: Path, values: str
) -> None:
    docs = rendered_release(packaged_chart, CHART / "ci" / values)
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-operator"
    )
    env = {
        e["name"]: e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e
    }
    labels = {
        "feature.node.kubernetes.io/pci-10de.present": "true",
        keys.NFD_OS_ID: "ubuntu",
        keys.NFD_OS_VERSION_ID: "22.04",
        keys.NFD_KERNEL_FULL: "6.8.0-52-generic",
    }
    # The air-gapped values (ci/custom-registry-values.yaml) pull from a private mirror: the
    # simulated one holds the images, as the user's would.
    mirror = ["registry.example.com/*"]
    async with kubesim.Cluster(
        kubelet=KubeletConfig(instant=True), authorization="rbac", images=mirror
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for doc in sorted(docs, key=lambda d: d["kind"] != "CustomResourceDefinition"):
            if doc["kind"] != "Deployment":
                sim.store.create(doc)
        # Every workload kind a values file may target: containers, VM passthrough and vGPU.
        sim.add_node("gpu-1", labels=labels)
        sim.add_node("gpu-2", labels={**labels, keys.MIG_CAPABLE: "true"})
        sim.add_node("vm-1", labels={**labels, "nvidia.com/gpu.workload.config": "vm-passthrough"})
        sim.add_node("vgpu-1", labels={**labels, "nvidia.com/gpu.workload.config": "vm-vgpu"})
        account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        token = sim.auth.token_for_service_account(NAMESPACE, account)
        kubeconfig = sim.auth.write_kubeconfig(token, sim.kubeconfig_path.with_name("operator"))
        client = kube_client.connect(str(kubeconfig))
        operator = Operator(client, Settings(namespace=NAMESPACE, operator_env=env))
        task = asyncio.create_task(operator.run())
        try:

            def ready() -> bool:
                policy = sim.store.get("clusterpolicies.nvidia.com", "cluster-policy") or {}
                return bool((policy.get("status") or {}).get("state") == "ready")

            await sim.wait_for(
                ready, timeout=DEADLINE, message=f"cluster-policy ready with {values}"
            )
            assert not sim.auth.denials, list(sim.auth.denials)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
