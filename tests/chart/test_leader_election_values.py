"""operator.leaderElection.namespace: the operator's `--leader-elect-namespace` flag and the RBAC
for its own Lease in that namespace (and nowhere else)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import NAMESPACE, needs_helm
from .test_objects import named, rules_of

pytestmark = needs_helm

LEASE = "53822513.nvidia.com"
GROUP = "coordination.k8s.io"


def args_of(rendered: Any) -> list[str]:
    deployment = rendered.one("Deployment", "gpu-operator")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("sets", [[], [f"operator.leaderElection.namespace={NAMESPACE}"]])
def test_by_default_the_lease_is_in_the_release_namespace(render: Any, sets: list[str]) -> None:
    rendered = render([], sets)
    flags = [a for a in args_of(rendered) if a.startswith("--leader-elect-namespace")]
    assert flags == ([f"--leader-elect-namespace={NAMESPACE}"] if sets else [])
    role = rules_of(rendered, "Role")
    assert named(role, GROUP, "leases", "get") == {LEASE}
    assert named(role, GROUP, "leases", "create") is None
    assert not [o for o in rendered.of_kind("Role") if o["metadata"]["name"].endswith("election")]


def test_a_lease_namespace_moves_the_flag_and_the_lease_rules(render: Any) -> None:
    rendered = render([], ["operator.leaderElection.namespace=kube-system"])
    assert "--leader-elect-namespace=kube-system" in args_of(rendered)
    # No lease rights are left in the release namespace ...
    role = rules_of(rendered, "Role")
    assert named(role, GROUP, "leases", "get") == set()
    assert named(role, GROUP, "leases", "create") == set()
    # ... and in the lease namespace only the operator's own Lease can be read and renewed.
    election = rendered.one("Role", "gpu-operator-leader-election")
    assert election["metadata"]["namespace"] == "kube-system"
    assert named(election["rules"], GROUP, "leases", "update") == {LEASE}
    assert named(election["rules"], GROUP, "leases", "create") is None
    assert len(election["rules"]) == 2
    binding = rendered.one("RoleBinding", "gpu-operator-leader-election")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["name"] == "gpu-operator-leader-election"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NAMESPACE}
    ]
