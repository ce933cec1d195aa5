"""Validation of resource.k8s.io/v1 (dynamic resource allocation) as kube-apiserver 1.35 does it.

DeviceClasses, ResourceClaims, ResourceClaimTemplates and ResourceSlices, plus the DRA parts of
a pod (`spec.resourceClaims`, `resources.claims` of containers). Field paths and details follow
the server's; CEL selector expressions are compiled (kubesim.dra_cel) so a broken selector is a
422 at admission, never a surprise in the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubesim import dra_cel, list_index
from kubesim.validation import field, meta, syntax
from kubesim.validation.field import FieldError

# The API server's selectable fields of ResourceSlices (besides metadata.name/namespace): a
# kubelet lists its node's slices, a driver its own. Indexed like pods' spec.nodeName.
for _path in ("spec.nodeName", "spec.driver"):
    list_index.register_field(("resource.k8s.io", "resourceslices"), _path)

# The API's size limits (k8s.io/api/resource/v1 constants).
DEVICE_REQUESTS_MAX = 32
DEVICE_SELECTORS_MAX = 32
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
FIRST_AVAILABLE_MAX = 8
RESERVED_FOR_MAX = 256
ALLOCATION_RESULTS_MAX = 32
SLICE_MAX_DEVICES = 128
SLICE_MAX_DEVICES_ADVANCED = 64
SLICE_MAX_COUNTER_SETS = 8
POOL_NAME_MAX = 253
DRIVER_NAME_MAX = 63
ATTRIBUTE_VALUE_MAX = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
ALLOCATION_MODES = ("All", "ExactCount")
CONFIG_SOURCES = ("FromClass", "FromClaim")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def _invalid_each(path: str, value: str, problems: list[str]) -> list[FieldError]:
    return [field.invalid(path, value, p) for p in problems]


def driver_name(value: Any, path: str) -> list[FieldError]:
    """A driver name: required, at most 63 bytes, a DNS subdomain (the CSI driver name rule)."""
    if not value:
        return [field.required(path)]
    text = str(value)
    if len(text) > DRIVER_NAME_MAX:
        return [field.too_long(path, DRIVER_NAME_MAX)]
    return _invalid_each(path, text, syntax.dns1123_subdomain(text.lower()))


def pool_name(value: Any, path: str) -> list[FieldError]:
    """A pool name: required, at most 253 bytes, `/`-separated DNS subdomains."""
    if not value:
        return [field.required(path)]
    text = str(value)
    problems: list[FieldError] = []
    if len(text) > POOL_NAME_MAX:
        problems.append(field.too_long(path, POOL_NAME_MAX))
    for part in text.split("/"):
        problems.extend(_invalid_each(path, part, syntax.dns1123_subdomain(part)))
    return problems


def _label(value: Any, path: str) -> list[FieldError]:
    if not value:
        return [field.required(path)]
    return _invalid_each(path, str(value), syntax.dns1123_label(str(value)))


def _set(
    items: Any,
    path: str,
    limit: int,
    check: Callable[[Any, str], list[FieldError]],
    key: Callable[[Any], Any] | None = None,
) -> list[FieldError]:
    items = items or []
    problems: list[FieldError] = []
    if limit >= 0 and len(items) > limit:
        problems.append(field.too_many(path, len(items), limit))
    seen: set[Any] = set()
    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        problems.extend(check(item, where))
        if key is not None:
            k = key(item)
            if k in seen:
                problems.append(field.duplicate(where, k))
            seen.add(k)
    return problems


def _name_of(item: Any) -> Any:
    return item.get("name", "") if isinstance(item, Mapping) else item


def selector(item: Any, path: str) -> list[FieldError]:
    """One DeviceSelector: a CEL expression that compiles within the cost limit."""
    cel = item.get("cel") if isinstance(item, Mapping) else None
    if not isinstance(cel, Mapping):
        return [field.required(f"{path}.cel")]
    where = f"{path}.cel.expression"
    expression = str(cel.get("expression") or "")
    problem = dra_cel.compile_problem(expression)
    if problem is None:
        return []
    kind, detail = problem
    if kind == "too_long":
        return [field.too_long(where, dra_cel.MAX_EXPRESSION_LENGTH)]
    if kind == "too_complex":
        return [field.forbidden(where, detail)]
    return [field.invalid(where, expression, detail)]


def _allocation_mode(request: Mapping[str, Any], path: str) -> list[FieldError]:
    mode = request.get("allocationMode")
    count = request.get("count") or 0
    if mode == "All":
        if count:
            return [
                field.invalid(
                    f"{path}.count", count, "must not be specified when allocationMode is 'All'"
                )
            ]
        return []
    if mode == "ExactCount":
        if count <= 0:
            return [field.invalid(f"{path}.count", count, "must be greater than zero")]
        return []
    return [field.not_supported(f"{path}.allocationMode", mode or "", ALLOCATION_MODES)]


def _device_class(value: Any, path: str) -> list[FieldError]:
    if not value:
        return [field.required(path)]
    return _invalid_each(path, str(value), syntax.dns1123_subdomain(str(value)))


def _exact(request: Mapping[str, Any], path: str) -> list[FieldError]:
    problems = _device_class(request.get("deviceClassName"), f"{path}.deviceClassName")
    problems += _set(request.get("selectors"), f"{path}.selectors", DEVICE_SELECTORS_MAX, selector)
    problems += _allocation_mode(request, path)
    return problems


def _request(request: Any, path: str) -> list[FieldError]:
    if not isinstance(request, Mapping):
        return []
    problems = _label(request.get("name"), f"{path}.name")
    exactly = request.get("exactly")
    first = request.get("firstAvailable") or []
    if exactly is None and not first:
        problems.append(
            field.required(path, "exactly one of `exactly` or `firstAvailable` is required")
        )
    elif exactly is not None and first:
        problems.append(
            field.invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, "
                "but multiple fields are set",
            )
        )
    elif first:

        def sub(item: Any, where: str) -> list[FieldError]:
            if not isinstance(item, Mapping):
                return []
            return _label(item.get("name"), f"{where}.name") + _exact(item, where)

        problems += _set(first, f"{path}.firstAvailable", FIRST_AVAILABLE_MAX, sub, _name_of)
    elif isinstance(exactly, Mapping):
        problems += _exact(exactly, f"{path}.exactly")
    return problems


def _request_names(devices: Mapping[str, Any]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for request in devices.get("requests") or []:
        if isinstance(request, Mapping):
            names[str(request.get("name", ""))] = {
                str(s.get("name", ""))
                for s in request.get("firstAvailable") or []
                if isinstance(s, Mapping)
            }
    return names


def _request_ref(name: Any, path: str, names: dict[str, set[str]]) -> list[FieldError]:
    text = str(name or "")
    segments = text.split("/")
    detail = (
        "must be the name of a request in the claim or the name of a request and a "
        "subrequest separated by '/'"
    )
    if len(segments) > 2:
        return [field.invalid(path, text, detail)]
    problems: list[FieldError] = []
    for segment in segments:
        problems += _invalid_each(path, segment, syntax.dns1123_label(segment))
    known = segments[0] in names and (len(segments) == 1 or segments[1] in names[segments[0]])
    if not known:
        problems.append(field.invalid(path, text, detail))
    return problems


def _opaque(config: Any, path: str) -> list[FieldError]:
    opaque = config.get("opaque") if isinstance(config, Mapping) else None
    if not isinstance(opaque, Mapping):
        return [field.required(f"{path}.opaque")]
    problems = driver_name(opaque.get("driver"), f"{path}.opaque.driver")
    if opaque.get("parameters") is None:
        problems.append(field.required(f"{path}.opaque.parameters"))
    return problems


def device_claim(devices: Any, path: str) -> list[FieldError]:
    """A claim's `devices`: requests, constraints and config."""
    if not isinstance(devices, Mapping):
        return []
    names = _request_names(devices)
    problems = _set(
        devices.get("requests"), f"{path}.requests", DEVICE_REQUESTS_MAX, _request, _name_of
    )

    def constraint(item: Any, where: str) -> list[FieldError]:
        if not isinstance(item, Mapping):
            return []
        found = _set(
            item.get("requests"),
            f"{where}.requests",
            DEVICE_REQUESTS_MAX,
            lambda n, p: _request_ref(n, p, names),
            lambda n: n,
        )
        attribute = item.get("matchAttribute") or item.get("distinctAttribute")
        if not attribute:
            found.append(field.required(f"{where}.matchAttribute"))
        else:
            which = "matchAttribute" if item.get("matchAttribute") else "distinctAttribute"
            found += fully_qualified_name(attribute, f"{where}.{which}")
        return found

    def config(item: Any, where: str) -> list[FieldError]:
        if not isinstance(item, Mapping):
            return []
        found = _set(
            item.get("requests"),
            f"{where}.requests",
            DEVICE_REQUESTS_MAX,
            lambda n, p: _request_ref(n, p, names),
            lambda n: n,
        )
        return found + _opaque(item, where)

    problems += _set(
        devices.get("constraints"), f"{path}.constraints", DEVICE_CONSTRAINTS_MAX, constraint
    )
    problems += _set(devices.get("config"), f"{path}.config", DEVICE_CONFIG_MAX, config)
    return problems


def fully_qualified_name(value: Any, path: str) -> list[FieldError]:
    """`domain/identifier`: a DNS subdomain, a slash, a C identifier."""
    text = str(value)
    domain, slash, ident = text.partition("/")
    if not slash:
        return [
            field.required(
                path, "a fully qualified name must be a domain and a name separated by a slash"
            )
        ]
    problems = _invalid_each(path, domain, syntax.dns1123_subdomain(domain))
    problems += _c_identifier(ident, path)
    return problems


def _c_identifier(ident: str, path: str) -> list[FieldError]:
    import re

    if not ident:
        return [field.required(path)]
    if len(ident) > 32:
        return [field.too_long(path, 32)]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
        return [
            field.invalid(
                path,
                ident,
                "a valid C identifier must start with alphabetic character or '_', followed by "
                "a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
                "'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')",
            )
        ]
    return []


def _spec_immutable(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None, go_type: str
) -> list[FieldError]:
    if old is not None and (obj.get("spec") or {}) != (old.get("spec") or {}):
        return [field.invalid("spec", field.GoValue(f"{go_type}{{...}}"), "field is immutable")]
    return []


def _claim_status(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    status = obj.get("status") or {}
    old_status = (old or {}).get("status") or {}
    problems: list[FieldError] = []

    def consumer(item: Any, where: str) -> list[FieldError]:
        if not isinstance(item, Mapping):
            return []
        return [
            field.required(f"{where}.{key}")
            for key in ("resource", "name", "uid")
            if not item.get(key)
        ]

    reserved = status.get("reservedFor") or []
    problems += _set(
        reserved,
        "status.reservedFor",
        RESERVED_FOR_MAX,
        consumer,
        lambda c: c.get("uid", "") if isinstance(c, Mapping) else c,
    )
    allocation = status.get("allocation")
    if reserved and not allocation:
        problems.append(
            field.forbidden(
                "status.reservedFor", "may not be specified when `allocated` is not set"
            )
        )
    if reserved and (obj.get("metadata") or {}).get("deletionTimestamp"):
        before = {
            c.get("uid") for c in old_status.get("reservedFor") or [] if isinstance(c, Mapping)
        }
        if any(isinstance(c, Mapping) and c.get("uid") not in before for c in reserved):
            problems.append(
                field.forbidden(
                    "status.reservedFor",
                    "new entries may not be added while `deallocationRequested` or "
                    "`deletionTimestamp` are set",
                )
            )
    old_allocation = old_status.get("allocation")
    if allocation and old_allocation and allocation != old_allocation:
        problems.append(
            field.invalid(
                "status.allocation",
                field.GoValue("resource.AllocationResult{...}"),
                "field is immutable",
            )
        )
    elif allocation and not old_allocation:
        names = _request_names(((obj.get("spec") or {}).get("devices")) or {})

        def result(item: Any, where: str) -> list[FieldError]:
            if not isinstance(item, Mapping):
                return []
            found = _request_ref(item.get("request"), f"{where}.request", names)
            found += driver_name(item.get("driver"), f"{where}.driver")
            found += pool_name(item.get("pool"), f"{where}.pool")
            found += _label(item.get("device"), f"{where}.device")
            return found

        devices = allocation.get("devices") or {}
        problems += _set(
            devices.get("results"),
            "status.allocation.devices.results",
            ALLOCATION_RESULTS_MAX,
            result,
        )

        def config(item: Any, where: str) -> list[FieldError]:
            if not isinstance(item, Mapping):
                return []
            source = item.get("source")
            found: list[FieldError] = []
            if not source:
                found.append(field.required(f"{where}.source"))
            elif source not in CONFIG_SOURCES:
                found.append(field.not_supported(f"{where}.source", source, CONFIG_SOURCES))
            return found + _opaque(item, where)

        problems += _set(
            devices.get("config"), "status.allocation.devices.config", 2 * DEVICE_CONFIG_MAX, config
        )
    return problems


def resource_claim(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ResourceClaim: its device requests on create; spec immutable and status rules after."""
    if old is None:
        return device_claim((obj.get("spec") or {}).get("devices"), "spec.devices")
    return _spec_immutable(obj, old, "resource.ResourceClaimSpec") + _claim_status(obj, old)


def resource_claim_template(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[FieldError]:
    """A ResourceClaimTemplate: a claim spec under `spec.spec`; immutable once created."""
    if old is not None:
        return _spec_immutable(obj, old, "resource.ResourceClaimTemplateSpec")
    spec = obj.get("spec") or {}
    problems = meta.template_meta(spec.get("metadata"), "spec.metadata")
    problems += device_claim((spec.get("spec") or {}).get("devices"), "spec.spec.devices")
    return problems


def device_class(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A DeviceClass: selectors that compile, config with an opaque driver configuration."""
    spec = obj.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    problems: list[FieldError] = []
    if old is None or spec.get("selectors") != old_spec.get("selectors"):
        problems += _set(spec.get("selectors"), "spec.selectors", DEVICE_SELECTORS_MAX, selector)
    if old is None or spec.get("config") != old_spec.get("config"):
        problems += _set(spec.get("config"), "spec.config", DEVICE_CONFIG_MAX, _opaque)
    return problems


def _attribute(value: Any, path: str) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return []
    kinds = [
        k
        for k in ("bool", "int", "string", "version", "bools", "ints", "strings", "versions")
        if k in value
    ]
    problems: list[FieldError] = []
    if len(kinds) != 1:
        problems.append(
            field.invalid(path, value if kinds else "", "exactly one value must be specified")
        )
    if "string" in value and len(str(value["string"])) > ATTRIBUTE_VALUE_MAX:
        problems.append(field.too_long(f"{path}.string", ATTRIBUTE_VALUE_MAX))
    if "version" in value:
        text = str(value["version"])
        if dra_cel.parse_semver(text) is None:
            problems.append(
                field.invalid(
                    f"{path}.version",
                    text,
                    "must be a string compatible with semver.org spec 2.0.0",
                )
            )
    return problems


def _qualified_key(name: str, path: str) -> list[FieldError]:
    domain, slash, ident = name.rpartition("/")
    where = f"{path}[{name}]"
    problems: list[FieldError] = []
    if slash:
        problems += _invalid_each(where, domain, syntax.dns1123_subdomain(domain))
    problems += _c_identifier(ident, where)
    return problems


def _device(device: Any, path: str) -> list[FieldError]:
    if not isinstance(device, Mapping):
        return []
    problems = _label(device.get("name"), f"{path}.name")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            field.invalid(
                path,
                total,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for name, value in attributes.items():
        problems += _qualified_key(str(name), f"{path}.attributes")
        problems += _attribute(value, f"{path}.attributes[{name}]")
    for name in capacity:
        problems += _qualified_key(str(name), f"{path}.capacity")

    def consumption(item: Any, where: str) -> list[FieldError]:
        if not isinstance(item, Mapping):
            return []
        found = _label(item.get("counterSet"), f"{where}.counterSet")
        if not item.get("counters"):
            found.append(field.required(f"{where}.counters"))
        return found

    problems += _set(
        device.get("consumesCounters"),
        f"{path}.consumesCounters",
        SLICE_MAX_COUNTER_SETS,
        consumption,
        lambda c: c.get("counterSet", "") if isinstance(c, Mapping) else c,
    )
    return problems


def resource_slice(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ResourceSlice: driver, pool, exactly one node selection, unique devices."""
    spec = obj.get("spec") or {}
    problems = driver_name(spec.get("driver"), "spec.driver")
    pool = spec.get("pool") or {}
    problems += pool_name(pool.get("name"), "spec.pool.name")
    count = pool.get("resourceSliceCount") or 0
    if count <= 0:
        problems.append(
            field.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
        )
    generation = pool.get("generation") or 0
    if generation < 0:
        problems.append(
            field.invalid(
                "spec.pool.generation", generation, "must be greater than or equal to zero"
            )
        )
    if old is not None:
        old_spec = old.get("spec") or {}
        for path, new, before in (
            ("spec.pool.name", pool.get("name"), (old_spec.get("pool") or {}).get("name")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new != before:
                problems.append(field.invalid(path, new, "field is immutable"))
    chosen = []
    if "nodeName" in spec and spec["nodeName"] is not None:
        if spec["nodeName"]:
            chosen.append("`nodeName`")
            problems += _invalid_each(
                "spec.nodeName", spec["nodeName"], syntax.dns1123_subdomain(spec["nodeName"])
            )
        else:
            problems.append(
                field.invalid(
                    "spec.nodeName", "", "must be either unset or set to a non-empty string"
                )
            )
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
        if len(terms) != 1:
            problems.append(
                field.invalid(
                    "spec.nodeSelector.nodeSelectorTerms",
                    terms,
                    "must have exactly one node selector term",
                )
            )
    if spec.get("allNodes") is not None:
        if spec["allNodes"]:
            chosen.append("`allNodes`")
        else:
            problems.append(
                field.invalid("spec.allNodes", False, "must be either unset or set to true")
            )
    if spec.get("perDeviceNodeSelection") is not None:
        if spec["perDeviceNodeSelection"]:
            chosen.append("`perDeviceNodeSelection`")
        else:
            problems.append(
                field.invalid(
                    "spec.perDeviceNodeSelection", False, "must be either unset or set to true"
                )
            )
    which = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        problems.append(field.required("spec", f"exactly one of {which} is required"))
    elif len(chosen) > 1:
        problems.append(
            field.invalid(
                "spec",
                "{" + ", ".join(chosen) + "}",
                f"exactly one of {which} is required, but multiple fields are set",
            )
        )
    devices = spec.get("devices") or []
    advanced = any(
        isinstance(d, Mapping) and (d.get("taints") or d.get("consumesCounters")) for d in devices
    )
    limit = SLICE_MAX_DEVICES_ADVANCED if advanced else SLICE_MAX_DEVICES
    problems += _set(devices, "spec.devices", limit, _device, _name_of)

    def counter_set(item: Any, where: str) -> list[FieldError]:
        if not isinstance(item, Mapping):
            return []
        found = _label(item.get("name"), f"{where}.name")
        if not item.get("counters"):
            found.append(field.required(f"{where}.counters"))
        return found

    problems += _set(
        spec.get("sharedCounters"),
        "spec.sharedCounters",
        SLICE_MAX_COUNTER_SETS,
        counter_set,
        _name_of,
    )
    return problems


def pod_claims(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    """A pod's `resourceClaims` and the `resources.claims` of its containers."""
    problems: list[FieldError] = []
    names: list[str] = []
    for index, claim in enumerate(spec.get("resourceClaims") or []):
        if not isinstance(claim, Mapping):
            continue
        where = f"{path}.resourceClaims[{index}]"
        name = str(claim.get("name") or "")
        if not name:
            problems.append(field.required(f"{where}.name"))
        else:
            problems += _invalid_each(f"{where}.name", name, syntax.dns1123_label(name))
            if name in names:
                problems.append(field.duplicate(where, name))
            names.append(name)
        direct, template = claim.get("resourceClaimName"), claim.get("resourceClaimTemplateName")
        if direct is None and template is None:
            problems.append(
                field.invalid(
                    where,
                    name,
                    "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                )
            )
        elif direct is not None and template is not None:
            problems.append(
                field.invalid(
                    where,
                    name,
                    "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be "
                    "specified",
                )
            )
        else:
            target = str(direct if direct is not None else template)
            which = "resourceClaimName" if direct is not None else "resourceClaimTemplateName"
            problems += _invalid_each(f"{where}.{which}", target, syntax.dns1123_subdomain(target))
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if not isinstance(container, Mapping):
                continue
            claims = (container.get("resources") or {}).get("claims") or []
            used: set[tuple[str, str]] = set()
            for c_index, claim in enumerate(claims):
                if not isinstance(claim, Mapping):
                    continue
                where = f"{path}.{key}[{index}].resources.claims[{c_index}]"
                name = str(claim.get("name") or "")
                if not name:
                    problems.append(field.required(f"{where}.name"))
                    continue
                ident = (name, str(claim.get("request") or ""))
                if ident in used:
                    problems.append(field.duplicate(where, name))
                used.add(ident)
                if name not in names:
                    problems.append(field.not_supported(f"{where}.name", name, names))
    return problems


VALIDATORS = {
    "DeviceClass": device_class,
    "ResourceClaim": resource_claim,
    "ResourceClaimTemplate": resource_claim_template,
    "ResourceSlice": resource_slice,
}
