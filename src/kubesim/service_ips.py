"""Service ClusterIP and node-port allocation, as the API server's Service storage does it.

The real allocators are part of the apiserver, not a controller: a Service gets its ClusterIP (and
node ports) in the create call itself, a requested IP or port that is taken or outside the range is
refused with 422, and deleting the Service frees them. kubesim derives "taken" from the stored
Services on every allocation, so a delete releases everything at once with no bookkeeping.
"""

from __future__ import annotations

import ipaddress
import random
from typing import TYPE_CHECKING, Any

from kubesim import errors
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from kubesim.store import Store

SERVICE_KEY = ("", "services")
SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/12")
# The real server reserves the first address of the range for the `kubernetes` Service.
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE_PORT_RANGE = (30000, 32767)
SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")
_NODE_PORT_TYPES = ("NodePort", "LoadBalancer")
_rng = random.Random()


def _static_band(size: int, floor: int, ceiling: int, divisor: int) -> int:
    """How many addresses/ports at the bottom of a range dynamic allocation avoids.

    Upstream keeps a low band for users who pick fixed values: clamp(size / divisor, floor,
    ceiling), 256 addresses of a /12 and 86 ports of 30000-32767.
    """
    return max(floor, min(ceiling, size // divisor))


def admit(store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Fill in and check a Service's allocated fields on create and update."""
    if rt.key != SERVICE_KEY or rt.from_crd:
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    name = obj["metadata"].get("name", "")
    namespace = obj["metadata"].get("namespace", "")
    svc_type = spec.get("type") or "ClusterIP"
    if svc_type not in SERVICE_TYPES:
        supported = ", ".join(f'"{t}"' for t in SERVICE_TYPES)
        raise _invalid(
            name, "spec.type", f'Unsupported value: "{svc_type}": supported values: {supported}'
        )
    spec["type"] = svc_type
    old_spec = (old or {}).get("spec") or {}
    others = [
        s.obj
        for s in store.scan(SERVICE_KEY)
        if (s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"]) != (namespace, name)
    ]
    if svc_type == "ExternalName":
        if not spec.get("externalName"):
            raise _invalid(name, "spec.externalName", "Required value")
        for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            spec.pop(field, None)
        spec.pop("internalTrafficPolicy", None)
        for port in spec.get("ports") or []:
            port.pop("nodePort", None)
    else:
        _cluster_ip(name, spec, old_spec, others)
        spec.setdefault("internalTrafficPolicy", "Cluster")
        _node_ports(name, spec, old_spec, others)
    if old is None:
        obj["status"] = {"loadBalancer": {}}


def _cluster_ip(
    name: str, spec: dict[str, Any], old_spec: dict[str, Any], others: list[dict[str, Any]]
) -> None:
    old_ip = old_spec.get("clusterIP")
    requested = spec.get("clusterIP") or next(iter(spec.get("clusterIPs") or []), "")
    if old_ip and old_spec.get("type") != "ExternalName":
        # An update that leaves the allocated fields out keeps them (kubectl replace does this).
        if not requested:
            requested = old_ip
            for field in ("ipFamilies", "ipFamilyPolicy"):
                if field not in spec and field in old_spec:
                    spec[field] = old_spec[field]
        elif requested != old_ip:
            raise _invalid(
                name,
                "spec.clusterIPs[0]",
                f'Invalid value: "{requested}": may not change once set',
            )
        spec["clusterIP"] = old_ip
        spec["clusterIPs"] = list(old_spec.get("clusterIPs") or [old_ip])
    elif requested == "None":
        if spec["type"] in _NODE_PORT_TYPES:
            raise _invalid(
                name,
                "spec.clusterIPs[0]",
                f"Invalid value: \"None\": may not be 'None' for {spec['type']} services",
            )
        spec["clusterIP"] = "None"
        spec["clusterIPs"] = ["None"]
    else:
        spec["clusterIP"] = _allocate_ip(name, requested, others)
        spec["clusterIPs"] = [spec["clusterIP"]]
    spec.setdefault("ipFamilies", ["IPv4"])
    if spec["ipFamilies"] != ["IPv4"]:
        raise _invalid(
            name,
            "spec.ipFamilies",
            f"Invalid value: {_go_list(spec['ipFamilies'])}: this cluster is single-stack IPv4",
        )
    # A headless Service without a selector asks for every family the cluster has.
    headless_no_selector = spec["clusterIP"] == "None" and not spec.get("selector")
    spec.setdefault("ipFamilyPolicy", "RequireDualStack" if headless_no_selector else "SingleStack")


def _allocate_ip(name: str, requested: str, others: list[dict[str, Any]]) -> str:
    taken = {
        ip
        for other in others
        for ip in ((other.get("spec") or {}).get("clusterIPs") or [])
        if ip and ip != "None"
    }
    if requested:
        try:
            address = ipaddress.ip_address(requested)
        except ValueError as exc:
            raise _invalid(
                name,
                "spec.clusterIPs[0]",
                f'Invalid value: "{requested}": must be a valid IP address, '
                "(e.g. 10.9.8.7 or 2001:db8::ffff)",
            ) from exc
        usable = (
            address in SERVICE_CIDR
            and address != SERVICE_CIDR.network_address
            and address != SERVICE_CIDR.broadcast_address
        )
        if not usable:
            raise _invalid(
                name,
                "spec.clusterIPs",
                f'Invalid value: []string{{"{requested}"}}: failed to allocate IP {requested}: '
                f"the provided IP ({requested}) is not in the valid range. "
                f"The range of valid IPs is {SERVICE_CIDR}",
            )
        if requested in taken:
            raise _invalid(
                name,
                "spec.clusterIPs",
                f'Invalid value: []string{{"{requested}"}}: failed to allocate IP {requested}: '
                "provided IP is already allocated",
            )
        return requested
    first = int(SERVICE_CIDR.network_address) + 1
    last = int(SERVICE_CIDR.broadcast_address) - 1
    dynamic_first = first + _static_band(last - first + 1, 16, 256, 16)
    value = _pick(dynamic_first, last, first, {int(ipaddress.ip_address(ip)) for ip in taken})
    if value is None:
        raise errors.ApiError(
            500, "Internal error occurred: failed to allocate a serviceIP: range is full"
        )
    return str(ipaddress.IPv4Address(value))


def _node_ports(
    name: str, spec: dict[str, Any], old_spec: dict[str, Any], others: list[dict[str, Any]]
) -> None:
    ports = spec.get("ports") or []
    needs = spec["type"] in _NODE_PORT_TYPES
    if spec["type"] == "LoadBalancer":
        spec.setdefault("allocateLoadBalancerNodePorts", True)
        needs = bool(spec["allocateLoadBalancerNodePorts"])
    old_needs = old_spec.get("type") in _NODE_PORT_TYPES
    if not needs:
        for index, port in enumerate(ports):
            if port.get("nodePort") and spec["type"] == "ClusterIP":
                if old_needs:
                    # Leaving NodePort for ClusterIP gives the node ports back.
                    port.pop("nodePort")
                    continue
                raise _invalid(
                    name,
                    f"spec.ports[{index}].nodePort",
                    "Forbidden: may not be used when `type` is 'ClusterIP'",
                )
        if spec["type"] != "LoadBalancer":
            spec.pop("externalTrafficPolicy", None)
            spec.pop("healthCheckNodePort", None)
            return
    spec.setdefault("externalTrafficPolicy", "Cluster")
    taken: set[int] = set()
    for other in others:
        other_spec = other.get("spec") or {}
        taken.update(int(p["nodePort"]) for p in other_spec.get("ports") or [] if p.get("nodePort"))
        if other_spec.get("healthCheckNodePort"):
            taken.add(int(other_spec["healthCheckNodePort"]))
    old_ports = {
        (p.get("port"), p.get("protocol", "TCP")): p.get("nodePort")
        for p in old_spec.get("ports") or []
        if p.get("nodePort")
    }
    low, high = NODE_PORT_RANGE
    dynamic_low = low + _static_band(high - low + 1, 16, 128, 32)
    own: set[int] = set()
    if needs:
        for index, port in enumerate(ports):
            wanted = port.get("nodePort") or old_ports.get(
                (port.get("port"), port.get("protocol", "TCP"))
            )
            if wanted:
                _check_port(name, f"spec.ports[{index}].nodePort", int(wanted), taken | own)
                port["nodePort"] = int(wanted)
            else:
                picked = _pick(dynamic_low, high, low, taken | own)
                if picked is None:
                    raise errors.ApiError(
                        500, "Internal error occurred: failed to allocate a nodePort: range is full"
                    )
                port["nodePort"] = picked
            own.add(int(port["nodePort"]))
    local = spec.get("externalTrafficPolicy") == "Local" and spec["type"] == "LoadBalancer"
    if local:
        wanted = spec.get("healthCheckNodePort") or old_spec.get("healthCheckNodePort")
        if wanted:
            _check_port(name, "spec.healthCheckNodePort", int(wanted), taken | own)
            spec["healthCheckNodePort"] = int(wanted)
        else:
            spec["healthCheckNodePort"] = _pick(dynamic_low, high, low, taken | own)
    else:
        spec.pop("healthCheckNodePort", None)


def _check_port(name: str, field: str, port: int, taken: set[int]) -> None:
    low, high = NODE_PORT_RANGE
    if not low <= port <= high:
        raise _invalid(
            name,
            field,
            f"Invalid value: {port}: provided port is not in the valid range. "
            f"The range of valid ports is {low}-{high}",
        )
    if port in taken:
        raise _invalid(name, field, f"Invalid value: {port}: provided port is already allocated")


def _pick(preferred_low: int, high: int, low: int, taken: set[int]) -> int | None:
    """A random free value, from the upper (dynamic) band first, then anywhere in the range."""
    for band_low in (preferred_low, low):
        size = high - band_low + 1
        if size <= 0:
            continue
        for _ in range(32):
            candidate = band_low + _rng.randrange(size)
            if candidate not in taken:
                return candidate
        for candidate in range(band_low, high + 1):
            if candidate not in taken:
                return candidate
    return None


def _go_list(values: list[Any]) -> str:
    inner = ", ".join(f'"{v}"' for v in values)
    return f"[]string{{{inner}}}"


_CAUSES = {
    "Required value": "FieldValueRequired",
    "Forbidden": "FieldValueForbidden",
    "Unsupported value": "FieldValueNotSupported",
}


def _invalid(name: str, field: str, message: str) -> errors.ApiError:
    """The 422 for one Service field (core kinds are named without a group in messages)."""
    reason = _CAUSES.get(message.split(":", 1)[0], "FieldValueInvalid")
    return errors.ApiError(
        422,
        f'Service "{name}" is invalid: {field}: {message}',
        reason="Invalid",
        details={
            "name": name,
            "kind": "Service",
            "causes": [{"reason": reason, "message": message, "field": field}],
        },
    )


def ensure_kubernetes_service(store: Store, host: str, port: int) -> None:
    """Create `default/kubernetes` (10.96.0.1:443) and its Endpoints/EndpointSlice to the server.

    The real API server keeps these objects itself; they point in-cluster clients at it.
    """
    address = host if _is_ip(host) and host != "0.0.0.0" else "127.0.0.1"
    registry = store.registry
    if store.peek(SERVICE_KEY, "default", "kubernetes") is None:
        store.insert(
            registry.resolve("services"),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": "kubernetes",
                    "namespace": "default",
                    "labels": {"component": "apiserver", "provider": "kubernetes"},
                },
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": KUBERNETES_SERVICE_IP,
                    "sessionAffinity": "None",
                    "ports": [
                        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}
                    ],
                },
            },
        )
    if store.peek(("", "endpoints"), "default", "kubernetes") is None:
        store.insert(
            registry.resolve("endpoints"),
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {
                    "name": "kubernetes",
                    "namespace": "default",
                    # The apiserver's own Endpoints are not mirrored into a second slice.
                    "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"},
                },
                "subsets": [
                    {
                        "addresses": [{"ip": address}],
                        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                    }
                ],
            },
        )
    if store.peek(("discovery.k8s.io", "endpointslices"), "default", "kubernetes") is None:
        store.insert(
            registry.resolve("endpointslices.discovery.k8s.io"),
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kubernetes",
                    "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
