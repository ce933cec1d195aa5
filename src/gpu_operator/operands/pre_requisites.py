"""State `pre-requisites`: the RuntimeClasses operand and user pods run under."""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.api import enablement
from gpu_operator.operands import common
from gpu_operator.operands.facts import ClusterFacts

NAME = "pre-requisites"
LEGACY_RUNTIME_CLASS = "nvidia-legacy"
CDI_RUNTIME_CLASS = "nvidia-cdi"
COMPONENT_LABEL = "app.kubernetes.io/component"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    """With NRI injection no RuntimeClass is needed, so the state (and its objects) goes away."""
    return not enablement.nri_plugin_enabled(policy.spec)


def _runtime_class(name: str) -> dict[str, Any]:
    # Always node.k8s.io/v1: v1beta1 (used upstream for Kubernetes <= 1.20) no longer exists.
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": common.metadata(name, NAME, labels={COMPONENT_LABEL: "gpu-operator"}),
        "handler": name,
    }


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    """The main RuntimeClass, plus the legacy and CDI ones when CDI is enabled."""
    main = policy.spec.operator.runtimeClass or "nvidia"
    names = [main]
    if enablement.is_enabled(policy.spec, "cdi"):
        names += [n for n in (LEGACY_RUNTIME_CLASS, CDI_RUNTIME_CLASS) if n != main]
    return [_runtime_class(name) for name in names]
