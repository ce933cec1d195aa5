"""Every values knob that changes the name of an object the operator writes is reflected in the
operator's RBAC: the names in its (Cluster)Role resourceNames come from the same values as the
ClusterPolicy the chart renders, so `--set operator.runtimeClass=nvidia-custom` works."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator import api
from gpu_operator.api.images import IMAGE_ENV
from gpu_operator.operands import registry
from gpu_operator.operands.facts import ClusterFacts

from .conftest import needs_helm
from .test_objects import named, rules_of

pytestmark = needs_helm

RBAC = "rbac.authorization.k8s.io"
# Kind of object the operator writes -> (role kind, API group, resource) that must name it.
NAMED = {
    "RuntimeClass": ("ClusterRole", "node.k8s.io", "runtimeclasses"),
    "ClusterRole": ("ClusterRole", RBAC, "clusterroles"),
    "ClusterRoleBinding": ("ClusterRole", RBAC, "clusterrolebindings"),
    "Role": ("Role", RBAC, "roles"),
    "RoleBinding": ("Role", RBAC, "rolebindings"),
}
# The values that change an object name the operator writes under a resourceNames rule.
KNOBS = [
    [],
    ["operator.runtimeClass=nvidia-custom"],
    ["operator.runtimeClass=nvidia-cdi"],
    ["operator.runtimeClass=nvidia-custom", "cdi.enabled=false"],
    ["cdi.enabled=false"],
    ["sandboxWorkloads.enabled=true", "sandboxWorkloads.defaultWorkload=vm-passthrough"],
]


def _operator_writes(policy_doc: dict[str, Any]) -> dict[str, set[str]]:
    """The names of the objects the operator renders from the chart's ClusterPolicy, by kind."""
    policy = api.ClusterPolicy.model_validate(policy_doc)
    facts = ClusterFacts(operator_env=dict.fromkeys(IMAGE_ENV.values(), "r/i:1"), kernels=("6.8",))
    names: dict[str, set[str]] = {}
    for state in registry.render_all(policy, facts):
        for obj in state.objects:
            names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
    return names


@pytest.mark.parametrize("sets", KNOBS, ids=[",".join(k) or "defaults" for k in KNOBS])
def test_every_object_the_operator_renders_is_granted_by_name(render: Any, sets: list[str]) -> None:
    rendered = render([], sets)
    writes = _operator_writes(rendered.one("ClusterPolicy"))
    assert writes.get("RuntimeClass"), "the pre-requisites state renders no RuntimeClass"
    for kind, (role, group, resource) in NAMED.items():
        rules = rules_of(rendered, role)
        for verb in ("create", "patch", "delete"):
            granted = named(rules, group, resource, verb)
            assert granted is not None, f"{verb} {resource} is not limited by name"
            missing = writes.get(kind, set()) - granted
            assert not missing, f"{sets}: {verb} {resource} denied for {sorted(missing)}"


@pytest.mark.parametrize("main", ["nvidia", "nvidia-custom", "nvidia-cdi"])
def test_runtime_class_names_are_exactly_what_the_operator_can_render(
    render: Any, main: str
) -> None:
    # With CDI on (the default, or turned on later in the ClusterPolicy) the operator renders the
    # main class plus the CDI and legacy ones; the Role grants exactly those, nothing more.
    rendered = render([], [f"operator.runtimeClass={main}", "cdi.enabled=true"])
    writes = _operator_writes(rendered.one("ClusterPolicy"))["RuntimeClass"]
    assert writes == {main, "nvidia-cdi", "nvidia-legacy"}
    cluster = rules_of(rendered, "ClusterRole")
    for verb in ("create", "patch", "delete"):
        assert named(cluster, "node.k8s.io", "runtimeclasses", verb) == writes


def test_an_invalid_runtime_class_is_refused_at_render(render: Any) -> None:
    rendered = render([], ["operator.runtimeClass=NVIDIA_custom"])
    assert rendered.returncode != 0
    assert 'operator.runtimeClass="NVIDIA_custom": a RuntimeClass name must be a lowercase' in (
        rendered.stderr
    )
