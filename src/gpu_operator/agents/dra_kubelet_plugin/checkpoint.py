"""The plugin's checkpoint of prepared claims: `<plugin dir>/checkpoint.json`.

The idea is NVIDIA's (a file named `checkpoint.json` in the plugin's directory, claims keyed by
UID with a state `PrepareStarted`/`PrepareCompleted`, the prepared devices with their CDI ids,
and the node's boot id so a reboot forgets everything). The layout here is our own: `{"v2":
{...}, "checksum": <crc32 of the v2 JSON>}`. `encode`/`decode` are pure; `load`/`save` do the I/O
(an atomic replace, so a crash never leaves half a file).
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_NAME = "checkpoint.json"
PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"


class CorruptCheckpoint(ValueError):
    """The file does not parse or its checksum does not match."""


@dataclass(frozen=True)
class Device:
    request: str
    pool: str
    device: str
    uuid: str
    cdi_ids: tuple[str, ...]


@dataclass(frozen=True)
class Claim:
    state: str
    name: str
    namespace: str
    devices: tuple[Device, ...] = ()
    # Full GPUs whose time-slice the claim set (reset when it is unprepared).
    time_sliced: tuple[str, ...] = ()
    # The claim's MPS control daemon (none when empty): its GPUs and the commands it got, so a
    # restarted plugin brings back the daemon of a prepared claim.
    mps_uuids: tuple[str, ...] = ()
    mps_commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    boot_id: str = ""
    claims: Mapping[str, Claim] = field(default_factory=dict)


def _claim_json(c: Claim) -> dict[str, Any]:
    return {
        "checkpointState": c.state,
        "name": c.name,
        "namespace": c.namespace,
        "preparedDevices": [
            {
                "Requests": [d.request],
                "PoolName": d.pool,
                "DeviceName": d.device,
                "UUID": d.uuid,
                "CDIDeviceIDs": list(d.cdi_ids),
            }
            for d in c.devices
        ],
        "timeSliced": list(c.time_sliced),
        **(
            {"mps": {"uuids": list(c.mps_uuids), "commands": list(c.mps_commands)}}
            if c.mps_uuids
            else {}
        ),
    }


def encode(cp: Checkpoint) -> str:
    v2 = {
        "nodeBootID": cp.boot_id,
        "preparedClaims": {uid: _claim_json(c) for uid, c in sorted(cp.claims.items())},
    }
    body = json.dumps(v2, sort_keys=True, separators=(",", ":"))
    return json.dumps({"v2": v2, "checksum": zlib.crc32(body.encode())}, indent=1) + "\n"


def decode(text: str) -> Checkpoint:
    try:
        data = json.loads(text)
        v2 = data["v2"]
        body = json.dumps(v2, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(body.encode()) != data["checksum"]:
            raise CorruptCheckpoint("checkpoint checksum mismatch")
        claims = {
            uid: Claim(
                state=c["checkpointState"],
                name=c.get("name", ""),
                namespace=c.get("namespace", ""),
                devices=tuple(
                    Device(
                        request=(d.get("Requests") or [""])[0],
                        pool=d["PoolName"],
                        device=d["DeviceName"],
                        uuid=d.get("UUID", ""),
                        cdi_ids=tuple(d.get("CDIDeviceIDs") or ()),
                    )
                    for d in c.get("preparedDevices") or []
                ),
                time_sliced=tuple(c.get("timeSliced") or ()),
                mps_uuids=tuple((c.get("mps") or {}).get("uuids") or ()),
                mps_commands=tuple((c.get("mps") or {}).get("commands") or ()),
            )
            for uid, c in (v2.get("preparedClaims") or {}).items()
        }
        return Checkpoint(boot_id=str(v2.get("nodeBootID") or ""), claims=claims)
    except CorruptCheckpoint:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise CorruptCheckpoint(f"checkpoint does not parse: {err}") from None


def load(path: Path, boot_id: str) -> Checkpoint:
    """The checkpoint at `path`; an empty one when there is none or the node rebooted since."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Checkpoint(boot_id=boot_id)
    cp = decode(text)
    if cp.boot_id and boot_id and cp.boot_id != boot_id:
        return Checkpoint(boot_id=boot_id)
    return Checkpoint(boot_id=boot_id or cp.boot_id, claims=cp.claims)


def save(path: Path, cp: Checkpoint) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(encode(cp))
    os.replace(tmp, path)
