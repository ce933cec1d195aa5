"""When the MIG manager tries a reconfiguration again, as pure decisions (issue 30, item 3): which
failures are transient, the capped exponential backoff, the state and message each try leaves,
and when the driver's restart keeps the GPUs untouched."""

from __future__ import annotations

import pytest

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import retry
from gpu_operator.api import keys

BACKOFF = retry.Backoff()


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (nvml.DriverNotLoaded, True),  # the driver pod is being replaced
        (nvml.Uninitialized, True),
        (nvml.LibraryNotFound, True),  # the driver root is not mounted again yet
        (nvml.VersionMismatch, True),  # new library, old kernel module (mid-upgrade)
        (nvml.InUse, True),  # a process still holds the GPU
        (nvml.Timeout, True),
        (nvml.GpuLost, False),  # needs a reset or a reboot, not patience
        (nvml.NoPermission, False),
        (nvml.InsufficientResources, False),
        (nvml.NotSupported, False),
        (nvml.InvalidArgument, False),
        (nvml.Unknown, False),
    ],
)
def test_which_nvml_errors_are_transient(error: type[nvml.NvmlError], transient: bool) -> None:
    assert retry.transient_code(error().code) is transient
    assert retry.transient_code(None) is False


def test_only_a_missing_driver_is_a_driver_code() -> None:
    assert retry.driver_code(nvml.DriverNotLoaded.code)
    assert not retry.driver_code(nvml.InUse.code)  # a reboot may help a busy GPU


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [BACKOFF.delay(n) for n in range(1, 10)] == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert BACKOFF.capped_from() == 7
    short = retry.Backoff(initial=1, factor=3, cap=10)
    assert [short.delay(n) for n in range(1, 5)] == [1, 3, 9, 10]
    assert BACKOFF.delay(10_000) == 300  # no overflow however long it lasts


def test_a_permanent_failure_is_failed_with_its_reason_and_not_retried() -> None:
    reason = "default: no MIG config named 'all-9g.99gb'; the file defines: all-disabled"
    decision = retry.decide(reason, transient=False, attempt=1, backoff=BACKOFF)
    assert decision == retry.Decision("failed", reason, None, "MigConfigFailed")


def test_a_transient_failure_stays_pending_and_says_when_it_is_tried_again() -> None:
    reason = "reading the GPUs failed: Driver Not Loaded"
    first = retry.decide(reason, transient=True, attempt=1, backoff=BACKOFF)
    assert first == retry.Decision(
        "pending", f"{reason}; retrying in 5s (1 try so far)", 5.0, "MigConfigRetrying"
    )
    second = retry.decide(reason, transient=True, attempt=2, backoff=BACKOFF)
    assert second == retry.Decision("pending", f"{reason}; retrying in 10s (2 tries so far)", 10.0)
    sixth = retry.decide(reason, transient=True, attempt=6, backoff=BACKOFF)
    assert (sixth.state, sixth.retry_in, sixth.event) == ("pending", 160.0, None)
    assert sixth.message.endswith("retrying in 2m40s (6 tries so far)")


def test_a_transient_failure_that_lasts_shows_failed_but_is_still_retried() -> None:
    reason = "reading the GPUs failed: Driver Not Loaded"
    capped = retry.decide(reason, transient=True, attempt=7, backoff=BACKOFF)
    assert capped == retry.Decision(
        "failed",
        f"{reason}; still retrying every 5m (7 tries so far)",
        300.0,
        "MigConfigFailed",
    )
    later = retry.decide(reason, transient=True, attempt=8, backoff=BACKOFF)
    assert (later.state, later.retry_in, later.event) == ("failed", 300.0, None)


DRIVER = keys.DEPLOY_DRIVER
PLUGIN = keys.DEPLOY_PREFIX + "device-plugin"


@pytest.mark.parametrize(
    ("labels", "marker", "held"),
    [
        # The driver manager pauses the operands while it replaces the driver.
        ({DRIVER: "true", PLUGIN: "paused-for-driver-upgrade"}, True, "driver manager paused"),
        ({PLUGIN: "custom_paused-for-driver-upgrade"}, None, "driver manager paused"),
        # The upgrade controller replaces the driver pod.
        ({keys.UPGRADE_STATE: "pod-restart-required"}, True, "driver pod is being replaced"),
        ({keys.UPGRADE_STATE: "validation-required"}, True, None),
        # A containerised driver whose container is not ready (its marker is missing).
        ({DRIVER: "true"}, False, "driver container is not ready"),
        ({DRIVER: "paused-for-driver-rollback"}, False, "driver container is not ready"),
        ({DRIVER: "true"}, True, None),
        ({DRIVER: "true"}, None, None),  # the marker cannot be seen here: no opinion
        # No driver container here: the marker never exists.
        ({DRIVER: "pre-installed"}, False, None),
        ({DRIVER: "false"}, False, None),
        ({}, False, None),
        # The MIG manager's own pause is not the driver's.
        ({DRIVER: "true", PLUGIN: "paused-for-mig-change"}, True, None),
    ],
)
def test_the_gpus_are_left_alone_while_the_driver_restarts(
    labels: dict[str, str], marker: bool | None, held: str | None
) -> None:
    reason = retry.driver_hold(labels, marker)
    if held is None:
        assert reason is None
    else:
        assert reason is not None
        assert held in reason
