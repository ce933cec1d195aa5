"""The device manager's checkpoint file (`kubelet_internal_checkpoint`) in the kubelet's layout.

The file is JSON, `{"Data": {"PodDeviceEntries": [...], "RegisteredDevices": {...}},
"Checksum": n}`. Each entry names a pod UID, container and resource, its device IDs keyed by
NUMA node (`-1` for devices without topology) and the plugin's Allocate response as base64
protobuf bytes, so a restarted kubelet can give a container the same devices and run options
without asking the plugin again. `RegisteredDevices` lists the healthy device IDs per resource.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeletapi.deviceplugin.v1beta1 import api_pb2


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used (unreadable, malformed or with a bad checksum)."""


@dataclass
class Entry:
    """One container's devices of one resource."""

    pod_uid: str
    container: str
    resource: str
    # NUMA node ID (-1: no topology) -> device IDs.
    devices: dict[int, list[str]]
    response: api_pb2.ContainerAllocateResponse


def checksum(data: dict[str, Any]) -> int:
    """A 32-bit checksum of the `Data` part.

    The kubelet hashes its in-memory structure (FNV-32a over a printed dump of the Go value),
    which cannot be reproduced outside Go; kubesim hashes the compact JSON of `Data` instead,
    so only kubesim verifies the checksums it writes.
    """
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    value = 0x811C9DC5
    for byte in raw:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def encode(entries: list[Entry], registered: dict[str, list[str]]) -> bytes:
    """The checkpoint file's bytes (Go's encoding/json writes map keys sorted)."""
    data = {
        "PodDeviceEntries": [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container,
                "ResourceName": e.resource,
                "DeviceIDs": {str(numa): ids for numa, ids in sorted(e.devices.items(), key=_key)},
                "AllocResp": base64.b64encode(e.response.SerializeToString()).decode(),
            }
            for e in entries
        ],
        "RegisteredDevices": {name: registered[name] for name in sorted(registered)},
    }
    return json.dumps({"Data": data, "Checksum": checksum(data)}, separators=(",", ":")).encode()


def _key(item: tuple[int, list[str]]) -> str:
    return str(item[0])


def decode(raw: bytes) -> tuple[list[Entry], dict[str, list[str]]]:
    """Entries and registered devices of a checkpoint file's bytes."""
    try:
        document = json.loads(raw)
        data = document["Data"]
        if checksum(data) != document["Checksum"]:
            raise CheckpointError("checkpoint is corrupted")
        entries = []
        for item in data.get("PodDeviceEntries") or []:
            response = _response(item["AllocResp"])
            entries.append(
                Entry(
                    pod_uid=str(item["PodUID"]),
                    container=str(item["ContainerName"]),
                    resource=str(item["ResourceName"]),
                    devices={int(k): [str(i) for i in v] for k, v in item["DeviceIDs"].items()},
                    response=response,
                )
            )
        registered = {
            str(name): [str(i) for i in ids]
            for name, ids in (data.get("RegisteredDevices") or {}).items()
        }
    except CheckpointError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"malformed checkpoint: {exc}") from exc
    return entries, registered


def _response(encoded: str) -> api_pb2.ContainerAllocateResponse:
    response = api_pb2.ContainerAllocateResponse()
    try:
        response.ParseFromString(base64.b64decode(encoded))
    except Exception as exc:  # protobuf's DecodeError is no ValueError
        raise CheckpointError(f"malformed checkpoint: AllocResp: {exc}") from exc
    return response


def write(path: Path, entries: list[Entry], registered: dict[str, list[str]]) -> None:
    """Write the checkpoint atomically (a reader never sees half a file)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(encode(entries, registered))
    os.replace(temporary, path)


def read(path: Path) -> tuple[list[Entry], dict[str, list[str]]]:
    """Read a checkpoint; a missing file is an empty one."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return [], {}
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    return decode(raw)
