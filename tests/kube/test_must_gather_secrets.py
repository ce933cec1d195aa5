"""must-gather end to end on a simulated cluster whose operand pod, its env, args and annotations,
its log, the Events, a GPU node and the ClusterPolicy carry every credential shape of the corpus
(tests/redaction_corpus.py): the archive holds none of the secret values anywhere, the look-alikes
in the log come through unchanged, Secrets are never read, and MANIFEST.txt counts what was
redacted per kind."""

from __future__ import annotations

import asyncio
import io
import json
import re
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from redaction_corpus import LOOK_ALIKES, SHAPES
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import explain_read, redact
from gpu_operator.kube import must_gather as mg
from kubesim import KubeletConfig

NS = "gpu-operator"
POD = "nvidia-driver-daemonset-a"
DRIVER_IMAGE = "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"
END = "--- all lines written ---"
# Values planted under names or in URLs of the objects (besides the corpus' texts).
PLANTED = {
    "env-url": "Pg-env-pw-31",
    "env-named": "nvapi-EnvNamedKeyAbcdefghijklmnopqrst0123",
    "arg-two-items": "Arg-two-items-32",
    "arg-one-item": "Arg-one-item-33",
    "pod-annotation": "Pod-ann-auth-34",
    "node-annotation": "Node-ann-token-35",
    "policy-annotation": "Policy-ann-auth-36",
    "policy-env": "Policy-env-pw-37",
    "secret-data": "nvapi-never-in-the-archive-SecretData38",
}
GPU_UUID = "GPU-3f1a2b3c-1234-5678-9abc-def012345678"


async def leaky(run: kubesim.ProgramRun) -> int | None:
    """An operand that logs every credential shape and every look-alike, then keeps running."""
    for shape in SHAPES:
        run.stdout.write(f"{shape.text}\n")
    for look in LOOK_ALIKES:
        run.stdout.write(f"{look.text}\n")
    run.stdout.write(f"{END}\n")
    await asyncio.Event().wait()
    return None


def driver_pod() -> dict[str, Any]:
    env = [
        {"name": "DATABASE_URL", "value": f"postgres://app:{PLANTED['env-url']}@db:5432/app"},
        {"name": "NGC_API_KEY", "value": PLANTED["env-named"]},
        {"name": "REGISTRY_PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": "registry", "key": "password"}}},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": GPU_UUID},
    ]  # fmt: skip
    args = ["--password", PLANTED["arg-two-items"], f"--docker-auth={PLANTED['arg-one-item']}"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD, "namespace": NS, "labels": {"app": "nvidia-driver-daemonset"},
            "annotations": {"example.com/auth": PLANTED["pod-annotation"]},
        },
        "spec": {"nodeName": "gpu-a", "containers": [
            {"name": "nvidia-driver-ctr", "image": DRIVER_IMAGE, "command": ["leaky"],
             "args": args, "env": env},
        ]},
    }  # fmt: skip


def cluster_policy() -> dict[str, Any]:
    """The example default policy, with a credential in an annotation and in the toolkit's env
    (so the rendered toolkit DaemonSet carries it too)."""
    text = (Path(__file__).parents[2] / "examples" / "clusterpolicy-default.yaml").read_text()
    policy: dict[str, Any] = next(
        d for d in yaml.safe_load_all(text) if d and d["kind"] == "ClusterPolicy"
    )
    policy["metadata"] = {
        "name": "cluster-policy", "annotations": {"example.com/auth": PLANTED["policy-annotation"]},
    }  # fmt: skip
    url = f"https://bot:{PLANTED['policy-env']}@registry.example.com/v2/"
    policy["spec"].setdefault("toolkit", {})["env"] = [{"name": "MIRROR_URL", "value": url}]
    return policy


def event(number: int, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{POD}.{number:04}", "namespace": NS},
        "involvedObject": {"kind": "Pod", "name": POD, "namespace": NS},
        "reason": "BackOff",
        "message": message,
        "type": "Warning",
    }


def members(archive: mg.Archive) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(archive.tar_gz()), mode="r:gz") as tar:
        return {
            m.name.removeprefix("must-gather/"): (tar.extractfile(m) or io.BytesIO())
            .read()
            .decode()
            for m in tar.getmembers()
        }


def readable(path: str, text: str) -> str:
    """A file as written and, for YAML and JSON, its values re-serialized (a value the dumper
    folded across lines is whole again)."""
    if path.endswith(".yaml"):
        return text + json.dumps(list(yaml.safe_load_all(text)))
    if path.endswith(".json"):
        return text + json.dumps(json.loads(text))
    return text


def manifest_counts(manifest: str) -> Counter[str]:
    section = manifest.split("\nredacted (", 1)[1].split("\nleft out:\n", 1)[0]
    return Counter({m[1]: int(m[2]) for m in re.finditer(r"^  ([a-z-]+): (\d+) \(", section, re.M)})


async def test_an_archive_of_a_cluster_full_of_credentials_holds_none_of_them() -> None:
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True)) as sim:
        sim.register_program("leaky", leaky)
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        sim.add_node("gpu-a", labels={keys.GPU_PRESENT: "true"})
        node = sim.store.get("nodes", "gpu-a")
        assert node is not None
        node["metadata"].setdefault("annotations", {})["example.com/token"] = PLANTED[
            "node-annotation"
        ]
        sim.store.update(node)
        sim.store.create(cluster_policy())
        sim.store.create(driver_pod())
        for number, shape in enumerate(SHAPES):
            sim.store.create(event(number, f"Back-off restarting failed container: {shape.text}"))
        sim.store.create({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry", "namespace": NS},
            "stringData": {"password": PLANTED["secret-data"]},
        })  # fmt: skip
        client = kube_client.connect(str(sim.kubeconfig_path))
        try:

            async def logged() -> bool:
                log = await explain_read.pod_log(client, NS, POD, "nvidia-driver-ctr")
                return END in log

            await eventually(logged, "the operand's log written", timeout=DEADLINE)
            before = sim.stats.snapshot()
            archive = await mg.gather(client, NS, parallel=2)
            requests = sim.stats.since(before)
        finally:
            await client.close()

    assert not [r for r in requests if r[1] == "secrets"]  # never read, never listed
    files = members(archive)
    assert {"rendered.yaml", "cluster/gpu-nodes.yaml", "explain/gpu-a.json"} <= set(files)
    log = files[f"logs/{POD}/nvidia-driver-ctr.log"]
    everything = "\n".join(readable(path, text) for path, text in files.items())
    secrets = [s for shape in SHAPES for s in shape.secrets] + list(PLANTED.values())
    assert [s for s in secrets if s in everything] == []
    # Each look-alike reached the archive as it was logged.
    assert [look.id for look in LOOK_ALIKES if look.text not in log] == []
    # What says what a value was stays: names, a Secret reference, the rendered toolkit's env.
    pods = list(yaml.safe_load_all(files[f"namespaces/{NS}/pods.yaml"]))
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["REGISTRY_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "registry", "key": "password"}
    }
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == GPU_UUID
    assert env["DATABASE_URL"]["value"] == f"postgres://app:{redact.REDACTED}@db:5432/app"
    assert pods[0]["spec"]["containers"][0]["args"] == [
        "--password", redact.REDACTED, f"--docker-auth={redact.REDACTED}"
    ]  # fmt: skip
    assert "https://bot:<redacted>@registry.example.com/v2/" in files["rendered.yaml"]
    # MANIFEST.txt: every kind of the corpus, once per Event holding it and more for the log (in
    # the log, the key cut after its BEGIN and the next one's tail read as one key).
    counts = manifest_counts(files["MANIFEST.txt"])
    wanted = Counter(shape.kind for shape in SHAPES)
    assert {k: counts[k] for k in wanted if counts[k] <= wanted[k]} == {}
    assert counts["argument"] >= 2 * wanted["argument"] + 2  # and the pod's two args
    assert counts == archive.redacted
    total = files["MANIFEST.txt"].split("Secrets are never read): ", 1)[1].split("\n", 1)[0]
    assert int(total) == sum(counts.values())
