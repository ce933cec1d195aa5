"""Which NVIDIADriver owns a GPU node (reference §2.2): selectors in, one node's owner label out.

Upstream computes every node's owner in one pass and, when any node is selected by two
NVIDIADrivers, changes no label anywhere. Here the decision is per node, so a mistake in one
selector only freezes the nodes it touches:

- a node selected by exactly one non-default driver belongs to it; selected by none, to the default
  driver (or to no driver without one);
- a node selected by two or more drivers is a conflict: it keeps the owner it has (a running driver
  is never torn down over a selector mistake) and gets none if it has none; both drivers report it;
- a node whose answer depends on a driver that cannot be read (invalid spec) or on an ambiguous
  default (two default drivers) keeps its current owner too (fail closed).

A node's owner label is what the per-pool driver DaemonSets select on, so the label decides where
each driver runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_operator.api import keys
from gpu_operator.nodes import labelling

# A driver without a nodeSelector selects every GPU node (upstream's default selector).
_EVERY_GPU_NODE = {keys.GPU_PRESENT: "true"}


@dataclass(frozen=True)
class DriverSelector:
    """What ownership needs from one NVIDIADriver.

    `valid` is False when the object could not be read or its spec is invalid; its selector is
    then only used to freeze the nodes it would select (None: unknown, freezes nothing new).
    """

    name: str
    default: bool = False
    selector: Mapping[str, str] | None = None
    auto_upgrade: bool = True
    valid: bool = True

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether this (non-default) driver's nodeSelector matches a node's labels."""
        wanted = self.selector if self.selector else _EVERY_GPU_NODE
        return all(labels.get(key) == value for key, value in wanted.items())


@dataclass(frozen=True)
class Drivers:
    """The live NVIDIADrivers (those being deleted are left out by the caller)."""

    items: tuple[DriverSelector, ...] = ()

    @property
    def defaults(self) -> tuple[DriverSelector, ...]:
        return tuple(d for d in self.items if d.default and d.valid)

    @property
    def selecting(self) -> tuple[DriverSelector, ...]:
        return tuple(d for d in self.items if not d.default)

    def by_name(self, name: str | None) -> DriverSelector | None:
        return next((d for d in self.items if d.name == name), None)

    def problems(self) -> dict[str, str]:
        """Problems that belong to a driver as a whole (not to one node), by driver name."""
        found: dict[str, str] = {}
        defaults = self.defaults
        if len(defaults) > 1:
            names = ", ".join(sorted(d.name for d in defaults))
            for driver in defaults:
                found[driver.name] = (
                    f"multiple default NVIDIADrivers found ({names}): GPU nodes no other "
                    "NVIDIADriver selects keep the driver they have until only one is default"
                )
        return found


@dataclass(frozen=True)
class Ownership:
    """One node's owner decision.

    `owner` is the driver that owns the node (None: no driver). `keep` says the current label stays
    as it is (a conflict, or a decision that depends on a driver that cannot be read).
    `candidates` lists the non-default drivers that select the node; more than one is a conflict.
    """

    owner: str | None
    keep: bool = False
    candidates: tuple[str, ...] = field(default=())

    @property
    def conflict(self) -> bool:
        return len(self.candidates) > 1


def owner_of(labels: Mapping[str, str], drivers: Drivers) -> Ownership:
    """The owner of one node, from its labels and every live NVIDIADriver."""
    current = labels.get(keys.DRIVER_OWNER) or None
    if not labelling.has_gpu(labels):
        return Ownership(None)
    # Owners are assigned on the node as it is labelled now: gpu.present is set in the same patch.
    view = {**labels, keys.GPU_PRESENT: "true"}
    holder = drivers.by_name(current)
    if holder is not None and not holder.valid:
        return Ownership(current, keep=True)
    frozen = [d for d in drivers.items if not d.valid and d.selector and d.selects(view)]
    matching = tuple(sorted(d.name for d in drivers.selecting if d.valid and d.selects(view)))
    if len(matching) > 1:
        return Ownership(current, keep=True, candidates=matching)
    if frozen:
        return Ownership(current, keep=True, candidates=matching)
    if matching:
        return Ownership(matching[0], candidates=matching)
    defaults = drivers.defaults
    if len(defaults) > 1:
        return Ownership(current, keep=True)
    return Ownership(defaults[0].name if defaults else None)


def label_for(ownership: Ownership, drivers: Drivers) -> labelling.OwnerLabel:
    """The owner label (and upgrade annotation) node labelling writes for a decision."""
    if ownership.keep:
        return labelling.OwnerLabel(ownership.owner, keep=True)
    owner = drivers.by_name(ownership.owner)
    return labelling.OwnerLabel(
        ownership.owner, auto_upgrade=bool(owner is not None and owner.auto_upgrade)
    )


def conflicts(
    nodes: Iterable[tuple[str, Mapping[str, str]]], drivers: Drivers
) -> dict[str, list[str]]:
    """Nodes selected by more than one NVIDIADriver, listed under each driver that selects them."""
    found: dict[str, list[str]] = {}
    for name, labels in nodes:
        decision = owner_of(labels, drivers)
        if decision.conflict:
            for driver in decision.candidates:
                found.setdefault(driver, []).append(name)
    return {driver: sorted(names) for driver, names in found.items()}
