"""Detect a vGPU guest: NVIDIA PCI functions carrying the vGPU vendor capability ("VF" signature).

The capability holds records `[id, length, data...]`; record 0 is the host driver version and
branch (10 bytes each, NUL padded). Only used with the real backend; the mock takes it from the
machine description.
"""

from __future__ import annotations

from pathlib import Path

from gpu_operator.agents.gfd.facts import VgpuFacts

_NVIDIA = 0x10DE
_CAP_POINTER = 0x34
_CAP_VENDOR = 0x09
_RECORDS_START = 5
_FIELD = 10


def _vendor_capability(config: bytes) -> bytes | None:
    if len(config) < 0x40 or not config[0x06] & 0x10:  # status: capability list present
        return None
    pos = config[_CAP_POINTER] & 0xFC
    seen: set[int] = set()
    while pos and pos not in seen and pos + 2 < len(config):
        seen.add(pos)
        if config[pos] == _CAP_VENDOR:
            length = config[pos + 2]
            return config[pos : pos + length]
        pos = config[pos + 1] & 0xFC
    return None


def parse_capability(cap: bytes) -> VgpuFacts | None:
    """Host driver facts from a vendor capability, or None if it is not a vGPU one."""
    if len(cap) < 5 or cap[3:5] != b"VF":
        return None
    pos = _RECORDS_START
    while pos + 1 < len(cap) and cap[pos] != 0:
        step = cap[pos + 1]
        if step == 0:
            return None
        pos += step
    end = pos + 2 + 2 * _FIELD
    if pos + 1 >= len(cap) or cap[pos] != 0 or end > len(cap):
        return None
    version = cap[pos + 2 : pos + 2 + _FIELD].rstrip(b"\0").decode("ascii", "replace")
    branch = cap[pos + 2 + _FIELD : end].rstrip(b"\0").decode("ascii", "replace")
    return VgpuFacts(version, branch)


def probe(sysfs: str | Path = "/sys/bus/pci/devices") -> VgpuFacts | None:
    """The first vGPU found among NVIDIA display-class PCI functions, if any."""
    root = Path(sysfs)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for dev in entries:
        try:
            if int((dev / "vendor").read_text(), 16) != _NVIDIA:
                continue
            if int((dev / "class").read_text(), 16) >> 16 != 0x03:
                continue
            config = (dev / "config").read_bytes()
        except (OSError, ValueError):
            continue
        cap = _vendor_capability(config)
        found = parse_capability(cap) if cap else None
        if found is not None:
            return found
    return None
