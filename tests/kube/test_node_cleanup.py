"""`gpu-operator cleanup-nodes`: after uninstall, nodes lose exactly the labels we recorded."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from waiting import DEADLINE

import kubesim
from gpu_operator.api import keys
from gpu_operator.kube import node_cleanup, node_features
from gpu_operator.nodes import ledger
from kubesim import KubeletConfig

GPU_OPERATOR = Path(sys.executable).parent / "gpu-operator"


def test_node_patch_removes_the_operators_and_gfds_labels_only() -> None:
    labels = {
        keys.GPU_PRESENT: "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "false",  # a human changed it: not ours any more
        "nvidia.com/gpu.product": "Tesla-T4",
        keys.UPGRADE_STATE: "upgrade-done",
        keys.UPGRADE_SKIP: "true",  # set by a person
        keys.MIG_CONFIG_STATE: "failed",  # the MIG manager's outcome (issue 30 item 11)
        "team": "ml",
    }
    annotations = {
        ledger.ANNOTATION: ledger.encode(
            {keys.GPU_PRESENT: "true", "nvidia.com/gpu.deploy.driver": "true",
             "nvidia.com/gpu.deploy.dcgm-exporter": "true"}
        ) or "",
        node_features.OWNED_LABELS_ANNOTATION: "nvidia.com/gpu.product,nvidia.com/gone",
        keys.UPGRADE_VALIDATION_START: "1700000000",
        keys.MIG_CONFIG_STATE_MESSAGE: "Driver Not Loaded",
        "other": "x",
    }  # fmt: skip
    patch = node_cleanup.node_patch(labels, annotations)
    assert patch == {
        "metadata": {
            "labels": {
                keys.GPU_PRESENT: None,
                "nvidia.com/gpu.deploy.driver": None,
                "nvidia.com/gpu.product": None,
                keys.UPGRADE_STATE: None,
                keys.MIG_CONFIG_STATE: None,
            },
            "annotations": {
                ledger.ANNOTATION: None,
                node_features.OWNED_LABELS_ANNOTATION: None,
                keys.UPGRADE_VALIDATION_START: None,
                keys.MIG_CONFIG_STATE_MESSAGE: None,
            },
        }
    }


def test_a_node_the_operator_never_touched_needs_no_patch() -> None:
    assert node_cleanup.node_patch({"team": "ml"}, {"other": "x"}) == {}


async def test_command_waits_for_the_operator_pods_then_cleans_every_node() -> None:
    owned = {keys.GPU_PRESENT: "true"}
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True)) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu"}})
        for name in ("a", "b"):
            sim.add_node(name, labels={**owned, "keep": "me"})
            sim.store.patch(
                "nodes",
                name,
                {"metadata": {"annotations": {ledger.ANNOTATION: ledger.encode(owned)}}},
            )
        sim.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "op", "namespace": "gpu",
                             "labels": {"app.kubernetes.io/component": "gpu-operator"}},
                "spec": {"nodeName": "a", "containers": [{"name": "c", "image": "op:1"}]},
            }
        )  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            str(GPU_OPERATOR), "cleanup-nodes", "--kubeconfig", str(sim.kubeconfig_path),
            "--namespace", "gpu", "--wait", "30",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        # It polls for the operator's pod and cleans nothing while the pod is there.
        await sim.wait_for(lambda: sim.stats.count("list", "pods") >= 2, timeout=DEADLINE)
        assert (sim.store.get("nodes", "a") or {})["metadata"]["labels"][keys.GPU_PRESENT]
        sim.store.delete("pods", "op", namespace="gpu", grace=0)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        assert "2 node(s) cleaned" in out.decode()
        for name in ("a", "b"):
            meta = (sim.store.get("nodes", name) or {})["metadata"]
            assert keys.GPU_PRESENT not in meta["labels"]
            assert meta["labels"]["keep"] == "me"
            assert ledger.ANNOTATION not in (meta.get("annotations") or {})


def test_node_patch_removes_the_gpuclusters_deploy_labels_it_wrote() -> None:
    """The GPUCluster's deploy labels (always "true" when it writes them) and the gpu.present it
    writes with them on an NFD GPU node go; a person's "false" stays."""
    from gpu_operator.operands import dra_driver

    labels = {**dict.fromkeys(dra_driver.DEPLOY_LABELS, "true"), keys.GPU_PRESENT: "true",
              keys.NFD_GPU_LABELS[0]: "true", "team": "ml"}  # fmt: skip
    removed = node_cleanup.node_patch(labels, {})["metadata"]["labels"]
    assert removed == dict.fromkeys([*dra_driver.DEPLOY_LABELS, keys.GPU_PRESENT])
    kept = {dra_driver.DEPLOY_DRA_DRIVER: "false", keys.GPU_PRESENT: "true"}
    assert node_cleanup.node_patch(kept, {}) == {}
