"""must-gather's redaction: every credential shape is gone from every place the archive holds
text (logs, a failed read's reason, pod env/args/annotations, node annotations, Events, policy
status, rendered ConfigMaps, explain output), every look-alike survives unchanged, values under
a credential's name go wherever the name is (env var, annotation key, ConfigMap key, flag, a key
in a log line), and MANIFEST.txt counts what was redacted, per kind.

The places go through the archive's own code (Archive.add_objects / add_json, collect_logs), so
a place that skipped redaction would fail here.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from redaction_corpus import FLAG_NAMES, LOOK_ALIKES, SECRET_NAMES, SHAPES, secret_value

from gpu_operator.kube import must_gather as mg
from gpu_operator.kube import redact

NS = "gpu-operator"
IMAGE = "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"


@dataclass
class Placed:
    """What the archive holds after one text went into one place: its files (as text), the
    redaction counts, and the text back from where it was put."""

    files: dict[str, str]
    counts: Counter[str]
    value: str


def _files(archive: mg.Archive) -> dict[str, str]:
    return {path: data.decode() for path, data in archive.files.items()}


def _objects(path: str, objects: list[dict[str, Any]], pick: Callable[[Any], str]) -> Placed:
    archive = mg.Archive()
    archive.add_objects(path, objects)
    text = archive.files[f"{mg.ROOT}/{path}"].decode()
    return Placed(_files(archive), archive.redacted, pick(list(yaml.safe_load_all(text))))


def _pod(**container: Any) -> dict[str, Any]:
    annotations = container.pop("annotations", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "driver-a", "namespace": NS, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": IMAGE, **container}]},
    }


def _node(annotations: dict[str, str]) -> dict[str, Any]:
    return mg.node_summary({"metadata": {"name": "gpu-a", "annotations": annotations}})


def _policy(message: str = "", env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"env": env or []}},
        "status": {"conditions": [{"type": "Ready", "status": "False", "message": message}]},
    }


def _config_map(data: dict[str, str]) -> dict[str, Any]:
    meta = {"name": "settings", "namespace": NS}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _event(message: str) -> dict[str, Any]:
    meta = {"name": "e1", "namespace": NS}
    return {"apiVersion": "v1", "kind": "Event", "metadata": meta, "message": message}


def in_log(text: str) -> Placed:
    async def read(item: mg.LogRead) -> str:
        return text

    logs = asyncio.run(mg.collect_logs([mg.LogRead("driver-a", "main")], read, timeout=60))
    archive = mg.Archive()
    for path, data in logs.files:
        archive.add_redacted(path, data)
    files = _files(archive)
    return Placed(files, logs.redacted, files[f"{mg.ROOT}/logs/driver-a/main.log"])


def in_failed_read(text: str) -> Placed:
    async def read(item: mg.LogRead) -> str:
        raise ConnectionError(text)

    logs = asyncio.run(mg.collect_logs([mg.LogRead("driver-a", "main")], read, timeout=60))
    [reason] = logs.left_out
    prefix = "logs/driver-a/main.log: read failed: "
    return Placed({"left out": reason}, logs.redacted, reason.removeprefix(prefix))


def in_explain(text: str) -> Placed:
    archive = mg.Archive()
    archive.add_json("explain/gpu-a.json", {"links": [{"evidence": [{"text": text}]}]})
    value = json.loads(archive.files[f"{mg.ROOT}/explain/gpu-a.json"])
    return Placed(_files(archive), archive.redacted, value["links"][0]["evidence"][0]["text"])


def _env(docs: Any) -> str:
    return str(docs[0]["spec"]["containers"][0]["env"][0]["value"])


# Where the archive holds text: a place takes a text and says what the archive made of it.
TEXT_PLACES: dict[str, Callable[[str], Placed]] = {
    "log": lambda text: in_log(f"step 1 begins.\n{text}\nstep 2 done.\n"),
    "failed-log-read": in_failed_read,
    "pod-env-value": lambda text: _objects(
        f"namespaces/{NS}/pods.yaml", [_pod(env=[{"name": "APP_SETTING", "value": text}])], _env
    ),
    "pod-args": lambda text: _objects(
        f"namespaces/{NS}/pods.yaml",
        [_pod(args=["sh", "-c", text])],
        lambda docs: docs[0]["spec"]["containers"][0]["args"][2],
    ),
    "pod-annotation": lambda text: _objects(
        f"namespaces/{NS}/pods.yaml",
        [_pod(annotations={"example.com/note": text})],
        lambda docs: docs[0]["metadata"]["annotations"]["example.com/note"],
    ),
    "node-annotation": lambda text: _objects(
        "cluster/gpu-nodes.yaml",
        [_node({"example.com/note": text})],
        lambda docs: docs[0]["annotations"]["example.com/note"],
    ),
    "event-message": lambda text: _objects(
        f"namespaces/{NS}/events.yaml", [_event(text)], lambda docs: docs[0]["message"]
    ),
    "policy-status": lambda text: _objects(
        "cluster/clusterpolicies.yaml",
        [_policy(message=text)],
        lambda docs: docs[0]["status"]["conditions"][0]["message"],
    ),
    "rendered-configmap": lambda text: _objects(
        "rendered.yaml",
        [_config_map({"settings.txt": text})],
        lambda docs: docs[0]["data"]["settings.txt"],
    ),
    "explain-evidence": in_explain,
}


def _everything(placed: Placed) -> str:
    """The files and the value back: a secret folded across YAML lines is in the value."""
    return "\n".join([*placed.files.values(), placed.value])


@pytest.mark.parametrize("place", TEXT_PLACES)
@pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
def test_each_secret_shape_is_redacted_in_each_place(shape: Any, place: str) -> None:
    placed = TEXT_PLACES[place](shape.text)
    everything = _everything(placed)
    assert [s for s in shape.secrets if s in everything] == []
    assert redact.REDACTED in placed.value
    assert [k for k in shape.keep if k not in placed.value] == []  # only the value went
    assert placed.counts[shape.kind] >= 1, placed.counts


@pytest.mark.parametrize("place", TEXT_PLACES)
@pytest.mark.parametrize("look", LOOK_ALIKES, ids=[a.id for a in LOOK_ALIKES])
def test_each_look_alike_survives_each_place_unchanged(look: Any, place: str) -> None:
    placed = TEXT_PLACES[place](look.text)
    assert look.text in placed.value
    assert redact.REDACTED not in placed.value
    assert sum(placed.counts.values()) == 0, placed.counts


def _value_in_args(args: list[str]) -> Callable[[str, str], Placed]:
    return lambda name, value: _objects(
        f"namespaces/{NS}/pods.yaml",
        [_pod(args=[a.format(name=name, value=value) for a in args])],
        lambda docs: " ".join(docs[0]["spec"]["containers"][0]["args"]),
    )


# Where a name can say that its value is a credential.
NAME_PLACES: dict[str, Callable[[str, str], Placed]] = {
    "env-var": lambda name, value: _objects(
        f"namespaces/{NS}/pods.yaml", [_pod(env=[{"name": name, "value": value}])], _env
    ),
    "policy-env-var": lambda name, value: _objects(
        "cluster/clusterpolicies.yaml",
        [_policy(env=[{"name": name, "value": value}])],
        lambda docs: docs[0]["spec"]["driver"]["env"][0]["value"],
    ),
    "pod-annotation-key": lambda name, value: _objects(
        f"namespaces/{NS}/pods.yaml",
        [_pod(annotations={name: value})],
        lambda docs: docs[0]["metadata"]["annotations"][name],
    ),
    "node-annotation-key": lambda name, value: _objects(
        "cluster/gpu-nodes.yaml",
        [_node({name: value})],
        lambda docs: docs[0]["annotations"][name],
    ),
    "configmap-key": lambda name, value: _objects(
        "rendered.yaml", [_config_map({name: value})], lambda docs: docs[0]["data"][name]
    ),
    "args-two-items": _value_in_args(["--{name}", "{value}", "--v=2"]),
    "args-one-item": _value_in_args(["--{name}={value}"]),
    "log-key-equals": lambda name, value: in_log(f"loaded {name}={value} from env\n"),
    "log-key-colon": lambda name, value: in_log(f"config:\n  {name}: {value}\n  debug: true\n"),
    "log-json": lambda name, value: in_log(json.dumps({"level": "info", name: value}) + "\n"),
    "log-flag": lambda name, value: in_log(f"exec app --{name} {value} --v=2\n"),
    "event-message": lambda name, value: _objects(
        f"namespaces/{NS}/events.yaml",
        [_event(f"invalid {name}={value} in spec")],
        lambda docs: docs[0]["message"],
    ),
}  # fmt: skip
_FLAG_PLACES = ("args-two-items", "args-one-item", "log-flag")
NAME_CASES = [
    pytest.param(name, place, id=f"{name}-{place}")
    for name in SECRET_NAMES
    for place in NAME_PLACES
    if place not in _FLAG_PLACES or name in FLAG_NAMES
]


@pytest.mark.parametrize(("name", "place"), NAME_CASES)
def test_the_value_under_each_secret_name_is_redacted_in_each_place(name: str, place: str) -> None:
    value = secret_value(name)
    placed = NAME_PLACES[place](name, value)
    everything = _everything(placed)
    assert value not in everything
    assert name in everything  # the name says what was there
    assert placed.counts["named-value"] + placed.counts["argument"] >= 1, placed.counts


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        *((n, True) for n in SECRET_NAMES),
        ("Authorization", True), ("DB_PWD", True), ("aws_creds", True), ("tls.privateKey", True),
        ("API-KEY", True), ("passwordHash", True), ("registryAuth", True),
        ("monkey", False), ("key", False), ("topologyKey", False), ("keychain", False),
        ("secretName", False), ("secretKeyRef", False), ("secretEnv", False),
        ("imagePullSecrets", False), ("passwordFile", False), ("password-file", False),
        ("NLS_TOKEN_PATH", False), ("tokenTTL", False), ("authorization-mode", False),
        ("PWD", False), ("PASS_DEVICE_SPECS", False), ("SSH_AUTH_SOCK", False),
        ("author", False), ("authority", False), ("passthrough", False),
        ("AWS_ACCESS_KEY_ID", False), ("gmsaCredentialSpecName", False), ("name", False),
    ],
)  # fmt: skip
def test_which_names_say_their_value_is_a_credential(name: str, secret: bool) -> None:
    assert redact.secret_named(name) is secret


def test_redacting_redacted_text_changes_nothing_and_counts_nothing() -> None:
    for shape in SHAPES:
        once, _ = redact.redact_text(shape.text)
        twice, counts = redact.redact_text(once)
        assert (shape.id, twice, counts) == (shape.id, once, Counter())


def test_credential_env_values_managed_fields_and_last_applied_are_dropped_from_objects() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "managedFields": [{"manager": "x"}], "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"}},
        "spec": {"containers": [{"env": [
            {"name": "NGC_API_KEY", "value": "nvapi-123"},
            {"name": "DRIVER_VERSION", "value": "580.95.05"},
            {"name": "REGISTRY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]}], "volumes": [{"secret": {"secretName": "pull-secret"}}]},
    }  # fmt: skip
    out, counts = redact.redact_value(pod)
    env = out["spec"]["containers"][0]["env"]
    assert env[0]["value"] == redact.REDACTED
    assert env[1]["value"] == "580.95.05"
    assert env[2] == pod["spec"]["containers"][0]["env"][2]  # a reference names no value
    assert "managedFields" not in out["metadata"]
    assert out["metadata"]["annotations"] == {"keep": "me"}
    assert out["spec"]["volumes"][0]["secret"]["secretName"] == "pull-secret"
    assert counts == Counter({"named-value": 1})


def test_a_secret_objects_data_is_replaced_key_by_key() -> None:
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ngc"}, "type": "Opaque",
        "data": {"NGC_API_KEY": "bnZhcGktc2VjcmV0", "config.json": "e30="},
        "stringData": {"note": "plain text"},
    }  # fmt: skip
    out, counts = redact.redact_value([secret])
    assert out[0]["data"] == {"NGC_API_KEY": redact.REDACTED, "config.json": redact.REDACTED}
    assert out[0]["stringData"] == {"note": redact.REDACTED}
    assert out[0]["metadata"] == {"name": "ngc"}
    assert counts == Counter({"secret-data": 3})


def test_numbers_under_a_credential_name_go_and_booleans_stay() -> None:
    out, counts = redact.redact_value({"pin": 1, "password": 123456, "authEnabled": True})
    assert out == {"pin": 1, "password": redact.REDACTED, "authEnabled": True}
    assert counts == Counter({"named-value": 1})


def test_the_manifest_lists_each_kind_found_with_its_count_and_what_it_covers() -> None:
    lines = mg.redaction_lines(Counter({"jwt": 2, "url-credentials": 1, "cookie": 0}))
    assert lines[0].endswith("Secrets are never read): 3")
    assert lines[1:] == [
        f"  url-credentials: 1 ({redact.KINDS['url-credentials']})",
        f"  jwt: 2 ({redact.KINDS['jwt']})",
    ]
    assert mg.redaction_lines(Counter())[0].endswith(": nothing")


def test_the_archive_is_a_tar_gz_under_one_folder_and_redacts_what_is_added() -> None:
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"
    archive = mg.Archive()
    archive.add("logs/p/c.log", f"token: {jwt}\n")
    with tarfile.open(fileobj=io.BytesIO(archive.tar_gz()), mode="r:gz") as tar:
        [member] = tar.getmembers()
        assert member.name == "must-gather/logs/p/c.log"
        data = tar.extractfile(member)
        assert data is not None
        assert data.read().decode() == f"token: {redact.REDACTED}\n"
    assert archive.redacted == Counter({"jwt": 1})
