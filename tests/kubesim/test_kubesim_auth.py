"""Authentication and RBAC authorisation as kube-apiserver does them: over HTTP and with kubectl."""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubesim_helpers import TEST_IMAGES, instant
from waiting import DEADLINE, within

import kubesim

KUBECTL = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "kubectl"
RBAC = "rbac.authorization.k8s.io"
RBAC_V1 = f"/apis/{RBAC}/v1"
SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
needs_kubectl = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")


# ----- helpers --------------------------------------------------------------------------------


class Client:
    """Raw HTTPS requests carrying one bearer token (or none)."""

    def __init__(self, session: aiohttp.ClientSession, token: str | None) -> None:
        self.session = session
        self.token = token

    async def req(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        all_headers = {"Content-Type": ctype, **(headers or {})}
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        async with self.session.request(
            method, path, data=data, headers=all_headers, params=params
        ) as resp:
            text = await resp.read()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text.decode()


@pytest.fixture
async def rbac_sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(
        images=TEST_IMAGES, authorization="rbac", kubelet=instant()
    ) as cluster:
        yield cluster


@pytest.fixture
async def session(rbac_sim: kubesim.Cluster) -> AsyncIterator[aiohttp.ClientSession]:
    assert rbac_sim.tls is not None
    connector = aiohttp.TCPConnector(ssl=rbac_sim.tls.client_context())
    async with aiohttp.ClientSession(base_url=rbac_sim.url, connector=connector) as http:
        yield http


def as_user(
    session: aiohttp.ClientSession, sim: kubesim.Cluster, name: str, *groups: str
) -> Client:
    return Client(session, sim.auth.token_for(name, groups))


def admin(session: aiohttp.ClientSession, sim: kubesim.Cluster) -> Client:
    return Client(session, sim.auth.admin_token)


def role(
    sim: kubesim.Cluster,
    name: str,
    rules: list[dict[str, Any]],
    namespace: str | None = None,
    **extra: Any,
) -> None:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    sim.store.create(
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "Role" if namespace else "ClusterRole",
            "metadata": meta,
            "rules": rules,
            **extra,
        }
    )


def bind(
    sim: kubesim.Cluster,
    name: str,
    role_name: str,
    subjects: list[dict[str, Any]],
    namespace: str | None = None,
    role_kind: str = "ClusterRole",
) -> None:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    sim.store.create(
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role_name},
            "subjects": subjects,
        }
    )


def user(name: str) -> dict[str, str]:
    return {"kind": "User", "apiGroup": RBAC, "name": name}


def rule(verbs: list[str], resources: list[str], groups: tuple[str, ...] = ("",), **kw: Any) -> Any:
    return {"apiGroups": list(groups), "resources": resources, "verbs": verbs, **kw}


def namespace(sim: kubesim.Cluster, name: str) -> None:
    sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def configmap(name: str, ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}


def service_account(sim: kubesim.Cluster, name: str, ns: str = "default") -> None:
    sim.store.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}
    )


async def can(client: Client, verb: str, resource: str, **attrs: str) -> bool:
    status, body = await client.req(
        "POST",
        SSAR,
        {"spec": {"resourceAttributes": {"verb": verb, "resource": resource, **attrs}}},
    )
    assert status == 201, body
    return bool(body["status"]["allowed"])


# ----- authentication -------------------------------------------------------------------------


async def test_a_request_without_a_token_gets_the_real_401_status(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    status, body = await Client(session, None).req("GET", "/api/v1/pods")
    assert status == 401
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


async def test_an_unknown_token_gets_401_even_on_health_endpoints(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    status, _ = await Client(session, "not-a-token").req("GET", "/healthz")
    assert status == 401
    status, _ = await Client(session, "a.b.c").req("GET", "/version")
    assert status == 401


async def test_health_and_version_are_public_but_discovery_needs_a_token(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    anonymous = Client(session, None)
    for path in ("/healthz", "/livez", "/readyz", "/version"):
        status, _ = await anonymous.req("GET", path)
        assert status == 200, path
    assert (await anonymous.req("GET", "/api"))[0] == 401
    assert (await as_user(session, rbac_sim, "alice").req("GET", "/apis"))[0] == 200


async def test_anonymous_requests_see_public_info_and_are_forbidden_discovery() -> None:
    async with kubesim.Cluster(authorization="rbac", anonymous=True) as sim:
        assert sim.tls is not None
        connector = aiohttp.TCPConnector(ssl=sim.tls.client_context())
        async with aiohttp.ClientSession(base_url=sim.url, connector=connector) as http:
            anonymous = Client(http, None)
            assert (await anonymous.req("GET", "/version"))[0] == 200
            status, body = await anonymous.req("GET", "/api")
    assert status == 403
    assert body["message"] == 'forbidden: User "system:anonymous" cannot get path "/api"'
    assert body["details"] == {}
    assert body["reason"] == "Forbidden"


async def test_open_cluster_serves_plain_http_and_lets_everyone_in() -> None:
    async with kubesim.Cluster() as sim, aiohttp.ClientSession(base_url=sim.url) as http:
        assert sim.url.startswith("http://")
        assert sim.tls is None
        status, body = await Client(http, None).req("GET", "/api/v1/namespaces/kube-system/pods")
        assert status == 200
        status, body = await Client(http, None).req(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {}
        )
        assert body["status"]["userInfo"]["username"] == "kubesim-admin"
        alice = Client(http, sim.auth.token_for("alice"))
        assert await can(alice, "delete", "nodes")  # AlwaysAllow
        status, body = await alice.req(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            {"spec": {"namespace": "default"}},
        )
        assert body["status"]["resourceRules"] == [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
        ]


# ----- RBAC decisions -------------------------------------------------------------------------


async def test_forbidden_status_names_the_user_verb_resource_and_namespace(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "gpu-operator", "default")
    token = rbac_sim.auth.token_for_service_account("default", "gpu-operator")
    status, body = await Client(session, token).req("GET", "/api/v1/namespaces/kube-system/pods")
    assert status == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods is forbidden: User "system:serviceaccount:default:gpu-operator" cannot '
        'list resource "pods" in API group "" in the namespace "kube-system"',
        "reason": "Forbidden",
        "details": {"kind": "pods"},
        "code": 403,
    }


async def test_forbidden_status_for_a_named_cluster_scoped_object(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    status, body = await as_user(session, rbac_sim, "alice").req(
        "GET", f"{RBAC_V1}/clusterroles/view"
    )
    assert status == 403
    assert body["message"] == (
        'clusterroles.rbac.authorization.k8s.io "view" is forbidden: User "alice" cannot get '
        'resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope'
    )
    assert body["details"] == {"name": "view", "group": RBAC, "kind": "clusterroles"}


async def test_a_rolebinding_grants_a_clusterrole_only_in_its_namespace(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    namespace(rbac_sim, "team-a")
    bind(rbac_sim, "alice-view", "view", [user("alice")], namespace="team-a")
    alice = as_user(session, rbac_sim, "alice")
    assert (await alice.req("GET", "/api/v1/namespaces/team-a/configmaps"))[0] == 200
    assert (await alice.req("GET", "/api/v1/namespaces/default/configmaps"))[0] == 403
    assert (await alice.req("GET", "/api/v1/configmaps"))[0] == 403  # all namespaces
    assert (
        await alice.req("POST", "/api/v1/namespaces/team-a/configmaps", configmap("c", "team-a"))
    )[0] == 403
    # GET of a namespace is authorised in that namespace, so the binding covers team-a itself.
    assert (await alice.req("GET", "/api/v1/namespaces/team-a"))[0] == 200
    assert (await alice.req("GET", "/api/v1/namespaces/default"))[0] == 403


async def test_resource_names_allow_get_but_never_list_watch_or_create(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    rbac_sim.store.create(configmap("mine"))
    role(
        rbac_sim,
        "one",
        [rule(["get", "list", "watch", "create"], ["configmaps"], resourceNames=["mine"])],
    )
    bind(rbac_sim, "one", "one", [user("bob")])
    bob = as_user(session, rbac_sim, "bob")
    path = "/api/v1/namespaces/default/configmaps"
    assert (await bob.req("GET", f"{path}/mine"))[0] == 200
    assert (await bob.req("GET", f"{path}/other"))[0] == 403
    assert (await bob.req("GET", path))[0] == 403
    assert (await bob.req("POST", path, configmap("mine2")))[0] == 403
    # A list or watch selecting exactly that name is authorised as that name.
    params = {"fieldSelector": "metadata.name=mine"}
    assert (await bob.req("GET", path, params=params))[0] == 200
    assert (await bob.req("GET", path, params={**params, "watch": "1", "timeoutSeconds": "1"}))[
        0
    ] == 200


async def test_subresources_need_their_own_rule_or_a_star_form(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(
        rbac_sim,
        "subs",
        [rule(["get"], ["pods", "pods/log"]), rule(["get", "update"], ["*/scale"], ("apps",))],
    )
    bind(rbac_sim, "subs", "subs", [user("carol")])
    carol = as_user(session, rbac_sim, "carol")
    assert await can(carol, "get", "pods", subresource="log", namespace="default")
    assert not await can(carol, "get", "pods", subresource="status", namespace="default")
    assert await can(carol, "update", "deployments", group="apps", subresource="scale")
    assert not await can(carol, "update", "deployments", group="apps")
    status, body = await carol.req("PUT", "/api/v1/namespaces/default/pods/p/status", {})
    assert status == 403
    assert 'cannot update resource "pods/status" in API group ""' in body["message"]


async def test_wildcards_for_verbs_groups_and_resources(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "stars", [rule(["*"], ["*"], ("apps",)), rule(["get"], ["*"], ("*",))])
    bind(rbac_sim, "stars", "stars", [{"kind": "Group", "apiGroup": RBAC, "name": "ops"}])
    ops = as_user(session, rbac_sim, "dave", "ops")
    assert await can(ops, "deletecollection", "daemonsets", group="apps")
    assert await can(ops, "get", "widgets", group="example.com")
    assert not await can(ops, "list", "widgets", group="example.com")
    assert not await can(as_user(session, rbac_sim, "dave"), "get", "nodes")  # not in the group


async def test_non_resource_urls_match_exactly_or_by_trailing_star(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "metrics", [{"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}])
    bind(rbac_sim, "metrics", "metrics", [user("erin")])
    erin = as_user(session, rbac_sim, "erin")

    async def may(path: str) -> bool:
        status, body = await erin.req(
            "POST", SSAR, {"spec": {"nonResourceAttributes": {"path": path, "verb": "get"}}}
        )
        assert status == 201, body
        return bool(body["status"]["allowed"])

    assert await may("/metrics")
    assert not await may("/metrics/extra")
    assert await may("/logs/kubelet/x")
    assert not await may("/logsx")


async def test_a_serviceaccount_subject_without_namespace_means_the_bindings_namespace(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    bind(rbac_sim, "robot", "view", [{"kind": "ServiceAccount", "name": "robot"}], "default")
    robot = Client(session, rbac_sim.auth.token_for_service_account("default", "robot"))
    assert (await robot.req("GET", "/api/v1/namespaces/default/pods"))[0] == 200


async def test_a_binding_to_a_missing_role_is_named_in_the_denial(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    bind(rbac_sim, "dangling", "ghost", [user("frank")])
    status, body = await as_user(session, rbac_sim, "frank").req("GET", "/api/v1/nodes")
    assert status == 403
    assert body["message"].endswith(
        'at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "ghost" not found'
    )


async def test_system_masters_is_allowed_without_any_binding(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    rbac_sim.store.delete(f"clusterrolebindings.{RBAC}", "cluster-admin")
    root = as_user(session, rbac_sim, "root", "system:masters")
    assert (await root.req("DELETE", "/api/v1/namespaces/kube-public"))[0] == 200


async def test_decisions_follow_rbac_changes_at_once(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    grace = as_user(session, rbac_sim, "grace")
    assert (await grace.req("GET", "/api/v1/nodes"))[0] == 403
    role(rbac_sim, "nodes", [rule(["list"], ["nodes"])])
    bind(rbac_sim, "grace", "nodes", [user("grace")])
    assert (await grace.req("GET", "/api/v1/nodes"))[0] == 200
    rbac_sim.store.delete(f"clusterrolebindings.{RBAC}", "grace")
    assert (await grace.req("GET", "/api/v1/nodes"))[0] == 403


async def test_eviction_is_create_on_pods_eviction(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "pods", [rule(["get", "list", "delete"], ["pods"])])
    bind(rbac_sim, "heidi", "pods", [user("heidi")])
    status, body = await as_user(session, rbac_sim, "heidi").req(
        "POST", "/api/v1/namespaces/default/pods/p/eviction", {"metadata": {"name": "p"}}
    )
    assert status == 403
    assert body["message"] == (
        'pods "p" is forbidden: User "heidi" cannot create resource "pods/eviction" in API '
        'group "" in the namespace "default"'
    )


async def test_websocket_exec_needs_create_as_well_as_get(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "peek", [rule(["get"], ["pods", "pods/exec"])])
    bind(rbac_sim, "ivan", "peek", [user("ivan")])
    ivan = as_user(session, rbac_sim, "ivan")
    status, body = await ivan.req("GET", "/api/v1/namespaces/default/pods/p/exec")
    assert status == 403
    assert 'cannot create resource "pods/exec"' in body["message"]
    rbac_sim.store.patch(
        f"clusterroles.{RBAC}", "peek", {"rules": [rule(["get", "create"], ["pods", "pods/exec"])]}
    )
    status, _ = await ivan.req("GET", "/api/v1/namespaces/default/pods/p/exec")
    assert status != 403


async def test_server_side_apply_that_creates_is_also_authorised_as_create(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "patcher", [rule(["patch"], ["configmaps"])])
    bind(rbac_sim, "judy", "patcher", [user("judy")])
    judy = as_user(session, rbac_sim, "judy")
    path = "/api/v1/namespaces/default/configmaps/new"
    apply = {"ctype": "application/apply-patch+yaml", "params": {"fieldManager": "judy"}}
    status, body = await judy.req("PATCH", path, configmap("new"), **apply)
    assert status == 403
    assert body["message"] == 'configmaps "new" is forbidden: '
    assert body["details"] == {"name": "new", "kind": "configmaps"}
    rbac_sim.store.patch(
        f"clusterroles.{RBAC}",
        "patcher",
        {
            "rules": [
                rule(["patch"], ["configmaps"]),
                rule(["create"], ["configmaps"], resourceNames=["new"]),
            ]
        },
    )
    assert (await judy.req("PATCH", path, configmap("new"), **apply))[0] == 201
    assert (await judy.req("PATCH", path, configmap("new"), **apply))[0] == 200


# ----- review APIs ----------------------------------------------------------------------------


async def test_self_subject_access_review_names_the_binding_that_allows(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    bind(
        rbac_sim,
        "robot-edit",
        "edit",
        [{"kind": "ServiceAccount", "name": "robot", "namespace": "default"}],
        "default",
    )
    robot = Client(session, rbac_sim.auth.token_for_service_account("default", "robot"))
    status, body = await robot.req(
        "POST",
        SSAR,
        {
            "spec": {
                "resourceAttributes": {"verb": "create", "resource": "pods", "namespace": "default"}
            }
        },
    )
    assert status == 201
    assert body["kind"] == "SelfSubjectAccessReview"
    assert body["status"] == {
        "allowed": True,
        "reason": 'RBAC: allowed by RoleBinding "robot-edit/default" of ClusterRole "edit" to '
        'ServiceAccount "robot/default"',
    }
    assert rbac_sim.store.count("selfsubjectaccessreviews.authorization.k8s.io") == 0


async def test_review_specs_are_validated(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    root = admin(session, rbac_sim)
    status, body = await root.req("POST", SSAR, {"spec": {}})
    assert status == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes" in body["message"]
    status, body = await root.req(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}},
    )
    assert status == 422
    assert "at least one of user or group must be specified" in body["message"]
    status, body = await root.req(
        "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {"spec": {}}
    )
    assert status == 400
    assert body["message"] == "no namespace on request"


async def test_self_subject_rules_review_lists_what_the_user_holds(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "reader", [rule(["get", "list"], ["secrets"], resourceNames=["s1"])], "default")
    bind(rbac_sim, "reader", "reader", [user("kim")], "default", role_kind="Role")
    status, body = await as_user(session, rbac_sim, "kim").req(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {"spec": {"namespace": "default"}},
    )
    assert status == 201
    rules = body["status"]["resourceRules"]
    assert {
        "verbs": ["get", "list"],
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["s1"],
    } in rules
    assert {
        "verbs": ["create"],
        "apiGroups": ["authentication.k8s.io"],
        "resources": ["selfsubjectreviews"],
    } in rules
    assert any("/api/*" in r["nonResourceURLs"] for r in body["status"]["nonResourceRules"])
    assert body["status"]["incomplete"] is False


async def test_subject_access_review_needs_permission_and_takes_groups_as_given(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    spec = {"user": "nobody", "nonResourceAttributes": {"path": "/api", "verb": "get"}}
    assert (await as_user(session, rbac_sim, "leo").req("POST", path, {"spec": spec}))[0] == 403
    status, body = await admin(session, rbac_sim).req("POST", path, {"spec": spec})
    assert status == 201
    assert body["status"] == {"allowed": False}  # no system:authenticated added
    spec["groups"] = ["system:authenticated"]
    status, body = await admin(session, rbac_sim).req("POST", path, {"spec": spec})
    assert body["status"]["allowed"] is True


async def test_local_subject_access_review_takes_its_namespace_from_the_url(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    namespace(rbac_sim, "team-a")
    bind(rbac_sim, "mia", "view", [user("mia")], "team-a")
    path = "/apis/authorization.k8s.io/v1/namespaces/team-a/localsubjectaccessreviews"
    root = admin(session, rbac_sim)
    attrs = {"verb": "list", "resource": "pods"}
    status, body = await root.req(
        "POST", path, {"spec": {"user": "mia", "resourceAttributes": attrs}}
    )
    assert status == 201
    assert body["status"]["allowed"] is True
    assert body["spec"]["resourceAttributes"]["namespace"] == "team-a"
    attrs["namespace"] = "default"
    status, body = await root.req(
        "POST", path, {"spec": {"user": "mia", "resourceAttributes": attrs}}
    )
    assert status == 400
    assert body["message"] == "spec.resourceAttributes.namespace must match namespace: team-a"


async def test_self_subject_review_reports_a_service_account(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    uid = rbac_sim.store.get("serviceaccounts", "robot", "default")["metadata"]["uid"]  # type: ignore[index]
    robot = Client(session, rbac_sim.auth.token_for_service_account("default", "robot"))
    status, body = await robot.req("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {})
    assert status == 201
    info = body["status"]["userInfo"]
    assert info["username"] == "system:serviceaccount:default:robot"
    assert info["uid"] == uid
    assert info["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    ]
    assert info["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")


async def test_token_review_authenticates_tokens_for_their_audiences(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    token = rbac_sim.auth.token_for_service_account("default", "robot", audiences=["vault"])
    path = "/apis/authentication.k8s.io/v1/tokenreviews"
    root = admin(session, rbac_sim)
    status, body = await root.req("POST", path, {"spec": {"token": token, "audiences": ["vault"]}})
    assert status == 201
    assert body["status"]["authenticated"] is True
    assert body["status"]["audiences"] == ["vault"]
    assert body["status"]["user"]["username"] == "system:serviceaccount:default:robot"
    status, body = await root.req("POST", path, {"spec": {"token": token}})
    assert "authenticated" not in body["status"]
    assert body["status"]["error"]
    # The API server itself is not an audience of that token.
    assert (await Client(session, token).req("GET", "/api"))[0] == 401
    assert (await as_user(session, rbac_sim, "nia").req("POST", path, {"spec": {"token": token}}))[
        0
    ] == 403


# ----- ServiceAccount tokens ------------------------------------------------------------------


async def test_token_request_issues_a_token_that_works_until_the_account_is_deleted(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    bind(rbac_sim, "robot", "view", [{"kind": "ServiceAccount", "name": "robot"}], "default")
    path = "/api/v1/namespaces/default/serviceaccounts/robot/token"
    status, body = await admin(session, rbac_sim).req("POST", path, {"spec": {}})
    assert status == 201
    assert body["kind"] == "TokenRequest"
    assert body["spec"]["expirationSeconds"] == 3600
    assert body["spec"]["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    stamp = time.strptime(body["status"]["expirationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(calendar.timegm(stamp) - time.time() - 3600) < 60
    robot = Client(session, body["status"]["token"])
    assert (await robot.req("GET", "/api/v1/namespaces/default/pods"))[0] == 200
    rbac_sim.store.delete("serviceaccounts", "robot", "default")
    service_account(rbac_sim, "robot")  # same name, new uid: the old token stays dead
    assert (await robot.req("GET", "/api/v1/namespaces/default/pods"))[0] == 401


async def test_service_account_tokens_expire(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    path = "/api/v1/namespaces/default/serviceaccounts/robot/token"
    status, body = await admin(session, rbac_sim).req(
        "POST", path, {"spec": {"expirationSeconds": 600}}
    )
    assert status == 201
    robot = Client(session, body["status"]["token"])
    assert (await robot.req("GET", "/api"))[0] == 200
    start = time.time()
    rbac_sim.auth.clock = lambda: start + 601
    assert (await robot.req("GET", "/api"))[0] == 401


async def test_token_request_validates_duration_account_and_bound_object(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    root = admin(session, rbac_sim)
    path = "/api/v1/namespaces/default/serviceaccounts/robot/token"
    status, body = await root.req("POST", path, {"spec": {"expirationSeconds": 10}})
    assert status == 422
    assert body["message"] == (
        'TokenRequest.authentication.k8s.io "robot" is invalid: spec.expirationSeconds: '
        "Invalid value: 10: may not specify a duration less than 10 minutes"
    )
    status, body = await root.req("POST", path.replace("robot", "ghost"), {"spec": {}})
    assert status == 404
    assert body["message"] == 'serviceaccounts "ghost" not found'
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "p"}
    assert (await root.req("POST", path, {"spec": {"boundObjectRef": ref}}))[0] == 404


async def test_a_token_bound_to_a_pod_dies_with_the_pod(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    service_account(rbac_sim, "robot")
    pod = rbac_sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
    )
    root = admin(session, rbac_sim)
    path = "/api/v1/namespaces/default/serviceaccounts/robot/token"
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "wrong"}
    status, body = await root.req("POST", path, {"spec": {"boundObjectRef": ref}})
    assert status == 409
    assert "does not match the UID in record" in body["message"]
    ref["uid"] = pod["metadata"]["uid"]
    status, body = await root.req("POST", path, {"spec": {"boundObjectRef": ref}})
    assert status == 201
    robot = Client(session, body["status"]["token"])
    status, body = await robot.req("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", {})
    assert body["status"]["userInfo"]["extra"]["authentication.kubernetes.io/pod-name"] == ["p"]
    await root.req(
        "DELETE", "/api/v1/namespaces/default/pods/p", params={"gracePeriodSeconds": "0"}
    )
    await rbac_sim.wait_for(lambda: rbac_sim.store.get("pods", "p", "default") is None, DEADLINE)
    assert (await robot.req("GET", "/api"))[0] == 401


# ----- escalation prevention ------------------------------------------------------------------


async def test_nobody_creates_a_role_granting_what_they_do_not_hold(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(
        rbac_sim,
        "role-admin",
        [
            rule(["create", "update", "patch"], ["roles"], (RBAC,)),
            rule(["get", "list"], ["configmaps"]),
        ],
    )
    bind(rbac_sim, "oscar", "role-admin", [user("oscar")], "default")
    oscar = as_user(session, rbac_sim, "oscar")
    wanted = {
        "metadata": {"name": "r"},
        "rules": [rule(["get", "list", "watch"], ["secrets", "configmaps"])],
    }
    status, body = await oscar.req("POST", f"{RBAC_V1}/namespaces/default/roles", wanted)
    assert status == 403
    assert body["message"] == (
        'roles.rbac.authorization.k8s.io "r" is forbidden: user "oscar" (groups='
        '["system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n'
        '{APIGroups:[""], Resources:["configmaps"], Verbs:["watch"]}\n'
        '{APIGroups:[""], Resources:["secrets"], Verbs:["get" "list" "watch"]}'
    )
    assert body["details"] == {"name": "r", "group": RBAC, "kind": "roles"}
    wanted["rules"] = [rule(["get"], ["configmaps"])]
    assert (await oscar.req("POST", f"{RBAC_V1}/namespaces/default/roles", wanted))[0] == 201


async def test_escalate_helps_a_named_apply_but_not_a_post(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(
        rbac_sim,
        "esc",
        [
            rule(["create", "patch"], ["clusterroles"], (RBAC,)),
            rule(["escalate"], ["clusterroles"], (RBAC,), resourceNames=["secrets-reader"]),
        ],
    )
    bind(rbac_sim, "pat", "esc", [user("pat")])
    pat = as_user(session, rbac_sim, "pat")
    wanted = {
        "apiVersion": f"{RBAC}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "secrets-reader"},
        "rules": [rule(["get"], ["secrets"])],
    }
    assert (await pat.req("POST", f"{RBAC_V1}/clusterroles", wanted))[0] == 403
    status, body = await pat.req(
        "PATCH",
        f"{RBAC_V1}/clusterroles/secrets-reader",
        wanted,
        ctype="application/apply-patch+yaml",
        params={"fieldManager": "pat"},
    )
    assert status == 201, body


async def test_an_aggregated_clusterrole_needs_full_authority(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "maker", [rule(["create"], ["clusterroles"], (RBAC,))])
    bind(rbac_sim, "quinn", "maker", [user("quinn")])
    wanted = {
        "metadata": {"name": "agg"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]},
    }
    status, body = await as_user(session, rbac_sim, "quinn").req(
        "POST", f"{RBAC_V1}/clusterroles", wanted
    )
    assert status == 403
    assert '{APIGroups:["*"], Resources:["*"], Verbs:["*"]}' in body["message"]
    assert '{NonResourceURLs:["*"], Verbs:["*"]}' in body["message"]


async def test_binding_a_role_needs_bind_or_holding_the_role(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    role(rbac_sim, "binder", [rule(["create"], ["rolebindings"], (RBAC,))])
    bind(rbac_sim, "rose", "binder", [user("rose")], "default")
    rose = as_user(session, rbac_sim, "rose")
    path = f"{RBAC_V1}/namespaces/default/rolebindings"

    def binding(name: str, role_name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role_name},
            "subjects": [user("sam")],
        }

    status, body = await rose.req("POST", path, binding("b1", "edit"))
    assert status == 403
    assert body["message"].startswith(
        'rolebindings.rbac.authorization.k8s.io "b1" is forbidden: user "rose"'
    )
    status, body = await rose.req("POST", path, binding("b0", "ghost"))
    assert status == 404
    assert body["message"] == 'clusterroles.rbac.authorization.k8s.io "ghost" not found'
    rbac_sim.store.patch(
        f"clusterroles.{RBAC}",
        "binder",
        {
            "rules": [
                rule(["create"], ["rolebindings"], (RBAC,)),
                rule(["bind"], ["clusterroles"], (RBAC,), resourceNames=["edit"]),
            ]
        },
    )
    assert (await rose.req("POST", path, binding("b1", "edit")))[0] == 201
    # bind on edit says nothing about admin.
    assert (await rose.req("POST", path, binding("b2", "admin")))[0] == 403


async def test_a_bindings_role_reference_cannot_change(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    bind(rbac_sim, "fixed", "view", [user("tom")])
    status, body = await admin(session, rbac_sim).req(
        "PATCH",
        f"{RBAC_V1}/clusterrolebindings/fixed",
        {"roleRef": {"name": "edit"}},
        ctype="application/merge-patch+json",
    )
    assert status == 422
    assert "roleRef" in body["message"]
    assert "cannot change roleRef" in body["message"]


async def test_aggregated_clusterroles_collect_the_rules_of_labelled_roles(
    rbac_sim: kubesim.Cluster,
) -> None:
    rbac_sim.store.create(
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "ClusterRole",
            "metadata": {
                "name": "widgets-view",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"},
            },
            "rules": [rule(["get", "list"], ["widgets"], ("example.com",))],
        }
    )
    widget_rule = rule(["get", "list"], ["widgets"], ("example.com",))

    def holds(name: str) -> bool:
        found = rbac_sim.store.get(f"clusterroles.{RBAC}", name) or {}
        return widget_rule in (found.get("rules") or [])

    # view aggregates it, edit aggregates view, admin aggregates edit.
    await rbac_sim.wait_for(lambda: holds("view") and holds("edit") and holds("admin"), DEADLINE)


# ----- impersonation --------------------------------------------------------------------------


async def test_impersonation_needs_the_impersonate_verb(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    alice = as_user(session, rbac_sim, "alice")
    status, body = await alice.req("GET", "/api", headers={"Impersonate-User": "bob"})
    assert status == 403
    assert body["message"] == (
        'users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API '
        'group "" at the cluster scope'
    )
    role(
        rbac_sim, "imp", [rule(["impersonate"], ["users", "groups"], resourceNames=["bob", "devs"])]
    )
    bind(rbac_sim, "imp", "imp", [user("alice")])
    status, body = await alice.req(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {},
        headers={"Impersonate-User": "bob", "Impersonate-Group": "devs"},
    )
    assert status == 201
    assert body["status"]["userInfo"] == {
        "username": "bob",
        "groups": ["devs", "system:authenticated"],
    }
    status, body = await alice.req(
        "GET", "/api", headers={"Impersonate-User": "bob", "Impersonate-Group": "admins"}
    )
    assert status == 403
    assert 'groups "admins" is forbidden' in body["message"]


async def test_impersonating_a_service_account_gives_its_groups(
    rbac_sim: kubesim.Cluster, session: aiohttp.ClientSession
) -> None:
    status, body = await admin(session, rbac_sim).req(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {},
        headers={"Impersonate-User": "system:serviceaccount:kube-system:builder"},
    )
    assert status == 201
    assert body["status"]["userInfo"]["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
        "system:authenticated",
    ]


# ----- kubectl --------------------------------------------------------------------------------


async def kubectl(
    sim: kubesim.Cluster, *args: str, kubeconfig: Path | None = None, check: bool = True
) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig or sim.kubeconfig_path)}
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    if check:
        assert proc.returncode == 0, out.decode()
    return out.decode()


@needs_kubectl
async def test_kubectl_auth_can_i_whoami_and_a_limited_users_forbidden_message(
    rbac_sim: kubesim.Cluster, tmp_path: Path
) -> None:
    assert (await kubectl(rbac_sim, "auth", "can-i", "create", "pods")).strip() == "yes"
    whoami = await kubectl(rbac_sim, "auth", "whoami")
    assert "kubesim-admin" in whoami
    assert "system:masters" in whoami
    namespace(rbac_sim, "team-a")
    bind(rbac_sim, "uma", "view", [user("uma")], "team-a")
    limited = rbac_sim.auth.write_kubeconfig(
        rbac_sim.auth.token_for("uma", ["qa"]), tmp_path / "uma", namespace="team-a"
    )
    can_i = await kubectl(
        rbac_sim, "auth", "can-i", "create", "pods", kubeconfig=limited, check=False
    )
    assert can_i.strip() == "no"
    assert (
        await kubectl(rbac_sim, "auth", "can-i", "list", "pods", kubeconfig=limited)
    ).strip() == "yes"
    listing = await kubectl(rbac_sim, "auth", "can-i", "--list", kubeconfig=limited)
    assert "selfsubjectaccessreviews.authorization.k8s.io" in listing
    assert "pods" in listing
    whoami = await kubectl(rbac_sim, "auth", "whoami", kubeconfig=limited)
    assert "uma" in whoami
    assert "[qa system:authenticated]" in whoami
    out = await kubectl(
        rbac_sim, "get", "pods", "-n", "kube-system", kubeconfig=limited, check=False
    )
    assert (
        'Error from server (Forbidden): pods is forbidden: User "uma" cannot list resource "pods" '
        'in API group "" in the namespace "kube-system"'
    ) in out


@needs_kubectl
async def test_kubectl_can_i_as_another_user_through_impersonation(
    rbac_sim: kubesim.Cluster,
) -> None:
    asked = ("auth", "can-i", "get", "pods", "-n", "default", "--as=vic")
    assert (await kubectl(rbac_sim, *asked, check=False)).strip() == "no"
    bind(rbac_sim, "vic", "view", [user("vic")], "default")
    assert (await kubectl(rbac_sim, *asked)).strip() == "yes"


@needs_kubectl
async def test_kubectl_create_token_gives_a_working_service_account_token(
    rbac_sim: kubesim.Cluster, tmp_path: Path
) -> None:
    service_account(rbac_sim, "robot")
    token = (await kubectl(rbac_sim, "create", "token", "robot", "--duration=20m")).strip()
    config = rbac_sim.auth.write_kubeconfig(token, tmp_path / "robot")
    whoami = await kubectl(rbac_sim, "auth", "whoami", kubeconfig=config)
    assert "system:serviceaccount:default:robot" in whoami
    answer = await kubectl(
        rbac_sim, "auth", "can-i", "list", "nodes", kubeconfig=config, check=False
    )
    assert answer.strip().splitlines()[-1] == "no"


async def test_kubesim_serve_authenticates_by_default(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    exe = str(Path(sys.executable).parent / "kubesim")
    proc = await asyncio.create_subprocess_exec(
        exe,
        "serve",
        "--authorization",
        "rbac",
        "--kubeconfig-out",
        str(config),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        url = (await within(proc.stdout.readline(), "the served URL")).decode().strip()
        doc = yaml.safe_load(config.read_text())
        ca = base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"])
        token = doc["users"][0]["user"]["token"]
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cadata=ca.decode()))
        async with aiohttp.ClientSession(base_url=url, connector=connector) as http:
            assert (await Client(http, None).req("GET", "/api/v1/nodes"))[0] == 401
            assert (await Client(http, token).req("GET", "/api/v1/nodes"))[0] == 200
    finally:
        proc.terminate()
        assert await within(proc.wait(), "kubesim serve to exit") == 0


@needs_kubectl
async def test_kubectl_exec_needs_create_on_pods_exec(
    rbac_sim: kubesim.Cluster, tmp_path: Path
) -> None:
    rbac_sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
    )
    role(rbac_sim, "peek", [rule(["get", "list"], ["pods", "pods/exec"])])
    bind(rbac_sim, "wes", "peek", [user("wes")])
    config = rbac_sim.auth.write_kubeconfig(rbac_sim.auth.token_for("wes"), tmp_path / "wes")
    out = await kubectl(rbac_sim, "exec", "p", "--", "true", kubeconfig=config, check=False)
    assert 'User "wes" cannot create resource "pods/exec" in API group ""' in out
