"""The desired-content hash that decides whether an object is written (issue 32: it deep-copied
every rendered object on every pass)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from gpu_operator.api import keys
from gpu_operator.kube.writer import content_hash


def reference_hash(obj: dict[str, Any]) -> str:
    """The hash as first defined: a deep copy without our hash annotation, sorted JSON."""
    clean = copy.deepcopy(obj)
    meta = clean.get("metadata") or {}
    annotations = meta.get("annotations")
    if annotations is not None:
        annotations.pop(keys.LAST_APPLIED_HASH, None)
        if not annotations:
            del meta["annotations"]
    encoded = json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:20]


def daemonset(annotations: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "nvidia-device-plugin-daemonset", "namespace": "gpu-operator"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "A"}]}]}}},
    }


@pytest.mark.parametrize(
    "annotations",
    [None, {}, {keys.LAST_APPLIED_HASH: "x"}, {keys.LAST_APPLIED_HASH: "x", "a": "1"}, {"a": "1"}],
)
def test_the_hash_is_unchanged_and_leaves_the_object_alone(
    annotations: dict[str, str] | None,
) -> None:
    obj = daemonset(annotations)
    before = copy.deepcopy(obj)
    assert content_hash(obj) == reference_hash(obj)
    assert obj == before


def test_hashing_copies_no_more_than_the_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("content_hash deep-copied the object")

    monkeypatch.setattr(copy, "deepcopy", refuse)
    content_hash(daemonset({keys.LAST_APPLIED_HASH: "x", "a": "1"}))
