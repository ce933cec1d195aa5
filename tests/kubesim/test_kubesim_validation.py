"""Schemas of built-in kinds: decoding, validation, defaulting, fieldValidation and OpenAPI.

Over HTTP with the real Status bodies, and with the real kubectl (explain, apply --prune,
--validate, create of invalid objects, client-side apply merge keys, describe of every kind).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubesim_helpers import KUBECTL, Api, kubectl, needs_kubectl
from waiting import DEADLINE

import kubesim
from kubesim import builtin_schemas, errors, openapi, openapi_v2
from kubesim.validation import batch, quantity

ROOT = Path(__file__).resolve().parents[2]
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"
SERVICES = "/api/v1/namespaces/default/services"
CMS = "/api/v1/namespaces/default/configmaps"
SECRETS = "/api/v1/namespaces/default/secrets"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
JOBS = "/apis/batch/v1/namespaces/default/jobs"
CRONJOBS = "/apis/batch/v1/namespaces/default/cronjobs"
STS = "/apis/apps/v1/namespaces/default/statefulsets"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
STRICT = {"fieldValidation": "Strict"}


def deployment(name: str = "web", **spec: Any) -> dict[str, Any]:
    """A valid Deployment; keyword arguments replace spec fields."""
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
            },
        },
    }
    body["spec"].update(spec)
    return body


def pod(name: str = "p", **spec: Any) -> dict[str, Any]:
    """A valid Pod; keyword arguments replace spec fields."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
    }
    body["spec"].update(spec)
    return body


async def send(
    api: Api, method: str, path: str, body: Any = None, *, raw: bytes | None = None, **params: str
) -> tuple[int, Any, str | None]:
    """A request returning (status, decoded body, Warning header)."""
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    async with api.session.request(
        method, path, data=data, params=params or None, headers=headers
    ) as resp:
        return resp.status, json.loads(await resp.read()), resp.headers.get("Warning")


def causes(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(reason, field) of each cause of a Status."""
    return [(c["reason"], c["field"]) for c in body["details"]["causes"]]


# ----- decoding -------------------------------------------------------------------------------


async def test_a_wrong_type_is_a_400_worded_like_the_go_decoder(api: Api) -> None:
    status, body, _ = await send(api, "POST", DEPLOYS, deployment(replicas="three"))
    assert status == 400
    assert body["reason"] == "BadRequest"
    assert body["message"] == (
        'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal '
        "string into Go struct field DeploymentSpec.spec.replicas of type int32"
    )
    assert (await api.req("GET", f"{DEPLOYS}/web"))[0] == 404


async def test_type_errors_name_the_innermost_struct_and_the_path_without_indices(api: Api) -> None:
    body = deployment()
    body["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": 5}]
    status, result, _ = await send(api, "POST", DEPLOYS, body)
    assert status == 400
    assert result["message"].endswith(
        "json: cannot unmarshal number into Go struct field "
        "EnvVar.spec.template.spec.containers.env.value of type string"
    )
    status, result, _ = await send(api, "POST", PODS, pod(containers="c"))
    assert result["message"].endswith(
        "cannot unmarshal string into Go struct field PodSpec.spec.containers "
        "of type []v1.Container"
    )


async def test_int_or_string_quantity_and_base64_fields_are_checked(api: Api) -> None:
    status, body, _ = await send(
        api, "POST", DEPLOYS, deployment(strategy={"rollingUpdate": {"maxSurge": True}})
    )
    assert (status, body["message"].split(": ", 1)[1]) == (
        400,
        "json: cannot unmarshal bool into Go value of type int32",
    )
    limits = {"resources": {"limits": {"cpu": "lots"}}}
    spec = {"containers": [{"name": "c", "image": "busybox:1", **limits}]}
    status, body, _ = await send(api, "POST", PODS, pod(**spec))
    assert status == 400
    assert body["message"].endswith(
        "quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "no$"}}
    status, body, _ = await send(api, "POST", SECRETS, secret)
    assert status == 400
    assert body["message"] == (
        'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 2'
    )


async def test_quantities_are_stored_in_canonical_form(api: Api) -> None:
    resources = {"limits": {"cpu": 0.5, "memory": "1.5Gi"}, "requests": {"cpu": "250m"}}
    spec = {"containers": [{"name": "c", "image": "busybox:1", "resources": resources}]}
    created = await api.ok("POST", PODS, pod(**spec))
    stored = created["spec"]["containers"][0]["resources"]
    # Requests default to limits where only a limit is given (pods only, not templates).
    assert stored == {
        "limits": {"cpu": "500m", "memory": "1536Mi"},
        "requests": {"cpu": "250m", "memory": "1536Mi"},
    }


async def test_nulls_leave_fields_unset(api: Api) -> None:
    created = await api.ok("POST", DEPLOYS, deployment(paused=None, minReadySeconds=None))
    assert "paused" not in created["spec"]
    assert "minReadySeconds" not in created["spec"]


# ----- fieldValidation ------------------------------------------------------------------------


async def test_unknown_fields_are_dropped_and_warned_about_by_default(api: Api) -> None:
    body = deployment(foo="bar")
    body["spec"]["template"]["spec"]["containers"][0]["colour"] = "blue"
    status, created, warning = await send(api, "POST", DEPLOYS, body)
    assert status == 201
    assert "foo" not in created["spec"]
    assert "colour" not in created["spec"]["template"]["spec"]["containers"][0]
    # One warning per field, in the order the decoder meets them (document order).
    assert warning == (
        '299 - "unknown field \\"spec.template.spec.containers[0].colour\\"", '
        '299 - "unknown field \\"spec.foo\\""'
    )
    stored = await api.ok("GET", f"{DEPLOYS}/web")
    assert "foo" not in stored["spec"]


async def test_strict_field_validation_rejects_unknown_and_duplicate_fields(api: Api) -> None:
    raw = json.dumps(deployment(foo=1)).replace('"replicas": 1', '"replicas": 1, "replicas": 2')
    status, body, _ = await send(api, "POST", DEPLOYS, raw=raw.encode(), **STRICT)
    assert status == 400
    assert body["message"] == (
        'Deployment in version "v1" cannot be handled as a Deployment: strict decoding error: '
        'duplicate field "spec.replicas", unknown field "spec.foo"'
    )
    status, created, warning = await send(api, "POST", DEPLOYS, raw=raw.encode())
    assert status == 201
    assert created["spec"]["replicas"] == 2  # the last duplicate wins
    assert warning is not None
    assert 'duplicate field \\"spec.replicas\\"' in warning


async def test_ignore_drops_unknown_fields_silently(api: Api) -> None:
    status, created, warning = await send(
        api, "POST", DEPLOYS, deployment(foo=1), fieldValidation="Ignore"
    )
    assert (status, warning) == (201, None)
    assert "foo" not in created["spec"]


async def test_an_unknown_field_validation_directive_is_rejected(api: Api) -> None:
    status, body, _ = await send(api, "POST", DEPLOYS, deployment(), fieldValidation="Loose")
    assert status == 422
    assert body["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )


async def test_patches_are_decoded_and_field_validated_too(api: Api) -> None:
    await api.ok("POST", DEPLOYS, deployment())
    merge = "application/merge-patch+json"
    status, body = await api.req(
        "PATCH", f"{DEPLOYS}/web", {"spec": {"replicas": "2"}}, ctype=merge
    )
    assert status == 400
    assert "Go struct field DeploymentSpec.spec.replicas of type int32" in body["message"]
    status, body = await api.req(
        "PATCH", f"{DEPLOYS}/web", {"spec": {"bogus": 1}}, ctype=merge, params=STRICT
    )
    assert status == 400
    assert body["message"].endswith('strict decoding error: unknown field "spec.bogus"')


async def test_custom_resources_get_metadata_checks_and_strict_duplicates(api: Api) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }
    await api.ok("POST", CRDS, crd)
    path = "/apis/example.com/v1/namespaces/default/widgets"
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    widget["metadata"]["labels"] = {"bad key": "v"}
    status, body, _ = await send(api, "POST", path, widget)
    assert status == 422
    assert causes(body) == [("FieldValueInvalid", "metadata.labels")]
    raw = b'{"apiVersion":"example.com/v1","kind":"Widget","kind":"Widget","metadata":{"name":"w"}}'
    status, body, _ = await send(api, "POST", path, raw=raw, **STRICT)
    assert status == 400
    assert body["message"].endswith('strict decoding error: duplicate field "kind"')


# ----- validation -----------------------------------------------------------------------------


async def test_a_selector_that_misses_the_template_is_a_422_with_the_real_message(api: Api) -> None:
    body = deployment()
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    status, result, _ = await send(api, "POST", DEPLOYS, body)
    assert status == 422
    assert result["reason"] == "Invalid"
    assert result["message"] == (
        'Deployment.apps "web" is invalid: spec.template.metadata.labels: Invalid value: '
        'map[string]string{"app":"other"}: `selector` does not match template `labels`'
    )
    assert result["details"] == {
        "name": "web",
        "group": "apps",
        "kind": "Deployment",
        "causes": [
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: map[string]string{"app":"other"}: '
                "`selector` does not match template `labels`",
                "field": "spec.template.metadata.labels",
            }
        ],
    }


async def test_several_problems_are_listed_in_brackets_with_a_cause_each(api: Api) -> None:
    containers = [{"name": "Web_1"}, {"name": "Web_1", "image": "x"}]
    status, body, _ = await send(api, "POST", PODS, pod(containers=containers))
    assert status == 422
    assert body["message"].startswith('Pod "p" is invalid: [spec.containers[0].name: Invalid')
    assert causes(body) == [
        ("FieldValueInvalid", "spec.containers[0].name"),
        ("FieldValueRequired", "spec.containers[0].image"),
        ("FieldValueInvalid", "spec.containers[1].name"),
        ("FieldValueDuplicate", "spec.containers[1].name"),
    ]


async def test_workload_rules(api: Api) -> None:
    status, body, _ = await send(api, "POST", DEPLOYS, deployment(selector={}))
    assert status == 422
    assert "empty selector is invalid for deployment" in body["message"]
    template = deployment()["spec"]["template"]
    template["spec"]["restartPolicy"] = "OnFailure"
    status, body, _ = await send(api, "POST", DEPLOYS, deployment(template=template))
    assert body["message"].endswith(
        'spec.template.spec.restartPolicy: Unsupported value: "OnFailure": '
        'supported values: "Always"'
    )
    status, body, _ = await send(api, "POST", DEPLOYS, deployment(replicas=-1))
    assert causes(body) == [("FieldValueInvalid", "spec.replicas")]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1"}]}}},
    }
    status, body, _ = await send(api, "POST", JOBS, job)
    assert body["message"].endswith(
        'spec.template.spec.restartPolicy: Unsupported value: "Always": '
        'supported values: "OnFailure", "Never"'
    )
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"schedule": "61 * * * *", "jobTemplate": {"spec": job["spec"]}},
    }
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    status, body, _ = await send(api, "POST", CRONJOBS, cron)
    assert body["message"].endswith(
        'spec.schedule: Invalid value: "61 * * * *": end of range (61) above maximum (59): 61'
    )


async def test_container_rules(api: Api) -> None:
    container = {
        "name": "c",
        "image": "x:1",
        "ports": [{"containerPort": 70000, "protocol": "QUIC"}],
        "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}},
        "volumeMounts": [{"name": "missing", "mountPath": "/m"}],
    }
    status, body, _ = await send(api, "POST", PODS, pod(containers=[container]))
    assert status == 422
    assert causes(body) == [
        ("FieldValueInvalid", "spec.containers[0].ports[0].containerPort"),
        ("FieldValueNotSupported", "spec.containers[0].ports[0].protocol"),
        ("FieldValueNotFound", "spec.containers[0].volumeMounts[0].name"),
        ("FieldValueInvalid", "spec.containers[0].resources.requests"),
    ]
    assert (
        'spec.containers[0].resources.requests: Invalid value: "2": '
        "must be less than or equal to cpu limit of 1" in body["message"]
    )


async def test_service_configmap_secret_and_pdb_rules(api: Api) -> None:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    status, body, _ = await send(api, "POST", SERVICES, svc)
    assert (status, causes(body)) == (422, [("FieldValueRequired", "spec.ports")])
    svc["spec"]["ports"] = [{"port": 80}, {"port": 81}]
    status, body, _ = await send(api, "POST", SERVICES, svc)
    assert causes(body) == [
        ("FieldValueRequired", "spec.ports[0].name"),
        ("FieldValueRequired", "spec.ports[1].name"),
    ]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a b": "1"}}
    status, body, _ = await send(api, "POST", CMS, cm)
    assert (status, causes(body)) == (422, [("FieldValueInvalid", "data[a b]")])
    assert "a valid config key must consist of alphanumeric characters" in body["message"]
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "b"},
        "spec": {"minAvailable": 1, "maxUnavailable": "150%"},
    }
    status, body, _ = await send(api, "POST", PDBS, pdb)
    assert causes(body) == [
        ("FieldValueInvalid", "spec"),
        ("FieldValueInvalid", "spec.maxUnavailable"),
    ]
    assert "minAvailable and maxUnavailable cannot be both set" in body["message"]


async def test_label_and_annotation_keys_are_checked(api: Api) -> None:
    body = deployment()
    body["metadata"]["labels"] = {"ok": "bad value!"}
    body["metadata"]["annotations"] = {"a/b/c": "x"}
    status, result, _ = await send(api, "POST", DEPLOYS, body)
    assert status == 422
    assert causes(result) == [
        ("FieldValueInvalid", "metadata.labels"),
        ("FieldValueInvalid", "metadata.annotations"),
    ]


async def test_updates_keep_selectors_and_immutable_configmaps(api: Api) -> None:
    await api.ok("POST", DEPLOYS, deployment())
    live = await api.ok("GET", f"{DEPLOYS}/web")
    changed = copy.deepcopy(live)
    del changed["metadata"]["resourceVersion"]  # the controller may have written status since
    changed["spec"]["selector"] = {"matchLabels": {"app": "web", "tier": "x"}}
    changed["spec"]["template"]["metadata"]["labels"]["tier"] = "x"
    status, body, _ = await send(api, "PUT", f"{DEPLOYS}/web", changed)
    assert (status, causes(body)) == (422, [("FieldValueInvalid", "spec.selector")])
    assert body["message"].endswith("field is immutable")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}
    await api.ok("POST", CMS, {**cm, "immutable": True})
    status, body = await api.req(
        "PATCH", f"{CMS}/c", {"data": {"a": "2"}}, ctype="application/merge-patch+json"
    )
    assert (status, causes(body)) == (422, [("FieldValueForbidden", "data")])


async def test_status_writes_are_type_checked(api: Api) -> None:
    await api.ok("POST", DEPLOYS, deployment())
    live = await api.ok("GET", f"{DEPLOYS}/web")
    live["status"] = {"replicas": "many"}
    status, body, _ = await send(api, "PUT", f"{DEPLOYS}/web/status", live)
    assert status == 400
    assert "DeploymentStatus.status.replicas of type int32" in body["message"]


async def test_a_missing_priority_class_is_forbidden(api: Api) -> None:
    status, body, _ = await send(api, "POST", PODS, pod(priorityClassName="gold"))
    assert (status, body["reason"]) == (403, "Forbidden")
    assert body["message"] == 'pods "p" is forbidden: no PriorityClass with name gold was found'


# ----- defaults -------------------------------------------------------------------------------


async def test_pod_defaults(api: Api) -> None:
    container = {
        "name": "c",
        "image": "busybox",
        "readinessProbe": {"httpGet": {"port": 8080}},
        "livenessProbe": {"exec": {"command": ["true"]}},
        "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
    }
    volumes = [
        {"name": "cfg", "configMap": {"name": "c"}},
        {"name": "host", "hostPath": {"path": "/run"}},
        {"name": "scratch"},
    ]
    created = await api.ok(
        "POST",
        PODS,
        pod(containers=[container], volumes=volumes, priorityClassName="system-node-critical"),
    )
    spec = created["spec"]
    made = spec["containers"][0]
    assert made["imagePullPolicy"] == "Always"
    assert made["terminationMessagePath"] == "/dev/termination-log"
    assert made["readinessProbe"] == {
        "httpGet": {"port": 8080, "path": "/", "scheme": "HTTP"},
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    assert made["livenessProbe"]["failureThreshold"] == 3
    assert made["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert spec["volumes"] == [
        {"name": "cfg", "configMap": {"name": "c", "defaultMode": 420}},
        {"name": "host", "hostPath": {"path": "/run", "type": ""}},
        {"name": "scratch", "emptyDir": {}},
    ]
    assert (spec["enableServiceLinks"], spec["dnsPolicy"], spec["schedulerName"]) == (
        True,
        "ClusterFirst",
        "default-scheduler",
    )
    assert (spec["priority"], spec["preemptionPolicy"]) == (2000001000, "PreemptLowerPriority")
    plain = await api.ok("POST", PODS, pod("q"))
    assert plain["spec"]["priority"] == 0


async def test_workload_defaults(api: Api) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
    assert (await api.ok("POST", SECRETS, secret))["type"] == "Opaque"
    template = {
        "metadata": {"labels": {"app": "j"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x:1"}]},
    }
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}}
    created = await api.ok("POST", JOBS, {**job, "spec": {"template": template}})
    spec = created["spec"]
    assert {k: spec[k] for k in ("backoffLimit", "completions", "parallelism")} == {
        "backoffLimit": 6,
        "completions": 1,
        "parallelism": 1,
    }
    assert (spec["completionMode"], spec["suspend"], spec["podReplacementPolicy"]) == (
        "NonIndexed",
        False,
        "TerminatingOrFailed",
    )
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}},
    }
    spec = (await api.ok("POST", CRONJOBS, cron))["spec"]
    assert (spec["concurrencyPolicy"], spec["suspend"]) == ("Allow", False)
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    sts = deployment("db")
    sts.update(kind="StatefulSet")
    del sts["spec"]["replicas"]
    spec = (await api.ok("POST", STS, sts))["spec"]
    assert spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("0.5", "500m"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("1.5Gi", "1536Mi"),
        ("1024", "1024"),
        ("2048Ki", "2Mi"),
        ("1e3", "1e3"),
        ("0.0000000001", "1n"),
        ("1000m", "1"),
    ],
)
def test_quantities_take_the_servers_canonical_form(given: str, stored: str) -> None:
    assert quantity.canonical(given) == stored


@pytest.mark.parametrize(
    ("schedule", "problem"),
    [
        ("*/5 * * * *", None),
        ("@hourly", None),
        ("0 0 * * MON-FRI", None),
        ("* * *", "expected exactly 5 fields, found 3: * * *"),
        ("x * * * *", 'failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax'),
        ("0 24 * * *", "end of range (24) above maximum (23): 24"),
        ("TZ=UTC 0 * * * *", "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"),
    ],
)
def test_cron_schedules_are_checked_with_the_cron_librarys_words(
    schedule: str, problem: str | None
) -> None:
    assert batch.schedule_problem(schedule) == problem


# ----- schemas and OpenAPI --------------------------------------------------------------------


def test_list_semantics_come_from_the_real_schemas() -> None:
    containers = ("spec", "template", "spec", "containers")
    lists = builtin_schemas.list_semantics("apps", "v1", "Deployment", containers)
    assert lists == builtin_schemas.ListSemantics("map", ("name",), "merge", "name")
    ports = builtin_schemas.list_semantics("", "v1", "Service", ("spec", "ports"))
    assert ports is not None
    assert (ports.type, ports.keys, ports.patch_merge_key) == ("map", ("port", "protocol"), "port")
    tolerations = builtin_schemas.list_semantics("", "v1", "Pod", ("spec", "tolerations"))
    assert tolerations is not None
    assert tolerations.type == "atomic"
    finalizers = builtin_schemas.list_semantics("", "v1", "Pod", ("metadata", "finalizers"))
    assert finalizers is not None
    assert finalizers.type == "set"
    selector = ("spec", "selector")
    assert builtin_schemas.map_type("apps", "v1", "Deployment", selector) == "atomic"
    assert builtin_schemas.map_type("", "v1", "Pod", ("metadata", "labels")) == "granular"
    assert builtin_schemas.list_semantics("", "v1", "Pod", ("spec", "nodeName")) is None


def test_the_generated_schema_file_is_current() -> None:
    pytest.importorskip("kubernetes_validate")
    script = ROOT / "scripts" / "gen_kubesim_openapi.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


async def test_v3_documents_carry_builtin_schemas_and_merge_keys(api: Api) -> None:
    doc = await api.ok("GET", "/openapi/v3/apis/apps/v1")
    schemas = doc["components"]["schemas"]
    deploy = schemas["io.k8s.api.apps.v1.Deployment"]
    assert deploy["x-kubernetes-group-version-kind"] == [
        {"group": "apps", "kind": "Deployment", "version": "v1"}
    ]
    strategy = schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["strategy"]
    assert strategy == {
        "allOf": [{"$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentStrategy"}],
        "x-kubernetes-patch-strategy": "retainKeys",
    }
    containers = schemas["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" in schemas
    assert "description" not in json.dumps(deploy)


async def test_v2_is_served_as_json_and_as_gnostic_protobuf(api: Api, sim: kubesim.Cluster) -> None:
    doc = await api.ok("GET", "/openapi/v2")
    assert doc["swagger"] == "2.0"
    assert "io.k8s.api.core.v1.Pod" in doc["definitions"]
    async with api.session.get("/openapi/v2", headers={"Accept": openapi_v2.MEDIA_TYPE}) as resp:
        assert resp.headers["Content-Type"] == openapi_v2.RESPONSE_TYPE
        raw = await resp.read()
    assert raw == openapi.v2_bytes(sim.store.registry, protobuf=True)
    document = gnostic_document_class()
    if document is None:
        pytest.skip("kubectl (which embeds the gnostic descriptor) is not installed")
    parsed = document.FromString(raw)
    assert parsed.swagger == "2.0"
    by_name = {n.name: n.value for n in parsed.definitions.additional_properties}
    assert set(by_name) == set(doc["definitions"])
    spec = by_name["io.k8s.api.core.v1.PodSpec"]
    props = {p.name: p.value for p in spec.properties.additional_properties}
    extensions = {e.name: e.value.yaml for e in props["containers"].vendor_extension}
    assert json.loads(extensions["x-kubernetes-patch-merge-key"]) == "name"
    assert list(props["containers"].type.value) == ["array"]
    item_ref = props["containers"].items.schema[0]._ref
    assert item_ref == "#/definitions/io.k8s.api.core.v1.Container"


def gnostic_document_class() -> Any:
    """openapi.v2.Document built from the FileDescriptorProto embedded in the kubectl binary."""
    if not KUBECTL.exists():
        return None
    from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

    data = KUBECTL.read_bytes()
    start = data.index(b"openapiv2/OpenAPIv2.proto\x12\nopenapi.v2") - 2
    end = start
    while True:  # walk the top-level fields of the FileDescriptorProto to find its end
        tag = data[end]
        number, wire_type = tag >> 3, tag & 7
        if not 1 <= number <= 14 or wire_type != 2:
            break
        length, shift, pos = 0, 0, end + 1
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        end = pos + length
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(any_pb2.DESCRIPTOR.serialized_pb))
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(data[start:end]))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("openapi.v2.Document"))


async def test_documents_are_built_once_per_registry_generation(sim: kubesim.Cluster) -> None:
    registry = sim.store.registry
    first = openapi.group_version_bytes(registry, "apis/apps/v1")
    assert openapi.group_version_bytes(registry, "apis/apps/v1") is first
    v2 = openapi.v2_bytes(registry, protobuf=False)
    sim.store.create(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "gadgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                "scope": "Namespaced",
                "versions": [{"name": "v1", "served": True, "storage": True}],
            },
        }
    )
    assert openapi.group_version_bytes(registry, "apis/apps/v1") is not first
    assert b"com.example.v1.Gadget" in openapi.v2_bytes(registry, protobuf=False)
    assert b"com.example.v1.Gadget" not in v2


# ----- kubectl --------------------------------------------------------------------------------


@needs_kubectl
async def test_kubectl_explain_uses_the_served_schemas(sim: kubesim.Cluster) -> None:
    out = await kubectl(sim, "explain", "pods")
    assert re.search(r"KIND:\s+Pod", out)
    assert re.search(r"spec\s+<PodSpec>", out)
    out = await kubectl(sim, "explain", "pods.spec.containers.resources")
    assert re.search(r"limits\s+<map\[string\]Quantity>", out)
    out = await kubectl(sim, "explain", "deployment", "--recursive")
    assert re.search(r"strategy\s+<DeploymentStrategy>", out)
    assert re.search(r"maxSurge\s+<IntOrString>", out)
    out = await kubectl(sim, "explain", "pods.spec.containers", "--output=plaintext-openapiv2")
    assert re.search(r"RESOURCE:\s+containers <\[\]Object>", out)


@needs_kubectl
async def test_kubectl_apply_prune_works_without_an_allowlist(
    sim: kubesim.Cluster, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "x"}},
            "data": {"k": name},
        }
        (tmp_path / f"{name}.yaml").write_text(json.dumps(manifest))
    out = await kubectl(sim, "apply", "--prune", "-l", "app=x", "-f", str(tmp_path))
    assert "configmap/a created" in out
    (tmp_path / "b.yaml").unlink()
    out = await kubectl(sim, "apply", "--prune", "-l", "app=x", "-f", str(tmp_path))
    assert "configmap/b pruned" in out
    assert sim.store.get("configmaps", "b", "default") is None


@needs_kubectl
async def test_kubectl_validate_strict_fails_and_warn_warns(sim: kubesim.Cluster) -> None:
    body = deployment(replicaz=3)
    manifest = json.dumps(body)
    out = await kubectl(sim, "apply", "--validate=strict", "-f", "-", stdin=manifest, check=False)
    assert 'strict decoding error: unknown field "spec.replicaz"' in out
    out = await kubectl(sim, "apply", "--validate=warn", "-f", "-", stdin=manifest)
    assert 'Warning: unknown field "spec.replicaz"' in out
    assert "deployment.apps/web created" in out


@needs_kubectl
async def test_kubectl_create_of_an_invalid_deployment_shows_the_server_error(
    sim: kubesim.Cluster,
) -> None:
    body = deployment()
    body["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    out = await kubectl(sim, "create", "-f", "-", stdin=json.dumps(body), check=False)
    assert out.strip() == (
        'The Deployment "web" is invalid: spec.template.metadata.labels: Invalid value: '
        'map[string]string{"app":"other"}: `selector` does not match template `labels`'
    )
    out = await kubectl(
        sim, "create", "-f", "-", stdin=json.dumps(deployment(replicas="2")), check=False
    )
    assert "cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas" in out


@needs_kubectl
async def test_kubectl_client_side_apply_merges_lists_by_their_keys(sim: kubesim.Cluster) -> None:
    body = deployment()
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "A", "value": "1"}]
    await kubectl(sim, "apply", "-f", "-", stdin=json.dumps(body))
    # Someone else adds an env var; re-applying a changed image must keep it (merge by name).
    await kubectl(sim, "set", "env", "deployment/web", "B=2")
    container["image"] = "nginx:1.28"
    out = await kubectl(sim, "apply", "-f", "-", "-v=6", stdin=json.dumps(body))
    assert "deployment.apps/web configured" in out
    assert "error calculating patch" not in out
    live = sim.store.get("deployments", "web", "default")
    assert live is not None
    made = live["spec"]["template"]["spec"]["containers"][0]
    assert made["image"] == "nginx:1.28"
    assert made["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]


def workload(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    """A Deployment-shaped manifest of another workload kind."""
    body = deployment(name, **spec)
    body.update(apiVersion="apps/v1", kind=kind)
    if kind == "DaemonSet":
        del body["spec"]["replicas"]
    return body


JOB_TEMPLATE = {
    "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1"}]}
}
DESCRIBED: list[tuple[str, dict[str, Any]]] = [
    ("pod", pod("p1")),
    ("deployment", deployment("d1")),
    ("daemonset", workload("DaemonSet", "ds1")),
    ("statefulset", workload("StatefulSet", "ss1")),
    (
        "job",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j1"},
            "spec": {"template": JOB_TEMPLATE},
        },
    ),
    (
        "cronjob",
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "cj1"},
            "spec": {"schedule": "@hourly", "jobTemplate": {"spec": {"template": JOB_TEMPLATE}}},
        },
    ),
    (
        "replicationcontroller",
        {
            "apiVersion": "v1",
            "kind": "ReplicationController",
            "metadata": {"name": "rc1"},
            "spec": {
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {"app": "rc1"}},
                    "spec": JOB_TEMPLATE["spec"] | {"restartPolicy": "Always"},
                },
            },
        },
    ),
    (
        "persistentvolume",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pv1"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/data"},
            },
        },
    ),
    (
        "hpa",
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "h1"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d1"},
                "maxReplicas": 3,
            },
        },
    ),
    (
        "service",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s1"},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "d1"}},
        },
    ),
    ("configmap", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}}),
    ("secret", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}}),
    ("serviceaccount", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a1"}}),
    ("namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n1"}}),
    (
        "pdb",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "b1"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "d1"}}},
        },
    ),
    (
        "lease",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "l1"},
            "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
        },
    ),
    (
        "role",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "r1"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    ),
    (
        "rolebinding",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "rb1"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r1"},
            "subjects": [{"kind": "User", "name": "jane"}],
        },
    ),
    (
        "priorityclass",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
        },
    ),
    (
        "persistentvolumeclaim",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "v1"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ),
    (
        "ingress",
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": "i1"},
            "spec": {"defaultBackend": {"service": {"name": "s1", "port": {"number": 80}}}},
        },
    ),
]


@needs_kubectl
async def test_kubectl_describe_works_on_every_kind(sim: kubesim.Cluster) -> None:
    for _kind, manifest in DESCRIBED:
        manifest = copy.deepcopy(manifest)
        await kubectl(sim, "apply", "-f", "-", stdin=json.dumps(manifest))
    await sim.settle(timeout=DEADLINE)
    for kind, manifest in DESCRIBED:
        out = await kubectl(sim, "describe", kind, manifest["metadata"]["name"])
        assert manifest["metadata"]["name"] in out
    for kind in ("replicaset", "node", "endpointslice", "event"):
        await kubectl(sim, "describe", kind)


async def test_in_process_writes_with_bad_types_are_rejected_before_storage(
    sim: kubesim.Cluster,
) -> None:
    with pytest.raises(errors.ApiError) as caught:
        sim.store.create(deployment(replicas="3"))
    assert caught.value.code == 400


async def test_secret_string_data_is_folded_into_data_and_never_stored(api: Api) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"user": "b2xk", "token": "dA=="},
        "stringData": {"user": "admin"},
    }
    created = await api.ok("POST", "/api/v1/namespaces/default/secrets", body)
    assert "stringData" not in created
    # stringData wins over the same key in data, as the real server's conversion does.
    assert created["data"] == {"user": "YWRtaW4=", "token": "dA=="}
    assert created["type"] == "Opaque"
