"""must-gather's redaction: credentials never reach the archive, the rest stays readable."""

from __future__ import annotations

import io
import tarfile

from gpu_operator.kube import must_gather as mg

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"


def test_tokens_passwords_and_bearer_headers_are_redacted_in_text() -> None:
    text = f"token={JWT}\nAuthorization: Bearer abc.def\npassword: hunter2\nloaded nvidia 580\n"
    out = mg.redact_text(text)
    assert JWT not in out
    assert "abc.def" not in out
    assert "hunter2" not in out
    assert "loaded nvidia 580" in out
    assert out.count(mg.REDACTED) == 3


def test_credential_env_values_managed_fields_and_last_applied_are_dropped_from_objects() -> None:
    pod = {
        "metadata": {"name": "p", "managedFields": [{"manager": "x"}], "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"}},
        "spec": {"containers": [{"env": [
            {"name": "NGC_API_KEY", "value": "nvapi-123"},
            {"name": "DRIVER_VERSION", "value": "580.95.05"},
            {"name": "REGISTRY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]}], "volumes": [{"secret": {"secretName": "pull-secret"}}]},
    }  # fmt: skip
    out = mg.redact_object(pod)
    env = out["spec"]["containers"][0]["env"]
    assert env[0]["value"] == mg.REDACTED
    assert env[1]["value"] == "580.95.05"
    assert env[2]["valueFrom"]["secretKeyRef"]["name"] == "s"  # a reference is no secret
    assert "managedFields" not in out["metadata"]
    assert out["metadata"]["annotations"] == {"keep": "me"}
    assert out["spec"]["volumes"][0]["secret"]["secretName"] == "pull-secret"


def test_the_archive_is_a_tar_gz_under_one_folder_and_redacts_what_is_added() -> None:
    archive = mg.Archive()
    archive.add("logs/p/c.log", f"token: {JWT}\n")
    with tarfile.open(fileobj=io.BytesIO(archive.tar_gz()), mode="r:gz") as tar:
        [member] = tar.getmembers()
        assert member.name == "must-gather/logs/p/c.log"
        data = tar.extractfile(member)
        assert data is not None
        assert JWT not in data.read().decode()
