"""Dict-based lightkube resource classes for every kind the operator touches.

lightkube's typed models cost a conversion per object; the planners work on plain dicts, so every
kind here is a `Generic` (a dict subclass). The classes are deliberately not put in lightkube's
global registry, so they never clash with its typed core models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightkube.core import resource as res
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericGlobalStatus,
    GenericNamespacedResource,
    GenericNamespacedStatus,
    create_api_info,
)


@dataclass(frozen=True)
class Kind:
    """An API resource: group, version, kind, plural and scope."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = (
    Kind("", "v1", "Namespace", "namespaces", False),
    Kind("", "v1", "Node", "nodes", False),
    Kind("", "v1", "Pod", "pods", True),
    Kind("", "v1", "ConfigMap", "configmaps", True),
    Kind("", "v1", "Secret", "secrets", True),
    Kind("", "v1", "Service", "services", True),
    Kind("", "v1", "ServiceAccount", "serviceaccounts", True),
    Kind("", "v1", "Event", "events", True),
    Kind("apps", "v1", "DaemonSet", "daemonsets", True),
    Kind("apps", "v1", "Deployment", "deployments", True),
    Kind("apps", "v1", "ControllerRevision", "controllerrevisions", True),
    Kind("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    Kind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    Kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    Kind("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    Kind("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", False),
    Kind("coordination.k8s.io", "v1", "Lease", "leases", True),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
    ),
    Kind("nvidia.com", "v1", "ClusterPolicy", "clusterpolicies", False),
    Kind("nvidia.com", "v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
    Kind("nvidia.com", "v1alpha1", "GPUCluster", "gpuclusters", False),
    Kind("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", True),
    Kind("monitoring.coreos.com", "v1", "PrometheusRule", "prometheusrules", True),
    Kind("nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures", True),
    Kind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    Kind("resource.k8s.io", "v1", "ResourceSlice", "resourceslices", False),
    # The GPUCluster's DRA driver (operands/dra_driver.py).
    Kind("resource.k8s.io", "v1", "DeviceClass", "deviceclasses", False),
    Kind("resource.k8s.io", "v1", "ResourceClaimTemplate", "resourceclaimtemplates", True),
    Kind("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", True),
    # NVIDIA's DRA driver's compute domains (controller/computedomain.py).
    Kind("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains", True),
    Kind("resource.nvidia.com", "v1beta1", "ComputeDomainClique", "computedomaincliques", True),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        False,
    ),
    Kind(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
    ),
)


def _status_class(kind: Kind, parent: res.ApiInfo) -> type:
    base = GenericNamespacedStatus if kind.namespaced else GenericGlobalStatus
    info = res.ApiInfo(
        resource=parent.resource,
        parent=parent.resource,
        plural=parent.plural,
        verbs=["get", "patch", "put"],
        action="status",
    )
    return type(f"{kind.kind}Status", (base,), {"_api_info": info})


def _resource_class(kind: Kind) -> type:
    base = GenericNamespacedResource if kind.namespaced else GenericGlobalResource
    info = create_api_info(kind.group, kind.version, kind.kind, kind.plural)
    return type(kind.kind, (base,), {"_api_info": info, "Status": _status_class(kind, info)})


_BY_KEY: dict[tuple[str, str], tuple[Kind, type]] = {
    (k.api_version, k.kind): (k, _resource_class(k)) for k in KINDS
}


def kind_of(api_version: str, kind: str) -> Kind:
    try:
        return _BY_KEY[(api_version, kind)][0]
    except KeyError:
        raise KeyError(f"the operator does not handle {api_version} {kind}") from None


def resource(api_version: str, kind: str) -> Any:
    """The lightkube resource class for an apiVersion and kind."""
    try:
        return _BY_KEY[(api_version, kind)][1]
    except KeyError:
        raise KeyError(f"the operator does not handle {api_version} {kind}") from None


def of(obj: dict[str, Any]) -> Any:
    """The lightkube resource class for an object dict."""
    return resource(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))


def wrap(obj: dict[str, Any]) -> Any:
    """The object as an instance of its resource class (what lightkube's write calls take)."""
    return of(obj)(obj)


# The namespace argument that lists and watches a namespaced kind in every namespace.
ALL_NAMESPACES = "*"

NODE = resource("v1", "Node")
POD = resource("v1", "Pod")
EVENT = resource("v1", "Event")
DAEMONSET = resource("apps/v1", "DaemonSet")
CONTROLLER_REVISION = resource("apps/v1", "ControllerRevision")
LEASE = resource("coordination.k8s.io/v1", "Lease")
CRD = resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CLUSTER_POLICY = resource("nvidia.com/v1", "ClusterPolicy")
NVIDIA_DRIVER = resource("nvidia.com/v1alpha1", "NVIDIADriver")
GPU_CLUSTER = resource("nvidia.com/v1alpha1", "GPUCluster")
DEPLOYMENT = resource("apps/v1", "Deployment")
POD_DISRUPTION_BUDGET = resource("policy/v1", "PodDisruptionBudget")
NODE_FEATURE = resource("nfd.k8s-sigs.io/v1alpha1", "NodeFeature")
RESOURCE_SLICE = resource("resource.k8s.io/v1", "ResourceSlice")
RESOURCE_CLAIM = resource("resource.k8s.io/v1", "ResourceClaim")
