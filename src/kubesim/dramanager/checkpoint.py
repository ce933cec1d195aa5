"""The DRA manager's checkpoint (`<kubelet root>/dra_manager_state`) in the kubelet's layout.

The file is JSON, `{"Data": "<JSON text>", "Checksum": n}`, the inner text being
`{"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
"ClaimInfoStateList": [...]}` with one entry per claim the node's kubelet knows: its UID, name,
namespace, the UIDs of the pods using it and, per driver, the devices the driver prepared with
their request names and CDI device ids. A restarted kubelet reads it back, so it can still
unprepare claims of pods that went away while it was down and give running containers the same
CDI devices.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kubesim.devicemanager.checkpoint import checksum
from kubesim.dramanager.claims import ClaimInfo

KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used (unreadable, malformed or with a bad checksum)."""


def encode(infos: list[ClaimInfo]) -> bytes:
    data = json.dumps(
        {
            "kind": KIND,
            "apiVersion": API_VERSION,
            "ClaimInfoStateList": [
                info.to_json() for info in sorted(infos, key=lambda i: (i.namespace, i.name))
            ],
        },
        separators=(",", ":"),
    )
    return json.dumps({"Data": data, "Checksum": checksum({"Data": data})}).encode()


def decode(raw: bytes) -> list[ClaimInfo]:
    try:
        outer = json.loads(raw)
        data = outer["Data"]
        if outer["Checksum"] != checksum({"Data": data}):
            raise CheckpointError("checkpoint is corrupted: checksum mismatch")
        inner = json.loads(data)
        if inner.get("kind") != KIND or inner.get("apiVersion") != API_VERSION:
            raise CheckpointError(
                f"unsupported checkpoint {inner.get('apiVersion')}/{inner.get('kind')}"
            )
        return [ClaimInfo.from_json(entry) for entry in inner.get("ClaimInfoStateList") or []]
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint is malformed: {exc}") from None


def read(path: Path) -> list[ClaimInfo]:
    """The claims recorded in the checkpoint (none when there is no file)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(str(exc)) from None
    return decode(raw)


def write(path: Path, infos: list[ClaimInfo]) -> None:
    """Replace the checkpoint atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(encode(infos))
    os.replace(tmp, path)
