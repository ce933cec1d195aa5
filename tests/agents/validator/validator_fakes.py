"""Fakes for the validator's protocols: a container on a temp directory with scripted programs,
and an in-memory API whose workload pods follow a script."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.agents.validator.protocols import ProgramResult

Obj = dict[str, Any]
Program = Callable[[list[str], dict[str, str]], ProgramResult]


class FakeContainer:
    """The container's `/` is `root`; programs answer from `programs` by argv[0]."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.programs: dict[str, Program] = {}
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.termination_message: str | None = None

    def path(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def file(self, container_path: str, text: str = "x", mode: int = 0o755) -> Path:
        path = self.path(container_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def program(self, name: str, code: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.programs[name] = lambda argv, env: ProgramResult(code, stdout, stderr)

    async def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProgramResult:
        args = list(argv)
        self.calls.append((args, dict(env or {})))
        program = self.programs.get(args[0])
        if program is None:
            return ProgramResult(
                127, "", f'exec: "{args[0]}": executable file not found in $PATH\n'
            )
        return program(args, dict(env or {}))

    def write_termination_message(self, text: str) -> None:
        self.termination_message = text

    def marker(self, name: str) -> Path:
        return self.path(f"/run/nvidia/validations/{name}")


# What a created workload pod's status becomes (None: it stays as created).
PodScript = Callable[[Obj], Obj | None]


@dataclass
class FakeCluster:
    """Nodes, DaemonSets and pods in memory; `script` sets a created pod's status."""

    nodes: dict[str, Obj] = field(default_factory=dict)
    daemonsets_: list[Obj] = field(default_factory=list)
    pods_: dict[str, Obj] = field(default_factory=dict)
    events_: dict[str, list[Obj]] = field(default_factory=dict)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)
    script: PodScript | None = None
    deleted: list[str] = field(default_factory=list)
    created: list[Obj] = field(default_factory=list)
    _names: Any = field(default_factory=lambda: itertools.count(1))

    async def node(self, name: str) -> Obj | None:
        return self.nodes.get(name)

    async def daemonset(self, namespace: str, name: str) -> Obj | None:
        for ds in self.daemonsets_:
            meta = ds["metadata"]
            if meta["name"] == name and meta.get("namespace") == namespace:
                return ds
        return None

    async def daemonsets(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        return [ds for ds in self.daemonsets_ if _matches(ds, namespace, labels)]

    async def pods(
        self, namespace: str, labels: Mapping[str, str], node: str | None = None
    ) -> list[Obj]:
        return [
            p for p in self.pods_.values()
            if _matches(p, namespace, labels) and (node is None or _node_of(p) == node)
        ]  # fmt: skip

    async def pod(self, namespace: str, name: str) -> Obj | None:
        pod = self.pods_.get(name)
        if pod is not None and self.script is not None and "status" not in pod:
            status = self.script(pod)
            if status is not None:
                pod["status"] = status
        return pod

    async def create_pod(self, pod: Obj) -> Obj:
        meta = pod["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{next(self._names):05d}"
        created = {**pod, "metadata": {**meta, "name": name}}
        self.pods_[name] = created
        self.created.append(created)
        return created

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.pods_.pop(name, None)

    async def events(self, namespace: str, name: str) -> list[Obj]:
        return list(self.events_.get(name, []))

    async def pod_log(self, namespace: str, name: str, container: str) -> str:
        return self.logs.get((name, container), "")


def _node_of(obj: Obj) -> str | None:
    spec = obj.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    for term in terms:
        for expr in term.get("matchFields") or []:
            return str(expr["values"][0])
    return None


def _matches(obj: Obj, namespace: str, labels: Mapping[str, str]) -> bool:
    meta = obj.get("metadata") or {}
    own = meta.get("labels") or {}
    return meta.get("namespace") == namespace and all(own.get(k) == v for k, v in labels.items())


def driver_daemonset(namespace: str = "gpu-operator", owner: str = "ClusterPolicy") -> Obj:
    return {
        "metadata": {
            "name": "nvidia-driver-daemonset",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/component": "nvidia-driver"},
            "ownerReferences": [
                {"apiVersion": "nvidia.com/v1", "kind": owner, "name": "p", "controller": True}
            ],
        }
    }


def validator_daemonset(namespace: str = "gpu-operator") -> Obj:
    return {
        "metadata": {
            "name": "nvidia-operator-validator",
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "p", "uid": "u1"}
            ],
        },
        "spec": {
            "template": {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}
        },
    }


def pod(name: str, namespace: str, node: str, labels: Mapping[str, str], status: Obj) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"nodeName": node},
        "status": status,
    }


def succeeded(_pod: Obj) -> Obj:
    return {"phase": "Succeeded"}
