"""PCI addresses as NVML and sysfs spell them (pure)."""

from __future__ import annotations


def sysfs_name(bus_id: str) -> str:
    """NVML's `00000000:07:00.0` as sysfs names the device: `0000:07:00.0`.

    NVML pads the domain to 8 hex digits, sysfs to at least 4: a 32-bit domain such as a VMD
    domain (`00010000`) keeps its significant digits (`10000:...`).
    """
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    try:
        number = int(domain, 16)
    except ValueError:
        return text
    return f"{number:04x}:{rest}"
