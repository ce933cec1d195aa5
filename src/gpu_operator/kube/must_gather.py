"""`gpu-operator must-gather`: one tar.gz with what a maintainer needs to debug a GPU cluster.

Never reads a Secret; redacts tokens, passwords and keys in everything it writes. Bounded: each
log is cut to LOG_TAIL_LINES lines and LOG_LIMIT_BYTES bytes, all logs together to
TOTAL_LOG_BYTES, and the whole run to a deadline; what was left out is listed in MANIFEST.txt.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from lightkube import AsyncClient

from gpu_operator.kube import explain_read, resources
from gpu_operator.operands import readiness
from gpu_operator.status import explain

Obj = dict[str, Any]
ROOT = "must-gather"
LOG_TAIL_LINES = 2000
LOG_LIMIT_BYTES = 256 * 1024
TOTAL_LOG_BYTES = 64 * 1024 * 1024
DEADLINE_SECONDS = 300.0
REDACTED = "<redacted>"
# Env var / key names whose values are credentials.
_SECRET_NAME = re.compile(r"token|passw|secret|api[_-]?key|credential|private[_-]?key", re.I)
_PATTERNS = (
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), REDACTED),  # JWTs
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\g<1>" + REDACTED),
    (
        re.compile(
            r"(?i)((?:token|password|passwd|secret|api[_-]?key)[\"']?\s*[:=]\s*[\"']?)"
            r"(?!<redacted>)[^\s\"',}]+"
        ),
        r"\g<1>" + REDACTED,
    ),
)
# Metadata nobody reads in a bug report and that may carry a whole object with its values.
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def redact_text(text: str) -> str:
    """Text with bearer tokens, JWTs and `token=`/`password:` values replaced."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_object(obj: Any) -> Any:
    """A copy of an API object without managedFields, last-applied annotations and credential
    values (env vars and keys named like a token, password, secret or key)."""
    if isinstance(obj, list):
        return [redact_object(item) for item in obj]
    if not isinstance(obj, dict):
        return redact_text(obj) if isinstance(obj, str) else obj
    out: Obj = {}
    for key, value in obj.items():
        if key == "managedFields":
            continue
        if key == "annotations" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _DROPPED_ANNOTATIONS}
        if key == "value" and isinstance(obj.get("name"), str) and _SECRET_NAME.search(obj["name"]):
            out[key] = REDACTED
            continue
        if isinstance(value, str) and _SECRET_NAME.search(key) and key != "secretName":
            out[key] = REDACTED
            continue
        out[key] = redact_object(value)
    return out


@dataclass
class Archive:
    """The archive being built, in memory, and what was left out."""

    files: dict[str, bytes] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    log_bytes: int = 0

    def add(self, path: str, text: str) -> None:
        self.files[f"{ROOT}/{path}"] = redact_text(text).encode()

    def add_objects(self, path: str, objects: list[Obj]) -> None:
        self.add(path, yaml.safe_dump_all([redact_object(o) for o in objects], sort_keys=False))

    def tar_gz(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for name, data in sorted(self.files.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


def node_summary(node: Obj) -> Obj:
    """A GPU node's labels, annotations, conditions, capacity and taints (no images, no ids)."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return {
        "name": meta.get("name"),
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
        "taints": (node.get("spec") or {}).get("taints") or [],
        "capacity": status.get("capacity") or {},
        "allocatable": status.get("allocatable") or {},
        "conditions": status.get("conditions") or [],
        "nodeInfo": status.get("nodeInfo") or {},
    }


def facts_for(
    node: Obj, pods: list[Obj], events: list[Obj], daemonsets: dict[str, Obj], policy: Obj | None
) -> explain.NodeFacts:
    """The chain's snapshot of one node from objects already read (no log reads)."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    names = {meta.get("name"), *((p.get("metadata") or {}).get("name") for p in pods)}
    views = []
    for pod in pods:
        problem = readiness.pod_problem(pod)
        views.append(explain.pod_view(pod, problem[1] if problem else None))
    return explain.NodeFacts(
        name=str(meta.get("name")),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        capacity=status.get("capacity") or {},
        allocatable=status.get("allocatable") or {},
        conditions=status.get("conditions") or [],
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        pods=tuple(views),
        events=[e for e in events if (e.get("involvedObject") or {}).get("name") in names],
        policy=explain.policy_view(policy.get("spec")) if policy else None,
        daemonsets=daemonsets,
    )


async def _list(client: AsyncClient, resource: Any, **kwargs: Any) -> list[Obj]:
    return await explain_read._list(client, resource, **kwargs)


async def gather(
    client: AsyncClient,
    namespace: str | None = None,
    *,
    deadline: float = DEADLINE_SECONDS,
    total_log_bytes: int = TOTAL_LOG_BYTES,
    progress: Callable[[str, int, int], None] = lambda what, done, total: None,
) -> Archive:
    """Read everything into an Archive; `progress(step, done, total)` follows the log reads."""
    start = time.monotonic()
    archive = Archive()
    found = await explain_read.policies(client)
    policy = explain_read.active_policy(found)
    ns = explain_read.operator_namespace(policy, namespace)
    archive.add_objects("cluster/clusterpolicies.yaml", found)
    archive.add_objects("cluster/nvidiadrivers.yaml", await _list(client, resources.NVIDIA_DRIVER))
    nodes = await explain_read.gpu_nodes(client)
    archive.add_objects("cluster/gpu-nodes.yaml", [node_summary(n) for n in nodes])
    pods = await _list(client, resources.POD, namespace=ns)
    daemonsets = await _list(client, resources.DAEMONSET, namespace=ns)
    deployments = await _list(client, resources.resource("apps/v1", "Deployment"), namespace=ns)
    events = await _list(client, resources.EVENT, namespace=ns)
    node_names = {str(n["metadata"]["name"]) for n in nodes}
    events += [
        e
        for e in await _list(client, resources.EVENT, namespace="default")
        if (e.get("involvedObject") or {}).get("name") in node_names
    ]
    archive.add_objects(f"namespaces/{ns}/pods.yaml", pods)
    archive.add_objects(f"namespaces/{ns}/daemonsets.yaml", daemonsets)
    archive.add_objects(f"namespaces/{ns}/deployments.yaml", deployments)
    archive.add_objects(f"namespaces/{ns}/events.yaml", events)
    if policy is not None:
        archive.add("rendered.yaml", _rendered(policy, nodes, ns))
    by_app: dict[str, Obj] = {}
    for ds in daemonsets:
        meta = ds.get("metadata") or {}
        by_app[str((meta.get("labels") or {}).get("app") or meta.get("name"))] = ds
    pods_by_node: dict[str, list[Obj]] = {}
    for pod in pods:
        pods_by_node.setdefault(str((pod.get("spec") or {}).get("nodeName")), []).append(pod)
    for node in nodes:
        name = str(node["metadata"]["name"])
        facts = facts_for(node, pods_by_node.get(name, []), events, by_app, policy)
        archive.add(f"explain/{name}.json", json.dumps(explain.explain(facts).to_dict(), indent=2))
    for done, pod in enumerate(pods):
        progress("logs", done, len(pods))
        if time.monotonic() - start > deadline:
            archive.left_out.append(f"logs of {len(pods) - done} pod(s): deadline {deadline:.0f}s")
            break
        pod_name = str(pod["metadata"]["name"])
        async for container, previous, text in explain_read.iter_log_chunks(
            client, ns, pod, tail_lines=LOG_TAIL_LINES, limit_bytes=LOG_LIMIT_BYTES
        ):
            suffix = ".previous.log" if previous else ".log"
            if archive.log_bytes + len(text) > total_log_bytes:
                archive.left_out.append(f"logs/{pod_name}/{container}{suffix}: total log limit")
                continue
            archive.log_bytes += len(text)
            archive.add(f"logs/{pod_name}/{container}{suffix}", text)
    progress("logs", len(pods), len(pods))
    manifest = [
        f"gpu-operator must-gather: namespace {ns}, {len(nodes)} GPU node(s), "
        f"{len(pods)} pod(s), {time.monotonic() - start:.1f}s",
        f"limits: {LOG_TAIL_LINES} lines and {LOG_LIMIT_BYTES} bytes per log, "
        f"{total_log_bytes} bytes of logs in all, {deadline:.0f}s",
        "left out:",
        *(f"  {item}" for item in archive.left_out or ["nothing"]),
        "files:",
        *(f"  {n.removeprefix(ROOT + '/')}" for n in sorted(archive.files)),
    ]
    archive.add("MANIFEST.txt", "\n".join(manifest) + "\n")
    return archive


def _rendered(policy: Obj, nodes: list[Obj], namespace: str) -> str:
    """What the operator renders for the live policy and these nodes (as `gpu-operator render`)."""
    from gpu_operator import api
    from gpu_operator.controller import facts as facts_mod
    from gpu_operator.controller import strip
    from gpu_operator.operands import registry

    checked = api.check_document(policy)
    if not checked.ok or not isinstance(checked.obj, api.ClusterPolicy):
        return "# the live ClusterPolicy is invalid: " + "; ".join(map(str, checked.errors)) + "\n"
    facts = facts_mod.from_nodes(
        [strip.node(n) for n in nodes],
        namespace=namespace,
        operator_env={},
        has_servicemonitor_crd=False,
        has_prometheusrule_crd=False,
    )
    documents: list[Obj] = []
    for state in registry.render_all(checked.obj, facts):
        if state.error is not None:
            documents.append({"state": state.name, "error": state.error})
        documents.extend(state.objects)
    return yaml.safe_dump_all([redact_object(d) for d in documents], sort_keys=False)
