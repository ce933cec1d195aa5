"""The registry of served resource types: built-in kinds plus kinds served from CRDs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubesim import errors

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
CREATE_ONLY = ("create",)
PROXY_VERBS = ("create", "delete", "get", "patch", "update")


@dataclass(frozen=True)
class Subresource:
    """A subresource other than status: its discovery kind, verbs and (for a few) another group."""

    name: str
    kind: str
    verbs: tuple[str, ...]
    group: str = ""
    version: str = ""


# The subresources the real server serves for built-in kinds (beyond status), as discovery shows.
_POD_SUBRESOURCES = (
    Subresource("attach", "PodAttachOptions", ("create", "get")),
    Subresource("binding", "Binding", CREATE_ONLY),
    Subresource("ephemeralcontainers", "Pod", ("get", "patch", "update")),
    Subresource("eviction", "Eviction", CREATE_ONLY, "policy", "v1"),
    Subresource("exec", "PodExecOptions", ("create", "get")),
    Subresource("log", "Pod", ("get",)),
    Subresource("portforward", "PodPortForwardOptions", ("create", "get")),
    Subresource("proxy", "PodProxyOptions", PROXY_VERBS),
)
_SCALE = (Subresource("scale", "Scale", ("get", "patch", "update"), "autoscaling", "v1"),)


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives in the API and how the server treats its objects."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    # The real server keeps client-supplied status on create only for a few kinds (nodes, pods
    # get defaults instead); everything with a status subresource drops it.
    status_on_create: bool = False
    has_generation: bool = False
    printer_columns: tuple[dict[str, Any], ...] = ()
    schema: dict[str, Any] | None = None
    served_versions: tuple[str, ...] = ()
    from_crd: bool = False
    extra_subresources: tuple[Subresource, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    # Sent as a Warning header on every request for this type, as the real server does.
    deprecation: str = ""

    def subresource(self, name: str) -> Subresource | None:
        """A declared subresource other than status, by name."""
        return next((s for s in self.extra_subresources if s.name == name), None)

    @functools.cached_property
    def key(self) -> tuple[str, str]:
        """The storage key: (group, plural), shared by every served version (computed once:
        every write reads it several times)."""
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        """The preferred apiVersion string."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        """The lower-case singular name."""
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        """The kind of list responses."""
        return self.kind + "List"

    @property
    def qualified(self) -> str:
        """`plural.group` as used in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _rt(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool,
    short: Iterable[str] = (),
    *,
    status: bool = False,
    status_on_create: bool = False,
    generation: bool = False,
    categories: Iterable[str] = (),
    extra: Iterable[Subresource] = (),
    verbs: tuple[str, ...] = ALL_VERBS,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=tuple(short),
        categories=tuple(categories),
        status_subresource=status,
        status_on_create=status_on_create,
        has_generation=generation,
        served_versions=(version,),
        extra_subresources=tuple(extra),
        verbs=verbs,
    )


BUILTINS: tuple[ResourceType, ...] = (
    _rt(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        ["ns"],
        status=True,
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    ),
    _rt(
        "",
        "v1",
        "nodes",
        "Node",
        False,
        ["no"],
        status=True,
        status_on_create=True,
        extra=[Subresource("proxy", "NodeProxyOptions", PROXY_VERBS)],
    ),
    _rt(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        ["po"],
        status=True,
        categories=["all"],
        extra=_POD_SUBRESOURCES,
    ),
    _rt(
        "",
        "v1",
        "services",
        "Service",
        True,
        ["svc"],
        status=True,
        categories=["all"],
        extra=[Subresource("proxy", "ServiceProxyOptions", PROXY_VERBS)],
    ),
    dataclasses.replace(
        _rt("", "v1", "endpoints", "Endpoints", True, ["ep"]),
        deprecation="v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice",
    ),
    # Claims are stored (StatefulSets create them) but nothing provisions or binds volumes.
    _rt(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        True,
        ["pvc"],
        status=True,
        status_on_create=True,
    ),
    # Stored only, so `kubectl apply --prune` (whose default kinds include these) can list them.
    _rt("", "v1", "persistentvolumes", "PersistentVolume", False, ["pv"], status=True),
    _rt(
        "",
        "v1",
        "replicationcontrollers",
        "ReplicationController",
        True,
        ["rc"],
        status=True,
        generation=True,
        categories=["all"],
        extra=_SCALE,
    ),
    _rt("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
    _rt("", "v1", "secrets", "Secret", True),
    # Stored only (`kubectl create quota` works): usage is not computed and nothing is enforced.
    _rt("", "v1", "resourcequotas", "ResourceQuota", True, ["quota"], status=True),
    _rt(
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        True,
        ["sa"],
        extra=[Subresource("token", "TokenRequest", CREATE_ONLY, "authentication.k8s.io", "v1")],
    ),
    _rt("", "v1", "events", "Event", True, ["ev"]),
    _rt("events.k8s.io", "v1", "events", "Event", True, ["ev"]),
    _rt(
        "apps",
        "v1",
        "daemonsets",
        "DaemonSet",
        True,
        ["ds"],
        status=True,
        generation=True,
        categories=["all"],
    ),
    _rt(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        ["deploy"],
        status=True,
        generation=True,
        categories=["all"],
        extra=_SCALE,
    ),
    _rt(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        True,
        ["rs"],
        status=True,
        generation=True,
        categories=["all"],
        extra=_SCALE,
    ),
    _rt(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        True,
        ["sts"],
        status=True,
        generation=True,
        categories=["all"],
        extra=_SCALE,
    ),
    _rt("apps", "v1", "controllerrevisions", "ControllerRevision", True),
    _rt("batch", "v1", "jobs", "Job", True, status=True, generation=True, categories=["all"]),
    _rt(
        "batch",
        "v1",
        "cronjobs",
        "CronJob",
        True,
        ["cj"],
        status=True,
        generation=True,
        categories=["all"],
    ),
    _rt("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    # Stored only (no ingress controller); listed by `kubectl apply --prune` by default.
    _rt(
        "networking.k8s.io",
        "v1",
        "ingresses",
        "Ingress",
        True,
        ["ing"],
        status=True,
        generation=True,
    ),
    _rt("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False),
    # HorizontalPodAutoscalers are stored only (no HPA controller); v2 is the storage version.
    *(
        ResourceType(
            group="autoscaling",
            version=version,
            plural="horizontalpodautoscalers",
            kind="HorizontalPodAutoscaler",
            namespaced=True,
            short_names=("hpa",),
            categories=("all",),
            status_subresource=True,
            served_versions=("v2", "v1"),
        )
        for version in ("v2", "v1")
    ),
    _rt("coordination.k8s.io", "v1", "leases", "Lease", True),
    _rt(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ["pdb"],
        status=True,
        generation=True,
    ),
    _rt("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _rt("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _rt("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    # Dynamic resource allocation (GA in 1.34): drivers publish devices in ResourceSlices,
    # the resource claim controller stamps claims out of templates and the scheduler's DRA
    # plugin allocates them (kubesim.controllers.resourceclaim, dra_allocation).
    _rt("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False, generation=True),
    _rt("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, status=True),
    _rt("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
    _rt("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, generation=True),
    # Review kinds are virtual: a create is answered and nothing is stored.
    _rt(
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        False,
        verbs=CREATE_ONLY,
    ),
    _rt(
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
        False,
        verbs=CREATE_ONLY,
    ),
    _rt(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        False,
        verbs=CREATE_ONLY,
    ),
    _rt(
        "authorization.k8s.io",
        "v1",
        "localsubjectaccessreviews",
        "LocalSubjectAccessReview",
        True,
        verbs=CREATE_ONLY,
    ),
    _rt(
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
        False,
        verbs=CREATE_ONLY,
    ),
    _rt("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False, verbs=CREATE_ONLY),
    _rt("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ["pc"]),
    _rt(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ["crd", "crds"],
        status=True,
        generation=True,
    ),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        generation=True,
    ),
    # Stored and served; kubesim does not evaluate their CEL (docs/kubesim.md).
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        False,
        status=True,
        generation=True,
    ),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        False,
        generation=True,
    ),
    _rt(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        generation=True,
    ),
)


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types a CRD serves, one per served version (storage shared)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    served = [v for v in spec.get("versions") or [] if v.get("served", True)]
    if not served:
        return []
    storage = next((v for v in served if v.get("storage")), served[0])
    versions = tuple(v["name"] for v in served)
    result = []
    for version in served:
        subresources = version.get("subresources") or {}
        columns = tuple(version.get("additionalPrinterColumns") or ())
        result.append(
            ResourceType(
                group=group,
                version=version["name"],
                plural=names.get("plural", ""),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource="status" in subresources,
                has_generation=True,
                printer_columns=columns,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                served_versions=(storage["name"], *[v for v in versions if v != storage["name"]]),
                from_crd=True,
            )
        )
    return result


@dataclass
class Registry:
    """All served resource types, indexed by group/version/plural and by kind."""

    _by_gvr: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)
    _crd_types: dict[str, list[ResourceType]] = field(default_factory=dict)
    generation: int = 0
    # resolve() answers by registry generation: controllers resolve names on every write.
    _resolved: dict[str, tuple[int, ResourceType]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def with_builtins(cls) -> Registry:
        """A registry holding every built-in kind."""
        registry = cls()
        for rt in BUILTINS:
            registry._by_gvr[(rt.group, rt.version, rt.plural)] = rt
        return registry

    def add_crd(self, crd: dict[str, Any]) -> None:
        """Start serving the kinds of a CRD (replacing what an older version of it served)."""
        name = (crd.get("metadata") or {}).get("name", "")
        self.remove_crd(name)
        types = from_crd(crd)
        for rt in types:
            self._by_gvr[(rt.group, rt.version, rt.plural)] = rt
        self._crd_types[name] = types
        self.generation += 1

    def remove_crd(self, name: str) -> None:
        """Stop serving a CRD's kinds."""
        for rt in self._crd_types.pop(name, []):
            self._by_gvr.pop((rt.group, rt.version, rt.plural), None)
        self.generation += 1

    def crd_types(self, name: str) -> list[ResourceType]:
        """The types served for a CRD name."""
        return list(self._crd_types.get(name, []))

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        """Look up by group, version and plural."""
        return self._by_gvr.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        """Every served type (one entry per served version)."""
        return list(self._by_gvr.values())

    def storage_types(self) -> list[ResourceType]:
        """One type per storage key, preferring the storage version."""
        seen: dict[tuple[str, str], ResourceType] = {}
        for rt in self._by_gvr.values():
            current = seen.get(rt.key)
            if current is None or rt.version == rt.served_versions[0]:
                seen[rt.key] = rt
        return list(seen.values())

    def for_object(self, obj: dict[str, Any]) -> ResourceType:
        """The type named by an object's apiVersion and kind."""
        api_version = obj.get("apiVersion", "")
        kind = obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for rt in self._by_gvr.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise errors.ApiError(
            404,
            f'no matches for kind "{kind}" in version "{api_version}"',
            reason="NotFound",
        )

    def resolve(self, name: str) -> ResourceType:
        """Find a type from a plural, `plural.group`, kind, or short name (for Python callers)."""
        cached = self._resolved.get(name)
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        plural, _, group = name.partition(".")
        candidates = []
        for rt in self._by_gvr.values():
            if group and rt.group != group:
                continue
            if name in (rt.plural, rt.kind, rt.singular, *rt.short_names) or (
                group and plural == rt.plural
            ):
                candidates.append(rt)
        if not candidates:
            raise errors.ApiError(404, f"the server doesn't have a resource type {name!r}")
        # Core group wins ties (events), then the preferred (storage) version.
        candidates.sort(key=lambda rt: (rt.group != "", rt.version != rt.served_versions[0]))
        self._resolved[name] = (self.generation, candidates[0])
        return candidates[0]

    def groups(self) -> dict[str, list[str]]:
        """Group name -> served versions (preferred first), excluding the core group."""
        result: dict[str, list[str]] = {}
        for rt in self._by_gvr.values():
            if not rt.group:
                continue
            versions = result.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        for group, versions in result.items():
            versions.sort(key=_version_priority, reverse=True)
            result[group] = versions
        return result

    def resources_in(self, group: str, version: str) -> list[ResourceType]:
        """Every type served under a group/version."""
        return [rt for rt in self._by_gvr.values() if rt.group == group and rt.version == version]


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, then by number."""
    import re

    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (-1, 0, 0)
    major, stage, minor = match.groups()
    rank = {"alpha": 0, "beta": 1, None: 2}[stage]
    return (rank, int(major), int(minor or 0))


def discovery_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any]:
    """The APIResourceList for `/api/v1` or `/apis/{group}/{version}`."""
    resources: list[dict[str, Any]] = []
    for rt in sorted(registry.resources_in(group, version), key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.status_subresource:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        for sub in rt.extra_subresources:
            entry_sub: dict[str, Any] = {
                "name": f"{rt.plural}/{sub.name}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": sub.kind,
                "verbs": list(sub.verbs),
            }
            if sub.group:
                entry_sub["group"] = sub.group
                entry_sub["version"] = sub.version
            resources.append(entry_sub)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def discovery_group(group: str, versions: list[str]) -> dict[str, Any]:
    """The APIGroup object for one group."""
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": entries,
        "preferredVersion": entries[0],
    }


def discovery_group_list(registry: Registry) -> dict[str, Any]:
    """The APIGroupList for `/apis`."""
    groups = registry.groups()
    body = [discovery_group(g, groups[g]) for g in sorted(groups)]
    for entry in body:
        entry.pop("kind")
        entry.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": body}
