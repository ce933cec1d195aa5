"""The mig-parted config file (`version: v1`, `mig-configs`): parsing, validation and selection.

Errors name the file, the config and the entry (`config.yaml: mig-configs.custom[1].devices: ...`)
and nothing is applied from a file that does not parse. Upstream's rules are kept: `version` must
be `v1`, unknown keys are rejected, `devices` is `all` or a list of indices, `mig-devices` is
required when `mig-enabled` is true and must be empty when it is false, counts are non-negative
and not all zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpu_operator.agents.mig_manager import profiles
from gpu_operator.agents.mig_manager.profiles import Profile
from gpu_operator.api import manifests

VERSION = "v1"
ALL: Literal["all"] = "all"
_ENTRY_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")


class ConfigError(ValueError):
    """A config file or selection that cannot be used; the message names file, config and entry."""


@dataclass(frozen=True)
class DeviceId:
    """A PCI id as device filters spell it: `0x20B010DE`, optionally `:<subsystem id>`."""

    device: int
    vendor: int
    subsystem: int | None = None

    @classmethod
    def parse(cls, text: str) -> DeviceId:
        """Parse `0x<device><vendor>[:0x<subdevice><subvendor>]` (Go's base-0 integers)."""
        parts = text.split(":")
        if len(parts) > 2:
            raise ValueError("expected <devicevendor> or <devicevendor>:<subdevicevendor>")
        primary = _uint32(parts[0])
        subsystem = _uint32(parts[1]) if len(parts) == 2 else None
        return cls(primary >> 16, primary & 0xFFFF, subsystem)

    @property
    def packed(self) -> int:
        return (self.device << 16) | self.vendor

    def matches(self, pci_device_id: int, pci_subsystem_id: int) -> bool:
        """Primary ids must match; a filter with a subsystem must match that too."""
        if self.packed != pci_device_id:
            return False
        return self.subsystem is None or self.subsystem == pci_subsystem_id

    def __str__(self) -> str:
        text = f"0x{self.packed:08X}"
        return text if self.subsystem is None else f"{text}:0x{self.subsystem:08X}"


def _uint32(text: str) -> int:
    raw = text.strip()
    try:
        # Like Go's ParseUint(s, 0, 32): 0x hex, 0o/0 octal, 0b binary or decimal.
        value = int(raw, 8) if len(raw) > 1 and raw[0] == "0" and raw[1].isdigit() else int(raw, 0)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{text!r} does not fit in 32 bits")
    return value


@dataclass(frozen=True)
class Entry:
    """One element of a config's list: which GPUs it covers and what they should look like."""

    index: int
    devices: Literal["all"] | tuple[int, ...]
    mig_enabled: bool
    mig_devices: Mapping[Profile, int] = field(default_factory=dict)
    device_filter: tuple[DeviceId, ...] = ()

    def covers(self, gpu_index: int, pci_device_id: int, pci_subsystem_id: int = 0) -> bool:
        if self.device_filter and not any(
            f.matches(pci_device_id, pci_subsystem_id) for f in self.device_filter
        ):
            return False
        return self.devices == ALL or gpu_index in self.devices

    @property
    def wanted(self) -> dict[Profile, int]:
        """The positive counts (a zero count asks for nothing)."""
        return {p: n for p, n in self.mig_devices.items() if n > 0}


@dataclass(frozen=True)
class MigConfigFile:
    """A parsed config file: named configs, each a list of entries applied in order."""

    source: str
    configs: Mapping[str, tuple[Entry, ...]]

    def select(self, name: str) -> tuple[Entry, ...]:
        """The entries of config `name`; ConfigError names the configs the file has."""
        try:
            return self.configs[name]
        except KeyError:
            known = ", ".join(sorted(self.configs))
            raise ConfigError(
                f"{self.source}: no MIG config named {name!r}; the file defines: {known}"
            ) from None


def load(path: str | Path) -> MigConfigFile:
    """Read and parse a config file (YAML or JSON)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"{source}: cannot read the MIG config file: {err.strerror}") from None
    return loads(text, source)


def loads(text: str, source: str = "config") -> MigConfigFile:
    try:
        data = manifests.load_text(text, source)
    except manifests.ManifestError as err:
        raise ConfigError(str(err)) from None
    return parse(data, source)


def parse(data: Any, source: str = "config") -> MigConfigFile:
    """Validate a decoded document; ConfigError names the offending field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with version and mig-configs")
    if "version" not in data:
        raise ConfigError(f"{source}: version: required (expected {VERSION!r})")
    if data["version"] != VERSION:
        raise ConfigError(f"{source}: version: unknown version {data['version']!r} (expected v1)")
    unknown = sorted(str(k) for k in data if k not in ("version", "mig-configs"))
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}: unknown field (expected version, mig-configs)")
    raw = data.get("mig-configs")
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{source}: mig-configs: expected a mapping with at least one config")
    configs: dict[str, tuple[Entry, ...]] = {}
    for name, entries in raw.items():
        where = f"{source}: mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: expected a non-empty list of entries")
        configs[str(name)] = tuple(
            _entry(item, i, f"{where}[{i}]") for i, item in enumerate(entries)
        )
    return MigConfigFile(source, configs)


def _entry(item: Any, index: int, where: str) -> Entry:
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping with devices and mig-enabled")
    for key in item:
        if key not in _ENTRY_KEYS:
            raise ConfigError(f"{where}.{key}: unknown field (expected {', '.join(_ENTRY_KEYS)})")
    for key in ("devices", "mig-enabled"):
        if key not in item:
            raise ConfigError(f"{where}.{key}: required")
    enabled = item["mig-enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.mig-enabled: expected true or false, got {enabled!r}")
    devices = _devices(item["devices"], f"{where}.devices")
    filters = _filters(item.get("device-filter"), f"{where}.device-filter")
    raw_devices = item.get("mig-devices")
    if enabled and raw_devices is None:
        raise ConfigError(f"{where}.mig-devices: required when mig-enabled is true ({{}} for none)")
    if not enabled and raw_devices:
        raise ConfigError(f"{where}.mig-devices: must be empty when mig-enabled is false")
    mig_devices = _mig_devices(raw_devices or {}, f"{where}.mig-devices")
    return Entry(index, devices, enabled, mig_devices, filters)


def _devices(value: Any, where: str) -> Literal["all"] | tuple[int, ...]:
    if value == ALL:
        return ALL
    if isinstance(value, str):
        raise ConfigError(f"{where}: the only string allowed is 'all', got {value!r}")
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ConfigError(f"{where}: expected 'all' or a list of GPU indices, got {value!r}")
    return tuple(value)


def _filters(value: Any, where: str) -> tuple[DeviceId, ...]:
    if value is None:
        return ()
    items: Sequence[Any] = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError(f"{where}: expected a device id string or a list of them")
    out = []
    for raw in items:
        # YAML reads an unquoted 0x20B010DE as a number; take it as the packed id it spells.
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= 0xFFFFFFFF:
            out.append(DeviceId(raw >> 16, raw & 0xFFFF))
            continue
        if not isinstance(raw, str):
            raise ConfigError(f"{where}: {raw!r} is not a device id (e.g. '0x20B010DE')")
        try:
            out.append(DeviceId.parse(raw))
        except ValueError as err:
            raise ConfigError(
                f"{where}: {raw!r} is not a device id ({err}; expected 0x<device><vendor> in "
                "hex such as 0x20B010DE, optionally :0x<subsystem device><subsystem vendor>)"
            ) from None
    return tuple(out)


def _mig_devices(value: Any, where: str) -> dict[Profile, int]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping of profile to count, got {value!r}")
    out: dict[Profile, int] = {}
    for key, count in value.items():
        try:
            profile = profiles.parse(str(key))
        except profiles.ProfileError as err:
            raise ConfigError(f"{where}: {err}") from None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"{where}.{key}: expected a count of 0 or more, got {count!r}")
        if profile in out:
            raise ConfigError(f"{where}.{key}: {profile} is listed twice")
        out[profile] = count
    if out and not any(out.values()):
        raise ConfigError(f"{where}: all counts are 0 (use {{}} for MIG enabled without devices)")
    return out
