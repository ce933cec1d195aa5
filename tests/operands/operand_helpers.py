"""Helpers for operand tests: policies from sections, facts with every image env set, lookups."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import ClusterPolicy, images
from gpu_operator.operands.facts import ClusterFacts

REQUIRED = ("operator", "daemonsets", "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm",
            "nodeStatusExporter", "gfd")  # fmt: skip

# What the OLM bundle sets: an image for every operand, so policies need not name them.
FULL_ENV = {name: f"registry.example/{name.lower().replace('_', '-')}:v1" for name in
            sorted(set(images.IMAGE_ENV.values()))}  # fmt: skip

Obj = dict[str, Any]


def make_policy(**sections: Any) -> ClusterPolicy:
    """A ClusterPolicy with the required sections empty and `sections` on top."""
    spec: dict[str, Any] = {name: {} for name in REQUIRED}
    spec.update(sections)
    return ClusterPolicy.model_validate({"metadata": {"name": "cluster-policy"}, "spec": spec})


def make_facts(**fields: Any) -> ClusterFacts:
    fields.setdefault("operator_env", FULL_ENV)
    return ClusterFacts(**fields)


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, (
        f"expected one {kind} {name}, got {[o['metadata']['name'] for o in matches]}"
    )
    return matches[0]


def pod(ds: Obj) -> Obj:
    found: Obj = ds["spec"]["template"]["spec"]
    return found


def ctr(ds: Obj, name: str) -> Obj:
    spec = pod(ds)
    for item in [*spec.get("initContainers", []), *spec["containers"]]:
        if item["name"] == name:
            found: Obj = item
            return found
    raise AssertionError(f"no container {name} in {ds['metadata']['name']}")


def names(ds: Obj, key: str = "containers") -> list[str]:
    return [c["name"] for c in pod(ds).get(key, [])]


def env_of(container: Obj) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mounts_of(container: Obj) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def volumes_of(ds: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod(ds).get("volumes", [])}


def render_ds(module: Any, policy: ClusterPolicy, facts: ClusterFacts | None = None,
              name: str | None = None) -> Obj:  # fmt: skip
    """Render a state module and return its only (or named) DaemonSet."""
    return find(module.render(policy, facts or make_facts()), "DaemonSet", name)
