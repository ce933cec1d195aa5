"""Every object of every state, for every example and a kitchen-sink policy, is valid for 1.35."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from operand_helpers import make_facts, make_policy

from gpu_operator.api import ClusterPolicy, check_document, manifests
from gpu_operator.operands import registry
from gpu_operator.operands.facts import ClusterFacts

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
# Custom resources kubernetes-validate has no schema for (prometheus-operator).
UNKNOWN_TO_VALIDATOR = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def _policies() -> list[tuple[str, ClusterPolicy]]:
    found = []
    for path in EXAMPLES:
        for doc in manifests.read(str(path)):
            checked = check_document(doc)
            if isinstance(checked.obj, ClusterPolicy):
                found.append((path.name, checked.obj))
    return found


KITCHEN_SINK = make_policy(
    daemonsets={
        "labels": {"team": "gpu", "app": "ignored"},
        "annotations": {"note": "x"},
        "updateStrategy": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "25%"},
        "priorityClassName": "system-node-critical",
        "podSecurityContext": {"runAsUser": 0},
    },
    driver={
        "rdma": {"enabled": True, "useHostMofed": True},
        "licensingConfig": {"secretName": "licensing", "nlsEnabled": True},
        "virtualTopology": {"config": "topology"},
        "kernelModuleConfig": {"name": "kmod"},
        "repoConfig": {"configMapName": "repos"},
        "certConfig": {"name": "certs"},
        "secretEnv": "driver-env",
        "livenessProbe": {"periodSeconds": 30},
        "readinessProbe": {"periodSeconds": 30},
        "resources": {"limits": {"memory": "2Gi"}},
    },
    gds={"enabled": True},
    gdrcopy={"enabled": True},
    devicePlugin={
        "config": {"name": "plugin-config", "default": "any"},
        "mps": {"root": "/var/mps"},
    },
    dcgm={"enabled": True},
    dcgmExporter={
        "enablePodLabels": True,
        "enablePodUID": True,
        "podLabelAllowlistRegex": ["^app$"],
        "hpcJobMapping": {"enabled": True},
        "hostPID": True,
        "serviceMonitor": {"enabled": True, "interval": "15s", "relabelings": [{"action": "keep"}]},
        "service": {"type": "ClusterIP", "internalTrafficPolicy": "Local"},
    },
    nodeStatusExporter={"enabled": True},
    migManager={"config": {"name": "custom-mig"}, "gpuClientsConfig": {"name": "clients"}},
    sandboxWorkloads={"enabled": True, "mode": "kata"},
    vgpuManager={"enabled": True},
    vgpuDeviceManager={"enabled": True},
    vfioManager={"enabled": True},
    kataSandboxDevicePlugin={"enabled": True},
    ccManager={"enabled": True, "defaultMode": "devtools"},
    hostPaths={"rootFS": "/host-root", "driverInstallDir": "/opt/nvidia/driver"},
    validator={"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]}},
)
KITCHEN_FACTS = make_facts(
    has_servicemonitor_crd=True,
    config_map_keys={"kmod": ("nvidia.conf",), "repos": ("cuda.list",), "certs": ("ca.crt",)},
)
CASES: list[tuple[str, ClusterPolicy, ClusterFacts]] = [
    (name, policy, make_facts(has_servicemonitor_crd=True)) for name, policy in _policies()
]
CASES += [
    ("kitchen-sink", KITCHEN_SINK, KITCHEN_FACTS),
    ("precompiled-crio", make_policy(driver={"usePrecompiled": True}, cdi={"enabled": False}),
     make_facts(runtime="crio", kernels=("5.15.0-105-generic", "6.8.0-1017-aws"))),
    ("nri-docker", make_policy(cdi={"enabled": True, "nriPluginEnabled": True}),
     make_facts(runtime="docker")),
]  # fmt: skip


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 6
    assert len(CASES) >= 9


@pytest.mark.parametrize(("case", "policy", "facts"), CASES, ids=[c[0] for c in CASES])
def test_every_rendered_object_is_valid_kubernetes(
    case: str, policy: ClusterPolicy, facts: ClusterFacts
) -> None:
    rendered = registry.render_all(policy, facts)
    assert [r.error for r in rendered if r.error] == []
    objects: list[dict[str, Any]] = [o for r in rendered for o in r.objects]
    assert objects
    validated = 0
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in UNKNOWN_TO_VALIDATOR:
            continue
        kubernetes_validate.validate(obj, "1.35.0", strict=True)
        validated += 1
    assert validated > 0


@pytest.mark.parametrize(("case", "policy", "facts"), CASES, ids=[c[0] for c in CASES])
def test_every_object_carries_its_state_label(
    case: str, policy: ClusterPolicy, facts: ClusterFacts
) -> None:
    for state in registry.render_all(policy, facts):
        for obj in state.objects:
            assert obj["metadata"]["labels"]["nvidia.com/gpu-operator.state"] == state.name
            assert "ownerReferences" not in obj["metadata"]
            assert "nvidia.com/last-applied-hash" not in obj["metadata"].get("annotations", {})
            namespaced = obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "RuntimeClass")
            assert ("namespace" in obj["metadata"]) is namespaced
            if namespaced:
                assert obj["metadata"]["namespace"] == facts.namespace
