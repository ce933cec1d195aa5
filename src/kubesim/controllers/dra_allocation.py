"""Structured-parameters device allocation for one node, as kube-scheduler's DRA plugin does it.

A pure planner: published ResourceSlices, DeviceClasses, the devices and counters already in
use and the claims to allocate go in; per claim an allocation result (or the reason there is
none) comes out. The rules it follows (Kubernetes 1.35, resource.k8s.io/v1):

- slices count for a node when they are node-local (`nodeName`), match it (`nodeSelector`) or
  serve `allNodes`; in each pool (driver + pool name) only the newest `pool.generation` counts,
  and only when all `resourceSliceCount` slices of that generation are published (an
  incomplete pool is skipped);
- a request is `exactly` (one device class, CEL selectors, `ExactCount` with `count` or `All`)
  or `firstAvailable`, a list of such alternatives tried in order; the result names the
  request as `<request>/<sub-request>`;
- a device matches when every selector of its class and of the request is true; a device in
  use by another claim is not available, except to a request with `adminAccess` (which does
  not take it either);
- partitionable devices: a device's `consumesCounters` must fit in what its pool's
  `sharedCounters` still have after every allocated device's consumption;
- `constraints[].matchAttribute`: every device picked for the listed requests (all when none
  are listed) has that attribute with one and the same value;
- the search backtracks over requests and devices, so a constraint or a later request can turn
  an earlier choice.

Results carry the request, driver, pool and device (and `adminAccess`), the configs of the
classes then of the claim, and a node selector: the node's name for node-local devices, the
slice's selector for node-selector slices, none for `allNodes` devices.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kubesim import dra_cel
from kubesim import quantity as quantities
from kubesim.controllers import scheduling

DeviceId = tuple[str, str, str]  # driver, pool, device
CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter
# How many device choices one node's search may try before giving up (bounds backtracking).
MAX_STEPS = 100_000


@dataclass
class Device:
    """One published device and where it comes from."""

    driver: str
    pool: str
    name: str
    raw: dict[str, Any]
    # "node" (node-local), "selector" or "all".
    scope: str
    node_selector: dict[str, Any] | None = None
    _activation: Any = None
    _content: str | None = None

    @property
    def ident(self) -> DeviceId:
        return (self.driver, self.pool, self.name)

    def activation(self) -> Any:
        if self._activation is None:
            self._activation = dra_cel.activation(self.driver, self.raw)
        return self._activation

    def verdict_key(self, program: dra_cel.Program) -> tuple[Any, ...]:
        """What a selector's verdict on this device depends on: the fields it reads (so every
        device agreeing on them shares one evaluation), else the device's whole content."""
        if program.references is None:
            if self._content is None:
                self._content = json.dumps(
                    [
                        self.raw.get("attributes"),
                        self.raw.get("capacity"),
                        bool(self.raw.get("allowMultipleAllocations")),
                    ],
                    sort_keys=True,
                )
            return (program.expression, self.driver, self._content)
        values: list[Any] = [program.expression, self.driver]
        for kind, domain, name in program.references:
            if kind == "allowMultipleAllocations":
                values.append(bool(self.raw.get(kind)))
            elif kind in ("attributes", "capacity"):
                entries = self.raw.get(kind) or {}
                value = entries.get(f"{domain}/{name}")
                if value is None and domain == self.driver:
                    value = entries.get(name)
                values.append(json.dumps(value, sort_keys=True) if value is not None else None)
        return tuple(values)

    def attribute(self, qualified: str) -> Any:
        domain, _, ident = qualified.rpartition("/")
        attributes = self.raw.get("attributes") or {}
        value = attributes.get(qualified)
        if value is None and domain == self.driver:
            value = attributes.get(ident)
        if not isinstance(value, Mapping):
            return None
        return next(((k, str(v)) for k, v in sorted(value.items())), None)

    def consumes(self) -> dict[CounterKey, Fraction]:
        used: dict[CounterKey, Fraction] = {}
        for entry in self.raw.get("consumesCounters") or []:
            for counter, value in (entry.get("counters") or {}).items():
                key = (self.driver, self.pool, entry.get("counterSet", ""), counter)
                used[key] = used.get(key, Fraction(0)) + _amount(value)
        return used


def _amount(counter: Any) -> Fraction:
    try:
        return quantities.parse(str((counter or {}).get("value", "0")))
    except ValueError:
        return Fraction(0)


@dataclass
class Inventory:
    """The devices and shared counters usable on one node."""

    devices: list[Device] = field(default_factory=list)
    counters: dict[CounterKey, Fraction] = field(default_factory=dict)
    # The devices every selector list matches (all expressions of a class and a request), kept
    # while the inventory lives: the caller builds a new one when the node's slices change.
    matching: dict[tuple[str, ...], list[Device]] = field(default_factory=dict)


def slice_scope(slice_obj: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """How a slice applies to a node ("node", "selector", "all") or None."""
    spec = slice_obj.get("spec") or {}
    name = (node.get("metadata") or {}).get("name")
    if spec.get("nodeName"):
        return "node" if spec["nodeName"] == name else None
    if spec.get("allNodes"):
        return "all"
    selector = spec.get("nodeSelector")
    if selector is not None:
        pod_like = {
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}
            }
        }
        return "selector" if scheduling.node_selected(dict(node), pod_like) else None
    return None


def inventory(slices: Iterable[Mapping[str, Any]], node: Mapping[str, Any]) -> Inventory:
    """The devices of the complete, newest generation of each pool that reach a node."""
    pools: dict[tuple[str, str], list[tuple[Mapping[str, Any], str]]] = {}
    newest: dict[tuple[str, str], int] = {}
    for slice_obj in slices:
        scope = slice_scope(slice_obj, node)
        if scope is None:
            continue
        spec = slice_obj.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (spec.get("driver", ""), pool.get("name", ""))
        generation = int(pool.get("generation") or 0)
        if generation > newest.get(key, -1):
            newest[key] = generation
        pools.setdefault(key, []).append((slice_obj, scope))
    result = Inventory()
    for key, members in pools.items():
        current = [
            (s, scope)
            for s, scope in members
            if int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) == newest[key]
        ]
        wanted = int(
            (((current[0][0].get("spec") or {}).get("pool")) or {}).get("resourceSliceCount") or 1
        )
        if len(current) < wanted:
            continue  # incomplete pool: the driver is still publishing it
        driver, pool = key
        for slice_obj, scope in current:
            spec = slice_obj.get("spec") or {}
            for counter_set in spec.get("sharedCounters") or []:
                for counter, value in (counter_set.get("counters") or {}).items():
                    ckey = (driver, pool, counter_set.get("name", ""), counter)
                    result.counters[ckey] = result.counters.get(ckey, Fraction(0)) + _amount(value)
            for device in spec.get("devices") or []:
                result.devices.append(
                    Device(
                        driver,
                        pool,
                        device.get("name", ""),
                        device,
                        scope,
                        spec.get("nodeSelector") if scope == "selector" else None,
                    )
                )
    return result


@dataclass
class Alternative:
    """One way to satisfy a request: `exactly` or one `firstAvailable` entry."""

    result_name: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool


@dataclass
class Request:
    name: str
    alternatives: list[Alternative]


class AllocationError(Exception):
    """The claim can never be allocated as written (a missing class, a broken selector)."""


_PARSED: dict[tuple[str, str], list[Request]] = {}


def requests_of(claim: Mapping[str, Any]) -> list[Request]:
    """A claim's requests with their alternatives (defaults applied); a stored claim's are
    parsed once per resourceVersion (the scheduler asks for every node it tries)."""
    meta = claim.get("metadata") or {}
    key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
    if all(key):
        parsed = _PARSED.get(key)
        if parsed is None:
            if len(_PARSED) > 10_000:
                _PARSED.clear()
            parsed = _PARSED[key] = _parse_requests(claim)
        return parsed
    return _parse_requests(claim)


def _parse_requests(claim: Mapping[str, Any]) -> list[Request]:
    found = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = request.get("name", "")
        subs = request.get("firstAvailable") or []
        options = [(f"{name}/{s.get('name', '')}", s) for s in subs] or [
            (name, request.get("exactly") or {})
        ]
        found.append(
            Request(
                name,
                [
                    Alternative(
                        result_name,
                        spec.get("deviceClassName", ""),
                        [
                            (s.get("cel") or {}).get("expression", "")
                            for s in spec.get("selectors") or []
                        ],
                        spec.get("allocationMode") or "ExactCount",
                        int(spec.get("count") or 1),
                        bool(spec.get("adminAccess")),
                    )
                    for result_name, spec in options
                ],
            )
        )
    return found


@dataclass
class Allocator:
    """Allocation on one node for the claims of one pod."""

    inventory: Inventory
    classes: Mapping[str, Mapping[str, Any]]
    in_use: set[DeviceId]
    counters_used: dict[CounterKey, Fraction]
    node: str = ""
    # Verdicts shared across nodes, claims and attempts, keyed by what they depend on
    # (`Device.verdict_key`: the expression, the driver and the device fields it reads): a
    # verdict is True, False or the CEL runtime error's text. Content-keyed, so a changed
    # device simply has another key.
    verdicts: dict[tuple[Any, ...], bool | str] = field(default_factory=dict)
    steps: int = 0

    def expressions(self, alternative: Alternative, request: str) -> tuple[str, ...]:
        cls = self.classes.get(alternative.class_name)
        if cls is None:
            raise AllocationError(
                f"request {request}: device class {alternative.class_name} does not exist"
            )
        return tuple(
            (s.get("cel") or {}).get("expression", "")
            for s in (cls.get("spec") or {}).get("selectors") or []
        ) + tuple(alternative.selectors)

    def matches(
        self, alternative: Alternative, device: Device, claim_name: str, request: str
    ) -> bool:
        return self._verdict(self.expressions(alternative, request), device, claim_name, request)

    def _verdict(
        self, expressions: tuple[str, ...], device: Device, claim_name: str, request: str
    ) -> bool:
        for index, expression in enumerate(expressions):
            program = dra_cel.compile_selector(expression)
            key = device.verdict_key(program)
            verdict = self.verdicts.get(key)
            if verdict is None:
                try:
                    verdict = program.matches(device.activation())
                except dra_cel.CelError as exc:
                    verdict = f"CEL runtime error: {exc}"
                self.verdicts[key] = verdict
            if isinstance(verdict, str):
                raise AllocationError(
                    f"claim {claim_name}, request {request}: selector #{index}: {verdict}"
                )
            if not verdict:
                return False
        return True

    def allocate(self, claims: list[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
        """Allocation results for every claim (in order), or None when they do not fit."""
        slots: list[tuple[int, Request, list[Mapping[str, Any]]]] = []
        for index, claim in enumerate(claims):
            for request in requests_of(claim):
                slots.append((index, request, []))
        chosen: list[list[tuple[str, Device, bool]]] = [[] for _ in claims]
        taken: set[DeviceId] = set()
        counters: dict[CounterKey, Fraction] = dict(self.counters_used)
        self.steps = 0
        if not self._search(claims, slots, 0, chosen, taken, counters):
            return None
        return [self._result(claim, picks) for claim, picks in zip(claims, chosen, strict=True)]

    def _candidates(self, claim: Mapping[str, Any], alt: Alternative, request: str) -> list[Device]:
        return self.candidates(claim, self.expressions(alt, request), request)

    def candidates(
        self, claim: Mapping[str, Any], expressions: tuple[str, ...], request: str
    ) -> list[Device]:
        """The inventory's devices all `expressions` hold for (cached in the inventory)."""
        found = self.inventory.matching.get(expressions)
        if found is None:
            name = (claim.get("metadata") or {}).get("name", "")
            found = [
                d for d in self.inventory.devices if self._verdict(expressions, d, name, request)
            ]
            self.inventory.matching[expressions] = found
        return found

    def _fits(self, device: Device, counters: dict[CounterKey, Fraction]) -> bool:
        for key, amount in device.consumes().items():
            if key not in self.inventory.counters:
                return False
            if counters.get(key, Fraction(0)) + amount > self.inventory.counters[key]:
                return False
        return True

    def _search(
        self,
        claims: list[Mapping[str, Any]],
        slots: list[tuple[int, Request, list[Mapping[str, Any]]]],
        position: int,
        chosen: list[list[tuple[str, Device, bool]]],
        taken: set[DeviceId],
        counters: dict[CounterKey, Fraction],
    ) -> bool:
        if position == len(slots):
            return all(
                self._constraints_hold(claim, picks)
                for claim, picks in zip(claims, chosen, strict=True)
            )
        index, request, _ = slots[position]
        claim = claims[index]
        for alt in request.alternatives:
            candidates = self._candidates(claim, alt, request.name)
            if alt.mode == "All":
                if not candidates:
                    continue
                if not alt.admin and any(
                    d.ident in self.in_use or d.ident in taken or not self._fits(d, counters)
                    for d in candidates
                ):
                    continue
                picks = [(alt.result_name, d, alt.admin) for d in candidates]
                if self._take(claims, slots, position, chosen, taken, counters, index, picks):
                    return True
                continue
            free = [
                d
                for d in candidates
                if alt.admin or (d.ident not in self.in_use and d.ident not in taken)
            ]
            if self._choose(
                claims, slots, position, chosen, taken, counters, index, alt, free, 0, []
            ):
                return True
        return False

    def _choose(
        self,
        claims: list[Mapping[str, Any]],
        slots: list[tuple[int, Request, list[Mapping[str, Any]]]],
        position: int,
        chosen: list[list[tuple[str, Device, bool]]],
        taken: set[DeviceId],
        counters: dict[CounterKey, Fraction],
        index: int,
        alt: Alternative,
        free: list[Device],
        start: int,
        picked: list[tuple[str, Device, bool]],
    ) -> bool:
        if len(picked) == alt.count:
            return self._take(claims, slots, position, chosen, taken, counters, index, picked)
        for offset in range(start, len(free)):
            self.steps += 1
            if self.steps > MAX_STEPS:
                return False
            device = free[offset]
            if device.ident in taken and not alt.admin:
                continue
            if not alt.admin and not self._fits(device, counters):
                continue
            if not self._partial_ok(
                claims[index], chosen[index] + picked + [(alt.result_name, device, alt.admin)]
            ):
                continue
            if self._choose(
                claims,
                slots,
                position,
                chosen,
                taken,
                counters,
                index,
                alt,
                free,
                offset + 1,
                [*picked, (alt.result_name, device, alt.admin)],
            ):
                return True
        return False

    def _take(
        self,
        claims: list[Mapping[str, Any]],
        slots: list[tuple[int, Request, list[Mapping[str, Any]]]],
        position: int,
        chosen: list[list[tuple[str, Device, bool]]],
        taken: set[DeviceId],
        counters: dict[CounterKey, Fraction],
        index: int,
        picks: list[tuple[str, Device, bool]],
    ) -> bool:
        if not self._partial_ok(claims[index], chosen[index] + picks):
            return False
        added: list[DeviceId] = []
        saved = dict(counters)
        for _, device, admin in picks:
            if admin:
                continue
            taken.add(device.ident)
            added.append(device.ident)
            for key, amount in device.consumes().items():
                counters[key] = counters.get(key, Fraction(0)) + amount
        chosen[index].extend(picks)
        if self._search(claims, slots, position + 1, chosen, taken, counters):
            return True
        del chosen[index][len(chosen[index]) - len(picks) :]
        for ident in added:
            taken.discard(ident)
        counters.clear()
        counters.update(saved)
        return False

    def _partial_ok(self, claim: Mapping[str, Any], picks: list[tuple[str, Device, bool]]) -> bool:
        return self._constraints_hold(claim, picks)

    def _constraints_hold(
        self, claim: Mapping[str, Any], picks: list[tuple[str, Device, bool]]
    ) -> bool:
        constraints = ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
        for constraint in constraints:
            attribute = constraint.get("matchAttribute")
            if not attribute:
                continue
            wanted = set(constraint.get("requests") or [])
            values = set()
            for result_name, device, _ in picks:
                parent = result_name.split("/", 1)[0]
                if wanted and result_name not in wanted and parent not in wanted:
                    continue
                value = device.attribute(attribute)
                if value is None:
                    return False
                values.add(value)
            if len(values) > 1:
                return False
        return True

    def _result(
        self, claim: Mapping[str, Any], picks: list[tuple[str, Device, bool]]
    ) -> dict[str, Any]:
        results = []
        for result_name, device, admin in picks:
            entry: dict[str, Any] = {
                "request": result_name,
                "driver": device.driver,
                "pool": device.pool,
                "device": device.name,
            }
            if admin:
                entry["adminAccess"] = True
            results.append(entry)
        config: list[dict[str, Any]] = []
        requests = requests_of(claim)
        for request in requests:
            used = {r for r, _, _ in picks if r == request.name or r.startswith(request.name + "/")}
            for alt in request.alternatives:
                if alt.result_name not in used:
                    continue
                cls = self.classes.get(alt.class_name) or {}
                for item in (cls.get("spec") or {}).get("config") or []:
                    config.append(
                        {"source": "FromClass", "requests": [request.name], **_config_body(item)}
                    )
        for item in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            entry = {"source": "FromClaim", **_config_body(item)}
            if item.get("requests"):
                entry["requests"] = list(item["requests"])
            config.append(entry)
        devices: dict[str, Any] = {"results": results}
        if config:
            devices["config"] = config
        allocation: dict[str, Any] = {"devices": devices}
        selector = _node_selector(self.node, [d for _, d, _ in picks])
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation


def _config_body(item: Mapping[str, Any]) -> dict[str, Any]:
    return {"opaque": item["opaque"]} if item.get("opaque") else {}


def node_name_selector(node: str) -> dict[str, Any]:
    """The selector the scheduler writes for node-local devices."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def _node_selector(node: str, devices: list[Device]) -> dict[str, Any] | None:
    if any(d.scope == "node" for d in devices):
        return node_name_selector(node)
    selected = [d.node_selector for d in devices if d.scope == "selector" and d.node_selector]
    if not selected:
        return None
    term: dict[str, Any] = {}
    for selector in selected:
        for part in selector.get("nodeSelectorTerms") or []:
            for key in ("matchExpressions", "matchFields"):
                if part.get(key):
                    term.setdefault(key, []).extend(part[key])
    return {"nodeSelectorTerms": [term]}
