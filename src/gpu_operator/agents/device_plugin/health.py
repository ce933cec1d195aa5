"""Health rules: which NVML events make a device unhealthy, and when a fault has cleared.

Pure. Upstream's rules for faults: XID critical errors, except application XIDs and those
`DP_DISABLE_HEALTHCHECKS` lists (`DP_ENABLE_HEALTHCHECKS` wins over both), hit every device on the
GPU, or only the matching MIG device when the event names a GPU and compute instance. Beyond
upstream, double-bit ECC events are faults too, and a fault clears (see `recovered`) when the
driver says the GPU needs nothing any more: upstream keeps a device unhealthy until it restarts.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpu_operator.agents.device_plugin.devices import Device
from gpu_operator.nvml.protocol import EventData, EventType, RecoveryAction

log = logging.getLogger("gpu_operator.agents.device_plugin")

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"
# Application errors: the GPU itself is fine (graphics engine exception, page fault, stopped
# processing, preemptive cleanup, video processor exception, context switch timeout).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID_FALLEN_OFF_BUS = 79
# Event types registered per GPU (intersected with what the GPU supports).
EVENT_MASK = EventType.XID_CRITICAL | EventType.DOUBLE_BIT_ECC | EventType.SINGLE_BIT_ECC


class FaultKind(enum.Enum):
    XID = "xid"
    ECC = "ecc"
    LOST = "lost"  # NVML says the GPU has fallen off the bus
    MONITOR = "monitor"  # NVML could not watch the GPU (event set or registration failed)


@dataclass(frozen=True)
class XidPolicy:
    """Which XIDs are fatal: parsed from the two environment variables as upstream does."""

    all_disabled: bool = False
    disabled: frozenset[int] = APPLICATION_XIDS
    enabled: frozenset[int] = frozenset()
    all_enabled: bool = False

    @property
    def checks_off(self) -> bool:
        """No health checks at all: everything disabled and nothing explicitly enabled."""
        return self.all_disabled and not self.enabled and not self.all_enabled

    def is_fatal(self, xid: int) -> bool:
        if self.all_enabled or xid in self.enabled:
            return True
        if xid in self.disabled:
            return False
        return not self.all_disabled


def _xids(text: str) -> tuple[bool, frozenset[int]]:
    everything = False
    values: set[int] = set()
    for part in text.lower().split(","):
        item = part.strip()
        if item in ("all", "xids"):
            everything = True
        elif item.isdigit():
            values.add(int(item))
        elif item:
            log.info("ignoring malformed XID %r in the health-check settings", item)
    return everything, frozenset(values)


def parse_policy(disable: str | None, enable: str | None) -> XidPolicy:
    """`DP_DISABLE_HEALTHCHECKS` (`all`/`xids` or extra XIDs to ignore) and
    `DP_ENABLE_HEALTHCHECKS` (XIDs, or `all`, that count even when ignored otherwise)."""
    all_disabled, disabled = _xids(disable or "")
    all_enabled, enabled = _xids(enable or "")
    return XidPolicy(
        all_disabled=all_disabled,
        disabled=APPLICATION_XIDS | disabled,
        enabled=enabled,
        all_enabled=all_enabled,
    )


@dataclass(frozen=True)
class Fault:
    """Why a physical device (GPU or MIG UUID) is unhealthy."""

    kind: FaultKind
    reason: str
    # What the driver asked for right after the fault; None when it cannot say (old driver) or
    # the GPU did not answer.
    action: RecoveryAction | None = None


def classify(
    event: EventData, devices: Sequence[Device], policy: XidPolicy
) -> tuple[FaultKind, str, list[Device]] | None:
    """The fault an event reports and the devices it hits; None for events that are no fault."""
    if policy.checks_off:
        return None
    if event.event_type & EventType.XID_CRITICAL:
        if not policy.is_fatal(event.event_data):
            log.info("ignoring XID %d on %s", event.event_data, event.device_uuid)
            return None
        kind = FaultKind.LOST if event.event_data == XID_FALLEN_OFF_BUS else FaultKind.XID
        reason = f"XID {event.event_data}"
    elif event.event_type & EventType.DOUBLE_BIT_ECC:
        kind, reason = FaultKind.ECC, "double-bit (uncorrectable) ECC error"
    else:
        return None
    scoped = event.gpu_instance_id is not None and event.compute_instance_id is not None
    hit = []
    for d in devices:
        if event.device_uuid not in (d.parent_uuid, d.uuid):
            continue
        if (
            d.is_mig
            and scoped
            and (d.gpu_instance_id, d.compute_instance_id)
            != (
                event.gpu_instance_id,
                event.compute_instance_id,
            )
        ):
            continue
        hit.append(d)
    if not hit:
        log.info(
            "ignoring %s for a device this plugin does not serve: %s", reason, event.device_uuid
        )
        return None
    return kind, reason, hit


@dataclass(frozen=True)
class Probe:
    """What NVML says about a faulted device now."""

    answers: bool
    # None when the driver has no recovery-action field (NotSupported).
    action: RecoveryAction | None = None


def recovered(fault: Fault, probe: Probe) -> bool:
    """Whether a fault has cleared.

    A device is healthy again only when NVML answers for it and there is positive evidence that
    the cause is gone: the driver had asked for a recovery action (reset, reboot, drain) after
    the fault and now asks for none, or the GPU had fallen off the bus and answers again (it can
    only come back through a reset), or the fault was our monitoring failing rather than the GPU.
    A fatal XID after which the driver asked for nothing gives no such evidence and stays.
    """
    if not probe.answers:
        return False
    if fault.kind is FaultKind.MONITOR:
        return probe.action in (None, RecoveryAction.NONE)
    if probe.action is None:
        return fault.kind is FaultKind.LOST
    if probe.action is not RecoveryAction.NONE:
        return False
    return fault.kind is FaultKind.LOST or fault.action not in (None, RecoveryAction.NONE)


def recovery_explanation(fault: Fault, probe: Probe) -> str:
    """The reason logged and put in the node Event when a fault clears."""
    if fault.kind is FaultKind.LOST:
        return f"the GPU answers NVML again after {fault.reason}"
    if fault.kind is FaultKind.MONITOR:
        return f"NVML watches the device again ({fault.reason})"
    action = fault.action.name if fault.action is not None else "a recovery action"
    return f"the driver no longer asks for {action} after {fault.reason}"
