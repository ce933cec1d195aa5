"""The CDI spec registry a container runtime consults on a simulated node.

Container runtimes resolve fully qualified CDI device names (`vendor/class=name`) against the
spec files in their spec directories (by default `/etc/cdi` and `/var/run/cdi`, JSON or YAML).
As in the CDI library: a spec that does not parse is skipped (the others still count), a device
named in a later directory wins over the same name in an earlier one, and injecting a device
applies its own container edits plus its spec's common edits. Names that match nothing are
"unresolvable" and the runtime refuses the container with them.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class Edits:
    """What injecting some devices adds to a container (container paths and variables)."""

    device_nodes: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass
class Resolution:
    """The devices found and their combined edits; `unresolved` names matched nothing."""

    devices: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    device_nodes: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)

    def add(self, edits: Edits) -> None:
        for target, values in (
            (self.device_nodes, edits.device_nodes),
            (self.mounts, edits.mounts),
            (self.env, edits.env),
        ):
            target.extend(v for v in values if v not in target)


@dataclass(frozen=True)
class _Spec:
    path: str
    kind: str
    devices: dict[str, Edits]
    common: Edits


def _edits(raw: Any) -> Edits:
    if not isinstance(raw, dict):
        return Edits()
    nodes = [str(n.get("path", "")) for n in raw.get("deviceNodes") or [] if isinstance(n, dict)]
    mounts = [
        str(m.get("containerPath", "")) for m in raw.get("mounts") or [] if isinstance(m, dict)
    ]
    env = [str(e) for e in raw.get("env") or []]
    return Edits(tuple(n for n in nodes if n), tuple(m for m in mounts if m), tuple(env))


def _parse(path: Path, node_path: str) -> _Spec | None:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    kind = str(data.get("kind") or "")
    vendor, _, cdi_class = kind.partition("/")
    if not vendor or not cdi_class:
        return None
    devices = {}
    for device in data.get("devices") or []:
        if isinstance(device, dict) and device.get("name") is not None:
            devices[str(device["name"])] = _edits(device.get("containerEdits"))
    return _Spec(node_path, kind, devices, _edits(data.get("containerEdits")))


@dataclass(frozen=True)
class Registry:
    """The specs found under a node root's spec directories, in priority order (last wins)."""

    specs: tuple[_Spec, ...] = ()

    @classmethod
    def load(cls, root: Path, spec_dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> Registry:
        """Read every spec file of the directories (node paths) under the node root `root`."""
        specs: list[_Spec] = []
        for directory in spec_dirs:
            host_dir = root / directory.lstrip("/")
            if not host_dir.is_dir():
                continue
            for entry in sorted(host_dir.iterdir()):
                if entry.suffix in SPEC_SUFFIXES and entry.is_file():
                    spec = _parse(entry, posixpath.join(directory, entry.name))
                    if spec is not None:
                        specs.append(spec)
        return cls(tuple(specs))

    def find(self, name: str) -> tuple[_Spec, Edits] | None:
        """The spec and edits of a qualified device name (the highest-priority match)."""
        kind, sep, device = name.partition("=")
        if not sep:
            return None
        for spec in reversed(self.specs):
            if spec.kind == kind and device in spec.devices:
                return spec, spec.devices[device]
        return None

    def resolve(self, names: Iterable[str]) -> Resolution:
        """Resolve qualified device names into their edits (device edits, then the common
        edits of each spec used once)."""
        result = Resolution()
        used: list[_Spec] = []
        for name in names:
            found = self.find(name)
            if found is None:
                if name not in result.unresolved:
                    result.unresolved.append(name)
                continue
            spec, edits = found
            if name not in result.devices:
                result.devices.append(name)
            result.add(edits)
            if spec not in used:
                used.append(spec)
        for spec in used:
            result.add(spec.common)
        return result


def unresolvable_message(names: Sequence[str]) -> str:
    """The CDI library's error for names no spec provides."""
    return "unresolvable CDI devices " + ", ".join(names)
