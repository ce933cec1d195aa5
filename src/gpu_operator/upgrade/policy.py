"""The effective upgrade policy of one driver: upstream's upgradePolicy with its defaults, plus
our canary and rollback extension read from annotations on the ClusterPolicy or NVIDIADriver.

The extension lives in annotations so that upstream's fields keep their meaning and the same
manifest still applies against upstream's CRDs (which would prune an unknown field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpu_operator.api import intstr
from gpu_operator.api.upgrade_policy import DriverUpgradePolicySpec, with_defaults
from gpu_operator.upgrade import selectors, states


@dataclass(frozen=True)
class Canary:
    """Ours: canary nodes per pool, how many failed nodes stop the rollout, and rollback."""

    nodes: int | str = 0
    max_failed: int | None = None
    rollback: bool = False
    validation_timeout: int = states.DEFAULT_VALIDATION_TIMEOUT


@dataclass(frozen=True)
class Policy:
    """What the planner needs from an upgrade policy (all defaults applied)."""

    auto_upgrade: bool = True
    max_parallel: int = 1
    max_unavailable: int | str = "25%"
    deletion_force: bool = False
    deletion_timeout: int = 300
    deletion_empty_dir: bool = False
    wait_selector: selectors.Selector = field(default_factory=selectors.Selector)
    wait_timeout: int = 0
    drain_enable: bool = False
    drain_force: bool = False
    drain_selector: selectors.Selector = field(default_factory=selectors.Selector)
    drain_timeout: int = 300
    drain_empty_dir: bool = False
    canary: Canary = field(default_factory=Canary)
    # Set when the policy cannot be used: the rollout starts no node until it is fixed.
    error: str | None = None

    def max_unavailable_of(self, total: int) -> int:
        """maxUnavailable as a node count: a percentage of `total`, rounded up like upstream."""
        return intstr.scaled_value(self.max_unavailable, total, round_up=True)

    def canary_count(self, pool_size: int) -> int:
        """Canary nodes in a pool of `pool_size` nodes (a percentage rounds up, at least 1)."""
        if self.canary.nodes in (0, "0", "0%") or pool_size == 0:
            return 0
        count = intstr.scaled_value(self.canary.nodes, pool_size, round_up=True)
        return max(1, min(count, pool_size))


def _int_annotation(annotations: Mapping[str, str], key: str, problems: list[str]) -> int | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    if not raw.strip().isdigit():
        problems.append(f"annotation {key}: expected a non-negative integer, got {raw!r}")
        return None
    return int(raw)


def canary_from(annotations: Mapping[str, str]) -> tuple[Canary, list[str]]:
    """Our extension annotations as a Canary, and what is wrong with them."""
    problems: list[str] = []
    nodes: int | str = 0
    raw = annotations.get(states.CANARY_NODES)
    if raw is not None:
        value: int | str = int(raw) if raw.strip().isdigit() else raw.strip()
        try:
            nodes = intstr.check(value)
        except intstr.IntOrPercentError as err:
            problems.append(f"annotation {states.CANARY_NODES}: {err}")
    max_failed = _int_annotation(annotations, states.MAX_FAILED_NODES, problems)
    timeout = _int_annotation(annotations, states.VALIDATION_TIMEOUT, problems)
    rollback = False
    raw = annotations.get(states.ROLLBACK)
    if raw is not None:
        if raw not in ("true", "false"):
            problems.append(
                f'annotation {states.ROLLBACK}: expected "true" or "false", got {raw!r}'
            )
        rollback = raw == "true"
    canary = Canary(
        nodes=nodes,
        max_failed=max_failed,
        rollback=rollback,
        validation_timeout=states.DEFAULT_VALIDATION_TIMEOUT if timeout is None else timeout,
    )
    return canary, problems


def effective(
    spec: DriverUpgradePolicySpec | None,
    annotations: Mapping[str, str] | None = None,
    *,
    auto_upgrade_default: bool = True,
) -> Policy:
    """The policy the planner runs with; `auto_upgrade_default` applies when `spec` is None."""
    full = with_defaults(spec)
    # with_defaults fills every sub-spec.
    assert full.podDeletion is not None
    assert full.waitForCompletion is not None
    assert full.drain is not None
    auto = full.autoUpgrade if spec is not None else auto_upgrade_default
    problems: list[str] = []
    try:
        intstr.check(full.maxUnavailable, allow_digit_string=True)
    except intstr.IntOrPercentError as err:
        problems.append(f"maxUnavailable: {err}")
    parsed: dict[str, selectors.Selector] = {}
    for name, text in (
        ("waitForCompletion.podSelector", full.waitForCompletion.podSelector),
        ("drain.podSelector", full.drain.podSelector),
    ):
        try:
            parsed[name] = selectors.parse(text)
        except selectors.SelectorError as err:
            problems.append(f"{name}: {err}")
            parsed[name] = selectors.Selector()
    canary, canary_problems = canary_from(annotations or {})
    problems += canary_problems
    return Policy(
        auto_upgrade=auto,
        max_parallel=full.maxParallelUpgrades,
        max_unavailable=full.maxUnavailable if not problems else 0,
        deletion_force=full.podDeletion.force,
        deletion_timeout=full.podDeletion.timeoutSeconds,
        deletion_empty_dir=full.podDeletion.deleteEmptyDir,
        wait_selector=parsed["waitForCompletion.podSelector"],
        wait_timeout=full.waitForCompletion.timeoutSeconds,
        drain_enable=full.drain.enable,
        drain_force=full.drain.force,
        drain_selector=parsed["drain.podSelector"],
        drain_timeout=full.drain.timeoutSeconds,
        drain_empty_dir=full.drain.deleteEmptyDir,
        canary=canary,
        error="; ".join(problems) or None,
    )
