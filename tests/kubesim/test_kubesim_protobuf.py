"""Kubernetes protobuf: schemas read from the binaries, the codec, and real clients speaking it."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import string
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waiting import DEADLINE, within

import kubesim
from kubesim import list_encoding
from kubesim.protobuf import codec, registry, wire
from kubesim.protobuf.registry import Type
from kubesim.resources import BUILTINS
from kubesim.store import Page, Stored

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
HELM = ROOT / ".tools" / "bin" / "helm"
CAPTURES = json.loads((Path(__file__).with_name("protobuf_captures.json")).read_text())["captures"]
PROTOBUF = "application/vnd.kubernetes.protobuf"
CLIENT_GO_ACCEPT = "application/vnd.kubernetes.protobuf,application/json"
CODEC = codec.default()
SCHEMAS = registry.default()
META = registry.META

needs_kubectl = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")
needs_helm = pytest.mark.skipif(not HELM.exists(), reason="helm not installed")


def decode(name: str, data: bytes) -> Any:
    return CODEC.decode_message(SCHEMAS.message(name), data, name)[0]


def encode(name: str, value: Any) -> bytes:
    return CODEC.encode_message(SCHEMAS.message(name), value, name)


# ----- the generated schemas --------------------------------------------------------------------


@pytest.mark.skipif(
    not (KUBECTL.exists() and HELM.exists()), reason="kubectl/helm binaries not installed"
)
def test_committed_schemas_match_what_the_binaries_give() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_kubesim_protobuf.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rt", BUILTINS, ids=lambda rt: f"{rt.api_version}/{rt.kind}")
def test_every_builtin_kind_and_its_list_have_a_schema(rt: Any) -> None:
    assert CODEC.has_kind(rt.api_version, rt.kind)
    if "create" not in rt.verbs or len(rt.verbs) > 1:
        assert CODEC.has_kind(rt.api_version, rt.list_kind)


def test_schema_carries_field_numbers_shapes_and_json_options_of_the_go_structs() -> None:
    pod = {f.json: f for f in SCHEMAS.message("k8s.io/api/core/v1.Pod").fields}
    assert (pod["metadata"].number, pod["spec"].number, pod["status"].number) == (1, 2, 3)
    assert pod["metadata"].type.message == f"{META}.ObjectMeta"
    meta = {f.json: f for f in SCHEMAS.message(f"{META}.ObjectMeta").fields}
    assert meta["creationTimestamp"].omitzero  # new in 1.35: a zero time is left out
    assert meta["labels"].type.is_map
    assert meta["ownerReferences"].type.slice is not None
    assert meta["deletionGracePeriodSeconds"].type.pointer == Type(scalar="int64")
    probe = SCHEMAS.message("k8s.io/api/core/v1.Probe").fields
    assert probe[0].inline
    assert probe[0].number == 1
    secret = {f.json: f for f in SCHEMAS.message("k8s.io/api/core/v1.Secret").fields}
    assert secret["data"].type.value == Type(scalar="bytes")
    # A named slice used as a map value is a message {repeated items = 1}.
    assert SCHEMAS.message("k8s.io/api/authentication/v1.ExtraValue").list_wrapper


def test_envelope_constants_match_the_schema_of_runtime_unknown() -> None:
    unknown = {
        f.json or "typeMeta": f.number
        for f in SCHEMAS.message("k8s.io/apimachinery/pkg/runtime.Unknown").fields
    }
    assert unknown == {
        "typeMeta": codec.UNKNOWN_TYPE_META,
        "-": codec.UNKNOWN_RAW,
        "ContentEncoding": codec.UNKNOWN_CONTENT_ENCODING,
        "ContentType": codec.UNKNOWN_CONTENT_TYPE,
    }
    type_meta = {
        f.json: f.number for f in SCHEMAS.message("k8s.io/apimachinery/pkg/runtime.TypeMeta").fields
    }
    assert type_meta == {
        "apiVersion": codec.TYPE_META_API_VERSION,
        "kind": codec.TYPE_META_KIND,
    }
    event = {f.json: f.number for f in SCHEMAS.message(f"{META}.WatchEvent").fields}
    assert event == {"type": codec.WATCH_EVENT_TYPE, "object": codec.WATCH_EVENT_OBJECT}


# ----- bytes real clients sent ------------------------------------------------------------------

EXPECTED_FROM_KUBECTL = {
    "kubectl create ns capx": {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": "capx"},
        "spec": {},
        "status": {},
    },
    "kubectl create secret generic s1 --from-literal=password=hunter2": {
        "kind": "Secret",
        "apiVersion": "v1",
        "metadata": {"name": "s1"},
        "data": {"password": base64.b64encode(b"hunter2").decode()},
    },
    "kubectl create deployment web --image=nginx --replicas=2 --port=80": {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "nginx",
                            "image": "nginx",
                            "ports": [{"containerPort": 80}],
                            "resources": {},
                        }
                    ]
                },
            },
            "strategy": {},
        },
        "status": {},
    },
    "kubectl create service clusterip web --tcp=80:8080": {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            "selector": {"app": "web"},
            "type": "ClusterIP",
        },
        "status": {"loadBalancer": {}},
    },
    "kubectl create poddisruptionbudget pdb1 --selector=app=web --min-available=50%": {
        "kind": "PodDisruptionBudget",
        "apiVersion": "policy/v1",
        "metadata": {"name": "pdb1"},
        "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}},
        # Non-omitempty int32 fields are emitted even when zero, as Go's encoding/json does.
        "status": {
            "disruptionsAllowed": 0,
            "currentHealthy": 0,
            "desiredHealthy": 0,
            "expectedPods": 0,
        },
    },
}


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c["command"].split(" --")[0])
def test_kubectl_bodies_decode_and_reencode_byte_for_byte(capture: dict[str, str]) -> None:
    body = bytes.fromhex(capture["body"])
    obj = CODEC.decode_object(body)
    expected = EXPECTED_FROM_KUBECTL.get(capture["command"])
    if expected is not None:
        assert obj == expected
    # Field order, zero scalars, empty structs and map order all match the Go marshaller.
    assert CODEC.encode_object(obj) == body


# ----- the types with their own JSON ------------------------------------------------------------


def test_time_is_rfc3339_seconds_and_the_zero_time_is_null_or_left_out() -> None:
    stamp = wire.varint_field(1, 1714557600) + wire.varint_field(2, 123_000_000)
    assert decode(f"{META}.Time", stamp) == "2024-05-01T10:00:00Z"
    assert decode(f"{META}.MicroTime", stamp) == "2024-05-01T10:00:00.123000Z"
    assert decode(f"{META}.Time", b"") is None
    condition = decode("k8s.io/api/core/v1.PodCondition", wire.string_field(1, "Ready"))
    assert condition["lastTransitionTime"] is None  # non-pointer, no omitzero: null
    assert "creationTimestamp" not in decode(f"{META}.ObjectMeta", wire.bytes_field(8, b""))
    assert encode(f"{META}.Time", "2024-05-01T12:00:00+02:00") == encode(
        f"{META}.Time", "2024-05-01T10:00:00Z"
    )


@pytest.mark.parametrize(
    ("nanos", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1_500, "1.5µs"),
        (100_000_000, "100ms"),
        (1_500_000_000, "1.5s"),
        (60 * 10**9, "1m0s"),
        (3600 * 10**9, "1h0m0s"),
        (-(90 * 10**9), "-1m30s"),
        ((26 * 3600 + 3 * 60 + 4) * 10**9 + 5 * 10**8, "26h3m4.5s"),
    ],
)
def test_duration_json_is_go_duration_string(nanos: int, text: str) -> None:
    assert codec.format_duration(nanos) == text
    assert codec.parse_duration(text, "d") == nanos
    assert decode(f"{META}.Duration", wire.varint_field(1, nanos)) == text


def test_int_or_string_quantity_and_raw_json_types() -> None:
    int_or_string = "k8s.io/apimachinery/pkg/util/intstr.IntOrString"
    assert decode(int_or_string, encode(int_or_string, 8080)) == 8080
    assert decode(int_or_string, encode(int_or_string, "http")) == "http"
    assert decode(int_or_string, encode(int_or_string, -1)) == -1
    quantity = "k8s.io/apimachinery/pkg/api/resource.Quantity"
    assert decode(quantity, encode(quantity, "100m")) == "100m"
    assert decode(quantity, b"") == "0"  # the zero Quantity prints as "0"
    raw = "k8s.io/apimachinery/pkg/runtime.RawExtension"
    assert decode(raw, encode(raw, {"a": [1, "b"]})) == {"a": [1, "b"]}
    assert decode(raw, b"") is None
    fields = f"{META}.FieldsV1"
    assert decode(fields, encode(fields, {"f:data": {}})) == {"f:data": {}}


def test_an_embedded_protobuf_object_in_a_raw_extension_decodes_to_json() -> None:
    inner = CODEC.encode_object(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    )
    value = decode("k8s.io/apimachinery/pkg/runtime.RawExtension", wire.bytes_field(1, inner))
    assert value == {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "x"}}


def test_apiextensions_schema_unions_map_to_their_json_forms() -> None:
    props = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaProps"
    schema = {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "properties": {
            "list": {"type": "array", "items": {"type": "integer", "maximum": 5}},
            "free": {"x-kubernetes-preserve-unknown-fields": True, "default": {"a": 1}},
        },
        "dependencies": {"a": ["b"]},
        "enum": ["x", 2],
    }
    assert decode(props, encode(props, schema)) == schema
    closed = {"type": "object", "additionalProperties": False}
    assert decode(props, encode(props, closed)) == closed
    tuple_items = {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}
    assert decode(props, encode(props, tuple_items)) == tuple_items


def test_go_zero_values_nil_collections_inline_structs_and_bytes() -> None:
    spec = decode("k8s.io/api/core/v1.PodSpec", b"")
    assert spec == {"containers": None}  # `json:"containers"` has no omitempty: a nil slice
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 3}
    decoded = decode("k8s.io/api/core/v1.Probe", encode("k8s.io/api/core/v1.Probe", probe))
    assert decoded == probe  # ProbeHandler is a nested message on the wire, flat in JSON
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"b": ""}}
    assert CODEC.decode_object(CODEC.encode_object(secret))["data"] == {"b": ""}
    user = "k8s.io/api/authentication/v1.UserInfo"
    info = {"username": "u", "extra": {"scopes": ["a", "b"]}}
    assert decode(user, encode(user, info)) == info
    floats = encode(
        "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1.JSONSchemaProps", {"maximum": 1}
    )
    assert b"\x49" in floats  # field 9 as fixed64 (a double), though the struct tag says bytes


def test_map_entries_are_sorted_by_key_and_negative_ints_take_ten_bytes() -> None:
    meta = encode(f"{META}.ObjectMeta", {"labels": {"b": "2", "a": "1"}})
    assert meta.index(b"\x0a\x01a") < meta.index(b"\x0a\x01b")
    event = encode("k8s.io/api/core/v1.Event", {"count": -1})
    assert wire.encode_varint(-1) in event
    assert len(wire.encode_varint(-1)) == 10


def test_bad_input_gets_errors_that_name_the_field() -> None:
    with pytest.raises(codec.ProtobufError, match=r"spec\.replicas: expected an integer"):
        CODEC.encode_object(
            {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": "two"}}
        )
    with pytest.raises(codec.UnknownKind, match="Widget"):
        CODEC.encode_object({"apiVersion": "example.com/v1", "kind": "Widget"})
    with pytest.raises(codec.ProtobufError, match="magic"):
        CODEC.decode_object(b"{}")
    truncated = bytes.fromhex(CAPTURES[0]["body"])[:-9]
    with pytest.raises(codec.ProtobufError):
        CODEC.decode_object(truncated)


# ----- round trips over every served kind (hypothesis) -------------------------------------------

_WORD = st.text(alphabet=string.ascii_letters + string.digits + "-./", min_size=1, max_size=6)
_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "string": _WORD,
    "bool": st.just(True),
    "int32": st.integers(-(2**31), 2**31 - 1).filter(bool),
    "int64": st.integers(-(2**63), 2**63 - 1).filter(bool),
    "uint32": st.integers(1, 2**32 - 1),
    "uint64": st.integers(1, 2**64 - 1),
    "float64": st.floats(allow_nan=False, allow_infinity=False).filter(bool),
    "float32": st.floats(allow_nan=False, allow_infinity=False, width=32).filter(bool),
    "bytes": st.binary(min_size=1, max_size=6).map(lambda b: base64.b64encode(b).decode()),
}
_JSON_VALUE = st.dictionaries(_WORD, st.integers(-5, 5) | _WORD, min_size=1, max_size=2)
_APIEXT = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
_MAX_DEPTH = 5


@cache
def _message(name: str, depth: int) -> st.SearchStrategy[Any]:
    special = _special(name, depth)
    if special is not None:
        return special
    message = SCHEMAS.message(name)
    if message.list_wrapper:
        return st.lists(_WORD, min_size=1, max_size=2)
    if depth >= _MAX_DEPTH:
        return st.just({})
    optional: dict[str, st.SearchStrategy[Any]] = {}
    inline: list[st.SearchStrategy[Any]] = []
    for f in message.fields:
        if not f.number or f.json == "-":
            continue
        if f.inline:
            inline.append(_message(f.type.message, depth + 1))
        else:
            optional[f.json] = _type(f.type, depth + 1)
    base = st.fixed_dictionaries({}, optional=optional)
    if not inline:
        return base
    return st.tuples(base, *inline).map(lambda parts: {k: v for p in parts for k, v in p.items()})


def _type(t: Type, depth: int) -> st.SearchStrategy[Any]:
    if t.scalar:
        return _SCALARS[t.scalar]
    if t.pointer is not None:
        return _type(t.pointer, depth)
    if t.slice is not None:
        return st.lists(_type(t.slice, depth), min_size=1, max_size=2)
    if t.value is not None:
        return st.dictionaries(_WORD, _type(t.value, depth), min_size=1, max_size=2)
    return _message(t.message, depth)


def _special(name: str, depth: int) -> st.SearchStrategy[Any] | None:
    moments = st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2100, 1, 1))
    schema = _message(f"{_APIEXT}.JSONSchemaProps", depth + 1) if depth < _MAX_DEPTH else None
    specials: dict[str, Any] = {
        f"{META}.Time": lambda: moments.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ")),
        f"{META}.MicroTime": lambda: moments.map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")),
        f"{META}.Duration": lambda: st.integers(1, 10**15).map(codec.format_duration),
        f"{META}.FieldsV1": lambda: _JSON_VALUE,
        "k8s.io/apimachinery/pkg/api/resource.Quantity": lambda: st.sampled_from(
            ["1", "100m", "1Gi", "2.5", "500Mi"]
        ),
        "k8s.io/apimachinery/pkg/util/intstr.IntOrString": lambda: (
            st.integers(-(2**31), 2**31 - 1).filter(bool) | _WORD
        ),
        "k8s.io/apimachinery/pkg/runtime.RawExtension": lambda: _JSON_VALUE,
        f"{_APIEXT}.JSON": lambda: _JSON_VALUE | _WORD | st.integers(1, 9),
        f"{_APIEXT}.JSONSchemaPropsOrArray": lambda: (
            st.just({}) if schema is None else schema | st.lists(schema, min_size=1, max_size=2)
        ),
        f"{_APIEXT}.JSONSchemaPropsOrBool": lambda: (
            st.just(True) if schema is None else st.just(True) | schema
        ),
        f"{_APIEXT}.JSONSchemaPropsOrStringArray": lambda: (
            st.lists(_WORD, min_size=1, max_size=2)
            if schema is None
            else schema | st.lists(_WORD, min_size=1, max_size=2)
        ),
    }
    assert set(specials) == codec.SPECIAL_TYPES
    factory = specials.get(name)
    return None if factory is None else factory()


def _zeroish(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_zeroish(v) for v in value.values())
    if isinstance(value, list):
        return not value
    return value in (None, "", 0, False, "0", "0s")


def _covers(full: Any, sparse: Any, path: str = "") -> None:
    """`full` holds every value of `sparse`; anything more in it is a Go zero value."""
    if isinstance(sparse, dict):
        assert isinstance(full, dict), path
        for key, value in sparse.items():
            assert key in full, f"{path}.{key} lost"
            _covers(full[key], value, f"{path}.{key}")
        for key in full.keys() - sparse.keys():
            assert _zeroish(full[key]), f"{path}.{key} appeared: {full[key]!r}"
    elif isinstance(sparse, list):
        assert isinstance(full, list)
        assert len(full) == len(sparse), path
        for i, (a, b) in enumerate(zip(full, sparse, strict=True)):
            _covers(a, b, f"{path}[{i}]")
    else:
        assert full == sparse, f"{path}: {full!r} != {sparse!r}"


_KINDS = sorted({(rt.api_version, rt.kind) for rt in BUILTINS})


@pytest.mark.parametrize(("api_version", "kind"), _KINDS, ids=[f"{a}/{k}" for a, k in _KINDS])
def test_objects_of_every_kind_survive_encode_decode(api_version: str, kind: str) -> None:
    message = SCHEMAS.kind(api_version, kind)
    assert message is not None

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=_message(message.name, 0))
    def round_trip(body: dict[str, Any]) -> None:
        obj = {"kind": kind, "apiVersion": api_version, **body}
        data = CODEC.encode_object(obj)
        decoded = CODEC.decode_object(data)
        _covers(decoded, obj)
        # Filling in Go's zero values changes nothing on the wire, and decoding is a fixed point.
        assert CODEC.encode_object(decoded) == data
        assert CODEC.decode_object(CODEC.encode_object(decoded)) == decoded

    round_trip()


# ----- the compiled encoders ----------------------------------------------------------------------


class SchemaWalk(codec.Codec):
    """The codec without its compiled encoders: every message walks the schema."""

    def encode_message(self, message: registry.Message, value: Any, path: str) -> bytes:
        return self.walk_message(message, value, path)


WALK = SchemaWalk()


@pytest.mark.parametrize(("api_version", "kind"), _KINDS, ids=[f"{a}/{k}" for a, k in _KINDS])
def test_compiled_encoders_write_what_the_schema_walk_writes(api_version: str, kind: str) -> None:
    message = SCHEMAS.kind(api_version, kind)
    assert message is not None
    compiled = CODEC._compiler().encoder(message.name)

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=_message(message.name, 0))
    def same_bytes(body: dict[str, Any]) -> None:
        obj = {"kind": kind, "apiVersion": api_version, **body}
        # The compiled function itself (no schema-walk fallback) encodes every valid value.
        assert bytes(compiled(obj)) == WALK.walk_message(message, obj, kind)
        assert CODEC.encode_object(obj) == WALK.encode_object(obj)

    same_bytes()


DRIVER_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "nvidia-driver-daemonset-x7k2p",
        "generateName": "nvidia-driver-daemonset-",
        "namespace": "gpu-operator",
        "uid": "0b7c6a9e-3f51-4f0e-9a55-2f4d1c8b7e10",
        "resourceVersion": "48213",
        "creationTimestamp": "2026-05-01T10:00:00Z",
        "labels": {"app": "nvidia-driver-daemonset", "controller-revision-hash": "5d9f8"},
        "annotations": {"kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": "nvidia-driver-daemonset",
                "uid": "5a0c2d4e-8b7f-4c1e-a3d2-9e8f7a6b5c4d",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-05-01T10:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
            }
        ],
    },
    "spec": {
        "volumes": [
            {
                "name": "run-nvidia",
                "hostPath": {"path": "/run/nvidia", "type": "DirectoryOrCreate"},
            },
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                    ],
                },
            },
        ],
        "containers": [
            {
                "name": "nvidia-driver-ctr",
                "image": "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
                "command": ["nvidia-driver"],
                "args": ["init"],
                "env": [
                    {
                        "name": "NODE_NAME",
                        "valueFrom": {
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}
                        },
                    }
                ],
                "resources": {"limits": {"memory": "2Gi"}, "requests": {"cpu": "100m"}},
                "volumeMounts": [
                    {
                        "name": "run-nvidia",
                        "mountPath": "/run/nvidia",
                        "mountPropagation": "Bidirectional",
                    }
                ],
                "startupProbe": {
                    "exec": {"command": ["sh", "/usr/local/bin/nvidia-driver", "probe"]},
                    "initialDelaySeconds": 60,
                    "timeoutSeconds": 60,
                    "periodSeconds": 10,
                    "successThreshold": 1,
                    "failureThreshold": 120,
                },
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "securityContext": {"privileged": True, "seLinuxOptions": {"level": "s0"}},
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "nodeSelector": {"nvidia.com/gpu.deploy.driver": "true"},
        "serviceAccountName": "nvidia-driver",
        "nodeName": "gpu-00017",
        "hostPID": True,
        "priorityClassName": "system-node-critical",
        "priority": 2000001000,
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": "2026-05-01T10:00:07Z",
            },
        ],
        "hostIP": "10.0.0.17",
        "podIP": "10.0.0.17",
        "podIPs": [{"ip": "10.0.0.17"}],
        "startTime": "2026-05-01T10:00:01Z",
        "containerStatuses": [
            {
                "name": "nvidia-driver-ctr",
                "state": {"running": {"startedAt": "2026-05-01T10:00:02Z"}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
                "imageID": "nvcr.io/nvidia/driver@sha256:" + "ab" * 32,
                "containerID": "containerd://" + "cd" * 32,
                "started": True,
            }
        ],
        "qosClass": "Burstable",
    },
}


def test_a_driver_pod_is_encoded_without_walking_the_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = WALK.encode_object(DRIVER_POD)

    def no_walk(*args: Any) -> bytes:
        raise AssertionError("the schema walk ran for a pod the compiled encoders can encode")

    monkeypatch.setattr(codec.Codec, "walk_message", no_walk)
    assert CODEC.encode_object(DRIVER_POD) == expected


def test_values_the_compiled_encoders_are_unsure_of_take_the_schema_walk() -> None:
    class Label(str):
        pass

    pod = json.loads(json.dumps(DRIVER_POD))
    # Valid, but not the plain JSON types the compiled code expects: same bytes as the walk.
    pod["spec"]["terminationGracePeriodSeconds"] = 30.0
    pod["metadata"]["labels"][Label("tier")] = Label("gpu")
    pod["spec"]["containers"][0]["args"] = [Label("init")]
    assert CODEC.encode_object(pod) == WALK.encode_object(pod)
    # Invalid: the walk's error names the field.
    bad = json.loads(json.dumps(DRIVER_POD))
    bad["spec"]["containers"][0]["ports"] = [{"containerPort": "http"}]
    with pytest.raises(codec.ProtobufError, match=r"containers\[0\]\.ports\[0\]\.containerPort"):
        CODEC.encode_object(bad)
    bad = json.loads(json.dumps(DRIVER_POD))
    bad["spec"]["hostPID"] = "yes"
    with pytest.raises(codec.ProtobufError, match=r"spec\.hostPID: expected a boolean"):
        CODEC.encode_object(bad)
    bad = json.loads(json.dumps(DRIVER_POD))
    bad["spec"]["priority"] = 1 << 40
    with pytest.raises(codec.ProtobufError, match=r"spec\.priority: .* does not fit in int32"):
        CODEC.encode_object(bad)
    bad = json.loads(json.dumps(DRIVER_POD))
    bad["metadata"]["labels"] = ["app"]
    with pytest.raises(codec.ProtobufError, match=r"metadata\.labels: expected an object"):
        CODEC.encode_object(bad)


async def test_a_protobuf_list_reencodes_a_changed_pod_but_not_its_unchanged_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pods = next(rt for rt in BUILTINS if rt.kind == "Pod")
    first = Stored(json.loads(json.dumps(DRIVER_POD)))
    await list_encoding.protobuf_body(pods, Page([first], 100, None, None))
    # A status write: a new stored version, the same spec.
    second_obj = json.loads(json.dumps(DRIVER_POD))
    second_obj["metadata"]["resourceVersion"] = "48300"
    second_obj["status"]["phase"] = "Succeeded"
    second = Stored(second_obj)
    encoded: list[str] = []
    encode_field = codec.Codec.encode_field

    def counting(
        self: codec.Codec, message: registry.Message, f: registry.Field, value: Any, path: str
    ) -> bytes:
        encoded.append(f"{message.name.rsplit('.', 1)[-1]}.{f.json}")
        return encode_field(self, message, f, value, path)

    monkeypatch.setattr(codec.Codec, "encode_field", counting)
    body = await list_encoding.protobuf_body(pods, Page([second], 101, None, None))
    assert encoded == ["Pod.metadata", "Pod.status"]  # the spec: the first version's bytes
    whole = {
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "101"},
        "items": [second_obj],
    }
    assert body == WALK.encode_object(whole)
    # Another pod of the DaemonSet: a new spec, its containers and volumes encoded before.
    third_obj = json.loads(json.dumps(DRIVER_POD))
    third_obj["metadata"]["name"] = "nvidia-driver-daemonset-q9v4m"
    third_obj["spec"]["nodeName"] = "gpu-00018"
    encoded.clear()
    body = await list_encoding.protobuf_body(pods, Page([Stored(third_obj)], 102, None, None))
    assert "PodSpec.nodeName" in encoded
    assert "PodSpec.containers" not in encoded
    assert "PodSpec.volumes" not in encoded
    whole = {**whole, "metadata": {"resourceVersion": "102"}, "items": [third_obj]}
    assert body == WALK.encode_object(whole)


# ----- the server over HTTP ---------------------------------------------------------------------

CM = "/api/v1/namespaces/default/configmaps"
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}


async def http(
    sim: kubesim.Cluster,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    accept: str = CLIENT_GO_ACCEPT,
    ctype: str = PROTOBUF,
    params: dict[str, str] | None = None,
) -> tuple[int, str, bytes]:
    headers = {"Accept": accept, "Content-Type": ctype}
    async with (
        aiohttp.ClientSession(base_url=sim.url) as session,
        session.request(method, path, data=body, headers=headers, params=params) as resp,
    ):
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_protobuf_create_answers_in_protobuf_and_stores_json(sim: kubesim.Cluster) -> None:
    status, ctype, body = await http(sim, "POST", CM, CODEC.encode_object(CONFIGMAP))
    assert (status, ctype) == (201, PROTOBUF)
    created = CODEC.decode_object(body)
    assert created["data"] == {"k": "v"}
    assert created["metadata"]["uid"]
    assert created["metadata"]["creationTimestamp"]
    stored = sim.store.get("configmaps", "c", "default") or {}
    assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    status, ctype, body = await http(sim, "GET", f"{CM}/c", accept="application/json")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body)["data"] == {"k": "v"}


async def test_protobuf_update_list_and_protobuf_only_accept(sim: kubesim.Cluster) -> None:
    sim.store.create({**CONFIGMAP, "metadata": {"name": "c", "namespace": "default"}})
    current = CODEC.decode_object((await http(sim, "GET", f"{CM}/c", accept=PROTOBUF))[2])
    current["data"] = {"k": "w"}
    status, _, body = await http(sim, "PUT", f"{CM}/c", CODEC.encode_object(current))
    assert status == 200
    assert CODEC.decode_object(body)["data"] == {"k": "w"}
    status, ctype, body = await http(sim, "GET", CM)
    listed = CODEC.decode_object(body)
    assert (status, ctype, listed["kind"]) == (200, PROTOBUF, "ConfigMapList")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["c"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(current["metadata"]["resourceVersion"])


async def test_errors_are_protobuf_status_for_protobuf_clients(sim: kubesim.Cluster) -> None:
    status, ctype, body = await http(sim, "GET", f"{CM}/missing")
    assert (status, ctype) == (404, PROTOBUF)
    error = CODEC.decode_object(body)
    assert error["kind"] == "Status"
    assert (error["reason"], error["code"]) == ("NotFound", 404)
    assert error["details"] == {"name": "missing", "kind": "configmaps"}


async def test_malformed_protobuf_body_is_a_400(sim: kubesim.Cluster) -> None:
    status, _, body = await http(sim, "POST", CM, b"k8s\x00\x0a\xff", accept="application/json")
    assert status == 400
    assert "error decoding the protobuf body" in json.loads(body)["message"]


async def test_delete_options_in_protobuf_are_honoured(sim: kubesim.Cluster) -> None:
    sim.store.create({**CONFIGMAP, "metadata": {"name": "c", "namespace": "default"}})
    options = CODEC.encode_object(
        {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "not-the-uid"}}
    )
    status, _, body = await http(sim, "DELETE", f"{CM}/c", options)
    assert status == 409
    assert "Precondition failed: uid" in CODEC.decode_object(body)["message"]
    options = CODEC.encode_object(
        {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    )
    status, _, _ = await http(sim, "DELETE", f"{CM}/c", options)
    assert status == 200
    assert sim.store.get("configmaps", "c", "default") is None


CRD = {
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
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"


async def test_crds_in_protobuf_and_custom_resources_json_only(sim: kubesim.Cluster) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    status, ctype, body = await http(sim, "POST", crds, CODEC.encode_object(CRD))
    assert (status, ctype) == (201, PROTOBUF)
    created = CODEC.decode_object(body)
    assert created["spec"]["versions"][0]["schema"] == CRD["spec"]["versions"][0]["schema"]
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    sim.store.create({**widget, "metadata": {"name": "w", "namespace": "default"}})
    # A protobuf-first client that also accepts JSON gets JSON for a custom resource.
    status, ctype, body = await http(sim, "GET", f"{WIDGETS}/w")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body)["kind"] == "Widget"
    status, ctype, body = await http(sim, "GET", f"{WIDGETS}/w", accept=PROTOBUF)
    assert status == 406
    assert json.loads(body)["reason"] == "NotAcceptable"
    raw = codec.wrap("example.com/v1", "Widget", b"")
    status, _, body = await http(sim, "POST", WIDGETS, raw, accept="application/json")
    assert status == 415
    assert "Widget" in json.loads(body)["message"]


async def test_tables_stay_json_and_json_clients_are_untouched(sim: kubesim.Cluster) -> None:
    table_accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    status, ctype, body = await http(sim, "GET", "/api/v1/nodes", accept=table_accept)
    assert (status, ctype, json.loads(body)["kind"]) == (200, "application/json", "Table")
    status, ctype, _ = await http(sim, "GET", "/api/v1/nodes/node-1", accept="*/*")
    assert ctype == "application/json"
    status, ctype, _ = await http(sim, "GET", "/api/v1", accept=PROTOBUF)
    assert ctype == "application/json"  # discovery is served as JSON


async def test_watch_streams_length_prefixed_watch_events(sim: kubesim.Cluster) -> None:
    sim.store.create({**CONFIGMAP, "metadata": {"name": "a", "namespace": "default"}})
    headers = {"Accept": f"{PROTOBUF};stream=watch,{CLIENT_GO_ACCEPT}"}
    params = {"watch": "true", "allowWatchBookmarks": "true"}
    async with (
        aiohttp.ClientSession(base_url=sim.url) as session,
        session.get(CM, params=params, headers=headers) as resp,
    ):
        assert resp.headers["Content-Type"] == codec.WATCH_MEDIA_TYPE
        data = b""

        async def until(event_type: str) -> list[tuple[str, dict[str, Any]]]:
            async def read() -> list[tuple[str, dict[str, Any]]]:
                nonlocal data
                while True:
                    events = list(CODEC.decode_watch_frames(data))
                    if any(e[0] == event_type for e in events):
                        return events
                    data += await resp.content.readany()

            try:
                return await within(read(), f"a {event_type} watch event")
            except AssertionError as err:
                seen = [e[0] for e in CODEC.decode_watch_frames(data)]
                raise AssertionError(f"{err}; events so far: {seen}") from None

        await until("BOOKMARK")
        sim.store.patch("configmaps", "a", {"data": {"k": "2"}}, namespace="default")
        events = await until("MODIFIED")
    changes = [(t, o["metadata"]["name"]) for t, o in events if t != "BOOKMARK"]
    assert changes == [("ADDED", "a"), ("MODIFIED", "a")]
    assert events[-1][1]["data"] == {"k": "2"}
    bookmark = next(o for t, o in events if t == "BOOKMARK")
    assert bookmark["kind"] == "ConfigMap"
    assert bookmark["metadata"]["resourceVersion"]
    # The frame is a bare WatchEvent; only the embedded object carries the k8s envelope.
    length = int.from_bytes(data[:4], "big")
    frame = data[4 : 4 + length]
    assert not frame.startswith(codec.MAGIC)
    (_, _, event_type), (_, _, raw_extension) = list(wire.iter_fields(frame))
    assert event_type == b"ADDED"
    assert isinstance(raw_extension, bytes)
    assert next(wire.iter_fields(raw_extension))[2][:4] == codec.MAGIC


async def test_watch_of_a_custom_resource_falls_back_to_json(sim: kubesim.Cluster) -> None:
    sim.store.create(CRD)
    await sim.wait_for(lambda: sim.store.registry.get("example.com", "v1", "widgets"), DEADLINE)
    params = {"watch": "true", "timeoutSeconds": "1"}
    status, ctype, _ = await http(sim, "GET", WIDGETS, params=params)
    assert (status, ctype) == (200, "application/json")
    status, ctype, body = await http(sim, "GET", WIDGETS, params=params, accept=PROTOBUF)
    assert (status, ctype) == (406, "application/json")
    assert json.loads(body)["reason"] == "NotAcceptable"


# ----- real clients -----------------------------------------------------------------------------


async def run(
    sim: kubesim.Cluster,
    binary: Path,
    *args: str,
    home: Path | None = None,
    stdin: str | None = None,
    check: bool = True,
) -> str:
    env = {**os.environ, "KUBECONFIG": str(sim.kubeconfig_path)}
    if home is not None:
        env.update(
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 90)
    text = out.decode()
    if check:
        assert proc.returncode == 0, text
    return text


GENERATORS: list[tuple[list[str], str, str, str, Any]] = [
    (["namespace", "gen"], "namespaces", "gen", "status.phase", "Active"),
    (["configmap", "cm", "--from-literal=a=1"], "configmaps", "cm", "data.a", "1"),
    (["secret", "generic", "s", "--from-literal=k=v"], "secrets", "s", "data.k", "dg=="),
    (
        [
            "secret",
            "docker-registry",
            "reg",
            "--docker-server=r.example",
            "--docker-username=u",
            "--docker-password=p",
        ],
        "secrets",
        "reg",
        "type",
        "kubernetes.io/dockerconfigjson",
    ),
    (
        ["deployment", "web", "--image=nginx", "--replicas=2", "--port=80"],
        "deployments",
        "web",
        "spec.strategy.type",
        "RollingUpdate",
    ),
    (["service", "clusterip", "svc", "--tcp=80:8080"], "services", "svc", "spec.type", "ClusterIP"),
    (["service", "nodeport", "np", "--tcp=80:8080"], "services", "np", "spec.type", "NodePort"),
    (["serviceaccount", "sa"], "serviceaccounts", "sa", "metadata.name", "sa"),
    (["role", "r", "--verb=get", "--resource=pods"], "roles", "r", "rules.0.verbs.0", "get"),
    (
        ["rolebinding", "rb", "--role=r", "--serviceaccount=default:sa"],
        "rolebindings",
        "rb",
        "subjects.0.name",
        "sa",
    ),
    (
        ["clusterrole", "cr", "--verb=get", "--resource=nodes"],
        "clusterroles",
        "cr",
        "rules.0.resources.0",
        "nodes",
    ),
    (
        ["clusterrolebinding", "crb", "--clusterrole=cr", "--user=alice"],
        "clusterrolebindings",
        "crb",
        "subjects.0.name",
        "alice",
    ),
    (["priorityclass", "pc", "--value=100"], "priorityclasses", "pc", "value", 100),
    (
        ["poddisruptionbudget", "pdb", "--selector=app=web", "--min-available=1"],
        "poddisruptionbudgets",
        "pdb",
        "spec.minAvailable",
        1,
    ),
    (
        ["job", "j", "--image=busybox", "--", "true"],
        "jobs",
        "j",
        "spec.template.spec.restartPolicy",
        "Never",
    ),
    (
        ["cronjob", "cj", "--image=busybox", "--schedule=*/5 * * * *"],
        "cronjobs",
        "cj",
        "spec.schedule",
        "*/5 * * * *",
    ),
    (["quota", "q", "--hard=pods=3"], "resourcequotas", "q", "spec.hard.pods", "3"),
]


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


@needs_kubectl
@pytest.mark.parametrize(
    ("args", "resource", "name", "path", "expected"),
    GENERATORS,
    ids=[" ".join(g[0][:2]) if g[0][0] in ("secret", "service") else g[0][0] for g in GENERATORS],
)
async def test_kubectl_create_generator_sends_protobuf_that_kubesim_stores(
    sim: kubesim.Cluster, args: list[str], resource: str, name: str, path: str, expected: Any
) -> None:
    out = await run(sim, KUBECTL, "create", *args)
    assert "created" in out
    cluster_scoped = ("namespaces", "clusterroles", "clusterrolebindings", "priorityclasses")
    stored = sim.store.get(resource, name, None if resource in cluster_scoped else "default")
    assert stored is not None
    assert _dig(stored, path) == expected


@needs_kubectl
async def test_kubectl_create_with_server_dry_run_stores_nothing(sim: kubesim.Cluster) -> None:
    out = await run(sim, KUBECTL, "create", "namespace", "dry", "--dry-run=server")
    assert "namespace/dry created (server dry run)" in out
    assert sim.store.get("namespaces", "dry") is None
    printed = await run(
        sim, KUBECTL, "create", "deployment", "d", "--image=nginx", "--dry-run=server", "-o", "json"
    )
    deployment = json.loads(printed)
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"  # defaulted by the server
    assert deployment["metadata"]["uid"]
    assert sim.store.get("deployments", "d", "default") is None


@needs_kubectl
async def test_kubectl_debug_node_creates_its_pod_over_protobuf(sim: kubesim.Cluster) -> None:
    out = await run(sim, KUBECTL, "debug", "node/node-1", "--image=busybox", "--", "true")
    assert "Creating debugging pod" in out
    pods = [
        p
        for p in sim.store.list("pods", "default")
        if p["metadata"]["name"].startswith("node-debugger-node-1-")
    ]
    assert len(pods) == 1
    assert pods[0]["spec"]["nodeName"] == "node-1"
    assert pods[0]["spec"]["hostPID"] is True


@needs_kubectl
async def test_kubectl_debug_interactive_waits_on_a_protobuf_watch(sim: kubesim.Cluster) -> None:
    # The typed client watches the pod (Accept protobuf, stream=watch) until it runs, then
    # attaches; the session ends when the simulated shell reads `exit`.
    before = sim.stats.count("watch", "pods")
    out = await run(sim, KUBECTL, "debug", "node/node-1", "-it", "--image=busybox", stdin="exit\n")
    assert "If you don't see a command prompt" in out
    assert sim.stats.count("watch", "pods") > before


CHART = {
    "Chart.yaml": "apiVersion: v2\nname: demo\nversion: 0.1.0\n",
    "values.yaml": "greeting: hello\n",
    "templates/all.yaml": """
apiVersion: v1
kind: ConfigMap
metadata: {name: "{{ .Release.Name }}-cfg"}
data: {greeting: {{ .Values.greeting | quote }}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: "{{ .Release.Name }}-web"}
spec:
  replicas: 1
  selector: {matchLabels: {app: "{{ .Release.Name }}-web"}}
  template:
    metadata: {labels: {app: "{{ .Release.Name }}-web"}}
    spec:
      containers: [{name: web, image: "nginx:1.27", ports: [{containerPort: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: "{{ .Release.Name }}-svc"}
spec:
  selector: {app: "{{ .Release.Name }}-web"}
  ports: [{port: 80, targetPort: 80}]
""",
}


def write_chart(root: Path) -> Path:
    chart = root / "demo"
    for name, text in CHART.items():
        (chart / name).parent.mkdir(parents=True, exist_ok=True)
        (chart / name).write_text(text)
    return chart


def greeting(sim: kubesim.Cluster) -> str | None:
    cm = sim.store.get("configmaps", "rel-cfg", "default")
    return None if cm is None else str(cm["data"]["greeting"])


@needs_helm
async def test_helm_release_lifecycle_over_protobuf(sim: kubesim.Cluster, tmp_path: Path) -> None:
    chart = write_chart(tmp_path)

    async def helm(*args: str) -> str:
        return await run(sim, HELM, *args, home=tmp_path)

    assert "STATUS: deployed" in await helm("install", "rel", str(chart))
    release = sim.store.get("secrets", "sh.helm.release.v1.rel.v1", "default")
    assert release is not None
    assert release["type"] == "helm.sh/release.v1"
    assert greeting(sim) == "hello"
    assert "rel\tdefault" in (await helm("list")).replace(" ", "")
    assert "STATUS: deployed" in await helm("status", "rel")
    manifest = await helm("get", "manifest", "rel")
    assert "name: rel-web" in manifest or 'name: "rel-web"' in manifest
    await helm("upgrade", "rel", str(chart), "--set", "greeting=bye")
    assert greeting(sim) == "bye"
    await helm("rollback", "rel", "1")
    assert greeting(sim) == "hello"
    history = await helm("history", "rel")
    assert "Rollback to 1" in history
    assert "uninstalled" in await helm("uninstall", "rel")
    assert greeting(sim) is None
    assert not [s for s in sim.store.list("secrets", "default") if s["type"].startswith("helm")]


@needs_helm
async def test_helm_install_wait_sees_the_release_ready(
    sim: kubesim.Cluster, tmp_path: Path
) -> None:
    chart = write_chart(tmp_path)
    out = await run(
        sim, HELM, "install", "rel", str(chart), "--wait", "--timeout", "60s", home=tmp_path
    )
    assert "STATUS: deployed" in out
    deployment = sim.store.get("deployments", "rel-web", "default") or {}
    assert deployment["status"].get("readyReplicas") == 1
