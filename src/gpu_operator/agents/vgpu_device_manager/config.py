"""The vGPU device manager's config file (upstream `api/spec/v1`), validated with errors that
name the field.

```yaml
version: v1
vgpu-configs:
  A100-4C:                       # a config name, selected by the nvidia.com/vgpu.config label
    - devices: all               # or GPU indexes: [0, 1]
      device-filter: 0x20B010DE  # optional: PCI device ids ("0x<device><vendor>"), one or a list
      vgpu-devices:
        A100-4C: 10              # vGPU type (without its NVIDIA/GRID prefix) -> count per GPU
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from gpu_operator.agents.mig_manager.config import DeviceId

VERSION = "v1"
_ENTRY_KEYS = ("device-filter", "devices", "vgpu-devices")
# Upstream's vGPU type names: time-sliced `<GPU>-<GB><series>` and MIG-backed
# `<GPU>-<instances>-<GB><series>[ME]` (series A, B, C or Q; 0 GB means 512 MB).
TIME_SLICED = re.compile(r"^(?P<gpu>[A-Z0-9]+)-(?P<gb>0|[1-9][0-9]*)(?P<series>[ABCQ])$")
MIG_BACKED = re.compile(
    r"^(?P<gpu>[A-Z0-9]+)-(?P<g>[1-9])-(?P<gb>0|[1-9][0-9]*)(?P<series>[ABCQ])(?P<me>ME)?$"
)


class ConfigError(ValueError):
    """The file is not a valid vGPU config; the message names the field."""


def mig_backed(vgpu_type: str) -> bool:
    return MIG_BACKED.match(vgpu_type) is not None


@dataclass(frozen=True)
class Entry:
    """One item of a config: which GPUs, and the vGPUs each of them gets."""

    devices: Literal["all"] | tuple[int, ...]
    vgpu_devices: dict[str, int]
    device_filter: tuple[DeviceId, ...] = ()

    def covers(self, index: int, pci_device_id: int) -> bool:
        """Whether this entry applies to GPU `index` with PCI id `0x<device><vendor>`."""
        if self.device_filter and not any(f.matches(pci_device_id, 0) for f in self.device_filter):
            return False
        return self.devices == "all" or index in self.devices


@dataclass(frozen=True)
class VgpuConfigFile:
    configs: dict[str, tuple[Entry, ...]] = field(default_factory=dict)

    def select(self, name: str) -> tuple[Entry, ...]:
        if name not in self.configs:
            known = ", ".join(sorted(self.configs)) or "none"
            raise ConfigError(f"selected vgpu-config not present: {name!r} (configs: {known})")
        return self.configs[name]


def load(path: str | Path) -> VgpuConfigFile:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    return loads(text, str(path))


def loads(text: str, source: str = "config") -> VgpuConfigFile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not YAML: {err}") from None
    return parse(data, source)


def parse(data: Any, source: str = "config") -> VgpuConfigFile:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with `version` and `vgpu-configs`")
    unknown = sorted(set(data) - {"version", "vgpu-configs"})
    if unknown:
        raise ConfigError(f"{source}: unexpected field: {unknown[0]}")
    if "version" not in data:
        raise ConfigError(f"{source}: unable to parse with missing 'version' field")
    if data["version"] != VERSION:
        raise ConfigError(f"{source}.version: unknown version: {data['version']!r} (want v1)")
    configs = data.get("vgpu-configs")
    if not isinstance(configs, dict) or not configs:
        raise ConfigError(f"{source}.vgpu-configs: at least one entry is required")
    out: dict[str, tuple[Entry, ...]] = {}
    for name, entries in configs.items():
        where = f"{source}.vgpu-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: at least one entry is required")
        out[str(name)] = tuple(_entry(item, f"{where}[{i}]") for i, item in enumerate(entries))
    return VgpuConfigFile(out)


def _entry(item: Any, where: str) -> Entry:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = sorted(set(item) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unexpected field: {unknown[0]}")
    for required in ("devices", "vgpu-devices"):
        if required not in item:
            raise ConfigError(f"{where}: missing required field: {required}")
    return Entry(
        devices=_devices(item["devices"], f"{where}.devices"),
        vgpu_devices=_vgpu_devices(item["vgpu-devices"], f"{where}.vgpu-devices"),
        device_filter=_filters(item.get("device-filter"), f"{where}.device-filter"),
    )


def _devices(value: Any, where: str) -> Literal["all"] | tuple[int, ...]:
    if value == "all":
        return "all"
    if isinstance(value, str):
        raise ConfigError(f"{where}: invalid string input: {value!r} (want `all` or indexes)")
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ConfigError(f"{where}: expected `all` or a list of GPU indexes, got {value!r}")
    return tuple(value)


def _filters(value: Any, where: str) -> tuple[DeviceId, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 0xFFFFFFFF:
            out.append(DeviceId(item >> 16, item & 0xFFFF))  # YAML read 0x20B010DE as a number
            continue
        if not isinstance(item, str):
            raise ConfigError(f"{where}: expected a PCI id such as 0x20B010DE, got {item!r}")
        try:
            out.append(DeviceId.parse(item))
        except ValueError as err:
            raise ConfigError(f"{where}: {err}") from None
    return tuple(out)


def _vgpu_devices(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of vGPU type to count")
    out: dict[str, int] = {}
    for name, count in value.items():
        name = str(name)
        if not (TIME_SLICED.match(name) or MIG_BACKED.match(name)):
            raise ConfigError(
                f"{where}.{name}: malformed vGPU type (want <GPU>-<GB><series> such as "
                "A100-4C, or <GPU>-<instances>-<GB><series> such as A100-1-5C)"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ConfigError(f"{where}.{name}: expected a count >= 0, got {count!r}")
        out[name] = count
    return out
