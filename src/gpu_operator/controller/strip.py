"""Cache transforms: keep only the fields the planners read (memory stays flat at scale).

Label keys and common values are interned: thousands of nodes and pods repeat the same strings,
and one shared copy of each is most of what keeps the operator small at 5,000 nodes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gpu_operator.api import crds, keys, manifests
from gpu_operator.controller import drift
from gpu_operator.kube.client import FIELD_MANAGER
from gpu_operator.kube.writer import PREVIOUS_WRITER_FLAG
from gpu_operator.nodes import gate, labelling, ledger
from gpu_operator.operands import dcgm_exporter, nvidiadriver, readiness, takeover
from gpu_operator.upgrade import snapshot
from gpu_operator.upgrade import states as upgrade_states

# Node labels the planners read besides the `nvidia.com/` ones.
_NODE_LABELS = frozenset({*keys.NFD_GPU_LABELS, keys.NFD_OS_ID, keys.NFD_OS_VERSION_ID,
                          keys.NFD_OS_VERSION_MAJOR, keys.NFD_OSTREE_VERSION, keys.NFD_KERNEL_FULL,
                          keys.NFD_MELLANOX})  # fmt: skip
# The upgrade's failure annotation: the status says why a node's driver upgrade failed.
_NODE_ANNOTATIONS = frozenset({ledger.ANNOTATION, keys.UPGRADE_ENABLED, upgrade_states.FAILURE})
# ConfigMap keys whose contents the renderers read (not only their presence).
_CHECKED_KEYS = (dcgm_exporter.METRICS_KEY,)


def _interned(mapping: dict[str, str]) -> dict[str, str]:
    return {sys.intern(k): sys.intern(v) if len(v) < 64 else v for k, v in mapping.items()}


_META_KEYS = ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
              "deletionTimestamp", "labels", "ownerReferences")  # fmt: skip


def _meta(obj: dict[str, Any], *, annotations: bool | tuple[str, ...] = False) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {k: meta[k] for k in _META_KEYS if k in meta}
    source = meta.get("annotations") or {}
    if annotations is True:
        out["annotations"] = dict(source)
    elif annotations:
        kept = {k: source[k] for k in annotations if k in source}
        if kept:
            out["annotations"] = kept
    return out


def node(obj: dict[str, Any]) -> dict[str, Any]:
    """The labels and annotations the planners read, NFD presence, and runtime facts.

    `labels` holds the `nvidia.com/` labels and the NFD labels the planners read. NVIDIADriver
    node selectors may name any label (a pool label, an instance type), so the other labels are
    kept apart under `selectable` (the labelling planners never walk them); the many NFD feature
    labels nobody reads are dropped: a node with a hundred of them would otherwise cost kilobytes.
    """
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    info = (obj.get("status") or {}).get("nodeInfo") or {}
    read: dict[str, str] = {}
    other: dict[str, str] = {}
    for key, value in labels.items():
        if key.startswith(keys.PREFIX) or key in _NODE_LABELS:
            read[key] = value
        elif not key.startswith(keys.NFD_LABEL_PREFIX):
            other[key] = value
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "labels": _interned(read),
            "annotations": {k: v for k, v in annotations.items() if k in _NODE_ANNOTATIONS},
        },
        "selectable": _interned(other),
        "nfd": labelling.has_nfd(labels),
        "status": {"nodeInfo": _interned({
            k: info[k] for k in ("containerRuntimeVersion", "kernelVersion") if k in info
        }),
            # Whole GPUs someone advertises (the coexistence detector; the readiness gate).
            "gpu": _gpu_count((obj.get("status") or {}).get("capacity")),
            # Whole GPUs and MIG slices (the readiness gate, nodes/gate.py).
            "gpuAllocatable": gate.allocatable_gpus((obj.get("status") or {}).get("allocatable")),
            # Whole GPUs a plugin serves now (the coexistence detector: capacity without this is
            # what a plugin that went away leaves for the kubelet's grace period).
            "gpuWholeAllocatable": _gpu_count((obj.get("status") or {}).get("allocatable")),
        },
        # The startup taint the readiness gate removes; nodes carry a few taints at most.
        "taints": list((obj.get("spec") or {}).get("taints") or ()),
    }  # fmt: skip


def _gpu_count(resources: Any) -> int:
    try:
        return int((resources or {}).get("nvidia.com/gpu") or 0)
    except (TypeError, ValueError):
        return 0


def pod(obj: dict[str, Any]) -> readiness.PodSummary:
    """A pod as readiness needs it: owner, node, revision and its worst problem, if any (its
    shared strings interned by `readiness.summarize`: one summary built per pod event)."""
    return readiness.summarize(obj)


def pod_record(namespace: str) -> Callable[[dict[str, Any]], snapshot.Pod]:
    """The transform of the operator's one pod cache (every namespace): the upgrade planner's
    record of each pod, carrying its readiness summary (`pod`) when it is in the operator's
    `namespace` (the status side reads those through a view: `pod_summary`)."""

    def record(obj: dict[str, Any]) -> snapshot.Pod:
        meta = obj.get("metadata") or {}
        summary = readiness.summarize(obj) if meta.get("namespace") == namespace else None
        return snapshot.pod_from(obj, summary)

    return record


def pod_summary(record: snapshot.Pod) -> readiness.PodSummary | None:
    """What the status side's pod view keeps of a record of `pod_record`: the operator
    namespace's pods' summaries (None leaves every other pod out)."""
    return record.summary


def owned(obj: dict[str, Any]) -> dict[str, Any]:
    """Objects the operator renders: identity, our hash annotation, workload status, and for
    ConfigMaps the keys they hold."""
    out: dict[str, Any] = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _meta(obj, annotations=(keys.LAST_APPLIED_HASH,)),
    }
    if takeover.has_previous_writer(obj):
        # NVIDIA's operator (or a JSON patch of ours) still owns fields: take it over.
        out[PREVIOUS_WRITER_FLAG] = True
    if obj.get("kind") == "ConfigMap":
        data = obj.get("data") or {}
        out["keys"] = sorted({*data, *(obj.get("binaryData") or {})})
        # The exporter's counters CSV is checked line by line; it is a few kilobytes.
        checked = {k: data[k] for k in _CHECKED_KEYS if isinstance(data.get(k), str)}
        if checked:
            out["data"] = checked
    if obj.get("kind") in ("DaemonSet", "Deployment"):
        spec = obj.get("spec") or {}
        out["spec"] = {k: spec[k] for k in ("updateStrategy", "selector", "replicas") if k in spec}
        out["status"] = obj.get("status") or {}
    if obj.get("kind") == "DaemonSet":
        # What hand-edit detection compares, and who else wrote the object (controller/drift.py).
        out["drift"] = drift.view(obj)
        out["editors"] = drift.editors(
            (obj.get("metadata") or {}).get("managedFields"), FIELD_MANAGER
        )
    return out


def revision(obj: dict[str, Any]) -> dict[str, Any]:
    """A ControllerRevision's identity and number; for driver DaemonSets also the fingerprint of
    the pod it describes (the NVIDIADriver hand-over compares them)."""
    out = {"metadata": _meta(obj), "revision": obj.get("revision")}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/component") == nvidiadriver.COMPONENT:
        template = ((obj.get("data") or {}).get("spec") or {}).get("template")
        if isinstance(template, dict):
            out["fingerprint"] = nvidiadriver.fingerprint(template)
    return out


def crd(obj: dict[str, Any]) -> dict[str, Any]:
    """A CRD's name and our schema version marker."""
    return {"metadata": _meta(obj, annotations=(crds.SCHEMA_VERSION_ANNOTATION,))}


# Deeper than any real manifest (they nest about 10 levels), far below what breaks a recursive
# decoder or validator; the same bound as `gpu-operator validate`.
MAX_DEPTH = manifests.MAX_DEPTH
TOO_DEEP = "invalidNesting"


def bounded(obj: dict[str, Any]) -> dict[str, Any]:
    """A custom resource with every subtree nested deeper than MAX_DEPTH cut off (without
    recursion); the cut fields are listed under TOO_DEEP, which the reconcilers report as an
    invalid spec. One hostile object must not break validation, or the cache, for the rest."""
    problems: list[str] = []
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(obj, 0, ())]
    while stack:
        value, depth, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in list(items):
            if not isinstance(child, dict | list):
                continue
            where = (*path, str(key))
            if depth + 1 >= MAX_DEPTH:
                value[key] = None
                shown = ".".join(where[:3])
                problems.append(f"{shown}: nested more than {MAX_DEPTH} levels deep")
                continue
            stack.append((child, depth + 1, where))
    if problems:
        obj[TOO_DEEP] = sorted(set(problems))
    return obj
