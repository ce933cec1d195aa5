"""Whether and when a MIG reconfiguration that did not finish is tried again, as pure decisions:
facts in (the failure's NVML return code, the node's labels, the driver container's ready
marker, the attempt), decision out (the state to write, the message, the delay).

A failure is transient when its cause goes away by itself: the driver is not loaded, being
replaced or not answering yet (NVML: driver not loaded, uninitialised, library not found, library
and kernel versions differ), or a GPU is busy (NVML: in use, timeout). Those are retried with a
capped exponential backoff; the state stays `pending` (the message says why and when the next
try is) until the delay reaches its cap, then shows `failed` while the retries go on, so that a
cause that does not go away is seen. Everything else (an unknown config or profile, a layout the
GPUs cannot hold, a lost GPU, missing privileges) is permanent: `failed`, with the reason, until
the label or the driver changes.

While the driver is being restarted the GPUs are not touched at all (`driver_hold`): an NVML
handle opened then would keep the old driver from unloading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.api import keys
from gpu_operator.nvml import errors

# Return codes of a driver that is not there (yet): being replaced, or not loaded.
DRIVER_CODES = frozenset(
    {
        errors.ERROR_UNINITIALIZED,
        errors.ERROR_DRIVER_NOT_LOADED,
        errors.ERROR_LIBRARY_NOT_FOUND,
        errors.ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# Return codes of a GPU that is busy for now (a process on it, a slow answer).
BUSY_CODES = frozenset({errors.ERROR_IN_USE, errors.ERROR_TIMEOUT})
TRANSIENT_CODES = DRIVER_CODES | BUSY_CODES
# The value k8s-driver-manager pauses operand deploy labels to while it replaces the driver
# (a suffix `_paused-for-driver-upgrade` on values other than `true`).
DRIVER_PAUSE = "paused-for-driver-upgrade"
# The upgrade state in which the operator's upgrade controller replaces the driver pod.
UPGRADE_POD_RESTART = "pod-restart-required"
# What the driver container writes into the validations directory once its driver is loaded
# (its startup probe) and removes when it stops (its preStop hook).
DRIVER_READY_MARKER = ".driver-ctr-ready"
# Events: a transient failure (first try), and one that has not gone away (the cap reached).
REASON_RETRYING = "MigConfigRetrying"
REASON_FAILED = "MigConfigFailed"


def transient_code(code: int | None) -> bool:
    """Whether an NVML return code describes a condition that goes away by itself."""
    return code in TRANSIENT_CODES


def driver_code(code: int | None) -> bool:
    """Whether an NVML return code says the driver is missing (a reboot would not help)."""
    return code in DRIVER_CODES


def _containerised_driver(labels: Mapping[str, str]) -> bool:
    """The operator's driver container is meant to run here (its deploy label is `true`, or
    paused for an upgrade or rollback); not with a driver on the host or none."""
    value = labels.get(keys.DEPLOY_DRIVER)
    return value not in (None, "", "false", keys.DRIVER_PREINSTALLED)


def driver_hold(labels: Mapping[str, str], marker_present: bool | None) -> str | None:
    """Why the GPUs must be left alone now because the driver is being (re)started, or None.

    `marker_present`: whether the driver container's ready marker is there; False only where a
    driver container serves the node (see `readiness`), None when the marker says nothing.
    """
    paused = sorted(
        key
        for key, value in labels.items()
        if key.startswith(keys.DEPLOY_PREFIX) and DRIVER_PAUSE in value
    )
    if paused:
        return (
            f"the driver is being restarted (the driver manager paused the GPU operands: "
            f"{paused[0]}={labels[paused[0]]})"
        )
    if labels.get(keys.UPGRADE_STATE) == UPGRADE_POD_RESTART:
        return f"the driver pod is being replaced ({keys.UPGRADE_STATE}={UPGRADE_POD_RESTART})"
    if marker_present is False and _containerised_driver(labels):
        return (
            f"the driver container is not ready ({DRIVER_READY_MARKER} is missing from the "
            "validations directory)"
        )
    return None


def _duration(seconds: float) -> str:
    whole = round(seconds)
    minutes, rest = divmod(whole, 60)
    if minutes and rest:
        return f"{minutes}m{rest}s"
    return f"{minutes}m" if minutes else f"{rest}s"


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: `initial`, then times `factor` per attempt, at most `cap`."""

    initial: float = 5.0
    factor: float = 2.0
    cap: float = 300.0

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt `attempt` (1 is the first try)."""
        exponent = max(attempt, 1) - 1
        delay = self.initial
        for _ in range(exponent):
            delay *= self.factor
            if delay >= self.cap:
                return self.cap
        return min(delay, self.cap)

    def capped_from(self) -> int:
        """The first attempt whose delay is the cap."""
        attempt = 1
        while self.delay(attempt) < self.cap and attempt < 1000:
            attempt += 1
        return attempt


@dataclass(frozen=True)
class Decision:
    """What a reconfiguration that did not finish leaves on the node, and what comes next."""

    state: str
    message: str
    retry_in: float | None = None  # None: not retried until the label or the driver changes
    event: str | None = None  # the Event reason to record (None: none this time)


def decide(reason: str, *, transient: bool, attempt: int, backoff: Backoff) -> Decision:
    """The state, message, next try and Event after attempt `attempt` ended with `reason`."""
    if not transient:
        return Decision(proto.STATE_FAILED, reason, None, REASON_FAILED)
    delay = backoff.delay(attempt)
    tries = "1 try" if attempt == 1 else f"{attempt} tries"
    if delay < backoff.cap:
        event = REASON_RETRYING if attempt == 1 else None
        message = f"{reason}; retrying in {_duration(delay)} ({tries} so far)"
        return Decision(proto.STATE_PENDING, message, delay, event)
    event = REASON_FAILED if attempt == backoff.capped_from() else None
    message = f"{reason}; still retrying every {_duration(backoff.cap)} ({tries} so far)"
    return Decision(proto.STATE_FAILED, message, delay, event)
