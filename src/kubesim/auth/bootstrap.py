"""The default ClusterRoles and bindings a real API server creates that matter to kubesim's users.

Rules follow the real bootstrap policy (plugin/pkg/auth/authorizer/rbac/bootstrappolicy) for the
roles listed here; controller and node roles are left out because kubesim's controllers run
in-process and never go through authorisation.
"""

from __future__ import annotations

from typing import Any

from kubesim.auth import users

RBAC_GROUP = "rbac.authorization.k8s.io"
_API_VERSION = f"{RBAC_GROUP}/v1"
_READ = ["get", "list", "watch"]
_WRITE = ["create", "delete", "deletecollection", "patch", "update"]
_ALL_RW = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"


def _rule(
    verbs: list[str], groups: list[str], resources: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if names:
        rule["resourceNames"] = names
    return rule


def _urls(verbs: list[str], urls: list[str]) -> dict[str, Any]:
    return {"nonResourceURLs": urls, "verbs": verbs}


def _meta(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults", **(labels or {})},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    }


def _role(
    name: str,
    rules: list[dict[str, Any]],
    labels: dict[str, str] | None = None,
    aggregate_from: str | None = None,
) -> dict[str, Any]:
    role: dict[str, Any] = {
        "apiVersion": _API_VERSION,
        "kind": "ClusterRole",
        "metadata": _meta(name, labels),
        "rules": rules,
    }
    if aggregate_from:
        role["aggregationRule"] = {
            "clusterRoleSelectors": [{"matchLabels": {AGGREGATE_TO + aggregate_from: "true"}}]
        }
    return role


_VIEW_RULES = [
    _rule(
        _READ,
        [""],
        [
            "configmaps",
            "endpoints",
            "persistentvolumeclaims",
            "persistentvolumeclaims/status",
            "pods",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/status",
        ],
    ),
    _rule(
        _READ,
        [""],
        [
            "bindings",
            "events",
            "limitranges",
            "namespaces/status",
            "pods/log",
            "pods/status",
            "replicationcontrollers/status",
            "resourcequotas",
            "resourcequotas/status",
        ],
    ),
    _rule(_READ, [""], ["namespaces"]),
    _rule(_READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(
        _READ,
        ["apps"],
        [
            "controllerrevisions",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "statefulsets",
            "statefulsets/scale",
            "statefulsets/status",
        ],
    ),
    _rule(_READ, ["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
    _rule(_READ, ["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
    _rule(_READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    _rule(_READ, ["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"]),
]

_EDIT_RULES = [
    _rule(
        _READ,
        [""],
        [
            "pods/attach",
            "pods/exec",
            "pods/portforward",
            "pods/proxy",
            "secrets",
            "services/proxy",
        ],
    ),
    _rule(["impersonate"], [""], ["serviceaccounts"]),
    _rule(_WRITE, [""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"]),
    _rule(["create"], [""], ["pods/eviction"]),
    _rule(
        _WRITE,
        [""],
        [
            "configmaps",
            "events",
            "persistentvolumeclaims",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "secrets",
            "serviceaccounts",
            "services",
            "services/proxy",
        ],
    ),
    _rule(["create"], [""], ["serviceaccounts/token"]),
    _rule(
        _WRITE,
        ["apps"],
        [
            "daemonsets",
            "deployments",
            "deployments/rollback",
            "deployments/scale",
            "replicasets",
            "replicasets/scale",
            "statefulsets",
            "statefulsets/scale",
        ],
    ),
    _rule(_WRITE, ["autoscaling"], ["horizontalpodautoscalers"]),
    _rule(_WRITE, ["batch"], ["cronjobs", "jobs"]),
    _rule(_WRITE, ["policy"], ["poddisruptionbudgets"]),
    _rule(_WRITE, ["networking.k8s.io"], ["ingresses", "networkpolicies"]),
    _rule(_ALL_RW, ["coordination.k8s.io"], ["leases"]),
]

_ADMIN_RULES = [
    _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"]),
    _rule(_ALL_RW, [RBAC_GROUP], ["rolebindings", "roles"]),
]

_PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def cluster_roles() -> list[dict[str, Any]]:
    """The bootstrap ClusterRoles, aggregated roles already filled as the controller would."""
    return [
        _role(
            "cluster-admin",
            [_rule(["*"], ["*"], ["*"]), _urls(["*"], ["*"])],
        ),
        _role("admin", _ADMIN_RULES + _EDIT_RULES + _VIEW_RULES, aggregate_from="admin"),
        _role(
            "edit",
            _EDIT_RULES + _VIEW_RULES,
            {AGGREGATE_TO + "admin": "true"},
            aggregate_from="edit",
        ),
        _role("view", _VIEW_RULES, {AGGREGATE_TO + "edit": "true"}, aggregate_from="view"),
        _role("system:aggregate-to-admin", _ADMIN_RULES, {AGGREGATE_TO + "admin": "true"}),
        _role("system:aggregate-to-edit", _EDIT_RULES, {AGGREGATE_TO + "edit": "true"}),
        _role("system:aggregate-to-view", _VIEW_RULES, {AGGREGATE_TO + "view": "true"}),
        _role(
            "system:discovery",
            [
                _urls(
                    ["get"],
                    [
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/healthz",
                        "/livez",
                        "/openapi",
                        "/openapi/*",
                        "/readyz",
                        "/version",
                        "/version/",
                    ],
                )
            ],
        ),
        _role(
            "system:basic-user",
            [
                _rule(
                    ["create"],
                    ["authorization.k8s.io"],
                    ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"]),
            ],
        ),
        _role("system:public-info-viewer", [_urls(["get"], _PUBLIC_INFO_URLS)]),
        _role(
            "system:auth-delegator",
            [
                _rule(["create"], ["authentication.k8s.io"], ["tokenreviews"]),
                _rule(["create"], ["authorization.k8s.io"], ["subjectaccessreviews"]),
            ],
        ),
        _role(
            "system:monitoring",
            [
                _urls(
                    ["get"],
                    [
                        "/healthz",
                        "/healthz/*",
                        "/livez",
                        "/livez/*",
                        "/metrics",
                        "/readyz",
                        "/readyz/*",
                    ],
                )
            ],
        ),
    ]


def cluster_role_bindings() -> list[dict[str, Any]]:
    """The bootstrap ClusterRoleBindings for the roles above."""

    def binding(name: str, *groups: str) -> dict[str, Any]:
        return {
            "apiVersion": _API_VERSION,
            "kind": "ClusterRoleBinding",
            "metadata": _meta(name),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups],
        }

    return [
        binding("cluster-admin", users.MASTERS),
        binding("system:discovery", users.AUTHENTICATED),
        binding("system:basic-user", users.AUTHENTICATED),
        binding("system:public-info-viewer", users.AUTHENTICATED, users.UNAUTHENTICATED),
        binding("system:monitoring", "system:monitoring"),
    ]
