"""The label ownership ledger: which node labels the operator set, and to what.

Upstream cannot tell its own labels from a human's, so uninstalling leaves labels behind and a
reconcile can overwrite a hand-set value. We record every label we write in a node annotation and
only ever change or remove a label while it still holds the value we wrote.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

ANNOTATION = "nvidia.com/gpu-operator.owned-labels"

# k8s-driver-manager pauses operands by rewriting our deploy labels to "paused-for-..." values
# and restores them afterwards: such a value still belongs to the operator.
PAUSE_PREFIX = "paused-"

# Not a label: the entry that records a cordon (spec.unschedulable) made by the driver upgrade,
# so the operator uncordons only nodes it cordoned itself. "@" cannot occur in a label key.
CORDON = "@spec.unschedulable"


def read(annotations: Mapping[str, str]) -> dict[str, str]:
    """The labels the operator owns on a node, with the values it wrote."""
    raw = annotations.get(ANNOTATION)
    if not raw:
        return {}
    return dict(_decode(str(raw)))


@functools.lru_cache(maxsize=4096)
def _decode(raw: str) -> tuple[tuple[str, str], ...]:
    """A ledger annotation's entries, decoded once per distinct value: the status and upgrade
    passes read every node's ledger on every pass, and a fleet's ledgers are mostly alike."""
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError:
        return ()  # a mangled ledger: own nothing rather than guess
    if not isinstance(loaded, dict):
        return ()
    return tuple((str(k), str(v)) for k, v in loaded.items())


def encode(owned: Mapping[str, str]) -> str | None:
    """The annotation value for a ledger, or None to remove the annotation."""
    return json.dumps(dict(sorted(owned.items())), separators=(",", ":")) if owned else None


def owns(owned: Mapping[str, str], key: str, current: str | None) -> bool:
    """Whether the operator may change `key`: it wrote it and nobody changed it since."""
    if key not in owned or current is None:
        return False
    return current == owned[key] or current.startswith(PAUSE_PREFIX)
