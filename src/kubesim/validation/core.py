"""Validation of core/v1 kinds: pod specs (also inside templates), Services, ConfigMaps, Secrets,
Nodes and Namespaces, with the server's field paths and wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubesim.validation import field, meta, quantity, resource, syntax
from kubesim.validation.field import FieldError

DATA_LIMIT = 1024 * 1024
RESTART_POLICIES = ("Always", "OnFailure", "Never")
DNS_POLICIES = ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
PROTOCOLS = ("SCTP", "TCP", "UDP")
HOST_PATH_TYPES = (
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
)
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")
SESSION_AFFINITIES = ("ClientIP", "None")
TRAFFIC_POLICIES = ("Cluster", "Local")
IP_FAMILY_POLICIES = ("PreferDualStack", "RequireDualStack", "SingleStack")
VOLUME_SOURCES = (
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
)
PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
# Resources whose requests may not exceed their limits; others (extended resources) must match.
_NATIVE_PREFIXES = ("kubernetes.io/", "requests.")
_NATIVE = {"cpu", "memory", "ephemeral-storage", "storage"}
_SECRET_REQUIRED_KEYS = {
    "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
    "kubernetes.io/dockercfg": (".dockercfg",),
    "kubernetes.io/tls": ("tls.crt", "tls.key"),
    "kubernetes.io/basic-auth": (),
    "kubernetes.io/ssh-auth": ("ssh-privatekey",),
}


def _enum(value: Any, path: str, allowed: tuple[str, ...]) -> list[FieldError]:
    if value is None or value in allowed:
        return []
    return [field.not_supported(path, value, allowed)]


def _non_negative(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int) and value < 0:
        return [field.invalid(path, value, "must be greater than or equal to 0")]
    return []


def pod_spec(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    """A PodSpec, for pods (`spec`) and templates (`spec.template.spec`)."""
    problems: list[FieldError] = []
    volumes, volume_problems = _volumes(spec.get("volumes") or [], f"{path}.volumes")
    problems.extend(volume_problems)
    containers = spec.get("containers") or []
    if not containers:
        problems.append(field.required(f"{path}.containers"))
    names: set[str] = set()
    host_network = bool(spec.get("hostNetwork"))
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if isinstance(container, Mapping):
                problems.extend(
                    _container(container, f"{path}.{key}[{index}]", names, volumes, host_network)
                )
    problems.extend(_enum(spec.get("restartPolicy"), f"{path}.restartPolicy", RESTART_POLICIES))
    problems.extend(_enum(spec.get("dnsPolicy"), f"{path}.dnsPolicy", DNS_POLICIES))
    problems.extend(meta.labels(spec.get("nodeSelector"), f"{path}.nodeSelector"))
    problems.extend(
        _non_negative(
            spec.get("terminationGracePeriodSeconds"), f"{path}.terminationGracePeriodSeconds"
        )
    )
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline < 1:
        problems.append(
            field.invalid(
                f"{path}.activeDeadlineSeconds",
                deadline,
                "must be between 1 and 2147483647, inclusive",
            )
        )
    account = spec.get("serviceAccountName")
    if isinstance(account, str) and account:
        problems.extend(
            field.invalid(f"{path}.serviceAccountName", account, p)
            for p in syntax.dns1123_subdomain(account)
        )
    for index, toleration in enumerate(spec.get("tolerations") or []):
        problems.extend(_toleration(toleration, f"{path}.tolerations[{index}]"))
    problems.extend(resource.pod_claims(spec, path))
    return problems


def _container(
    container: Mapping[str, Any],
    path: str,
    names: set[str],
    volumes: set[str],
    host_network: bool,
) -> list[FieldError]:
    problems: list[FieldError] = []
    name = container.get("name") or ""
    if not name:
        problems.append(field.required(f"{path}.name"))
    else:
        problems.extend(field.invalid(f"{path}.name", name, p) for p in syntax.dns1123_label(name))
        if name in names:
            problems.append(field.duplicate(f"{path}.name", name))
        names.add(name)
    if not container.get("image"):
        problems.append(field.required(f"{path}.image"))
    problems.extend(
        _enum(container.get("imagePullPolicy"), f"{path}.imagePullPolicy", PULL_POLICIES)
    )
    problems.extend(
        _enum(
            container.get("terminationMessagePolicy"),
            f"{path}.terminationMessagePolicy",
            MESSAGE_POLICIES,
        )
    )
    problems.extend(_ports(container.get("ports") or [], f"{path}.ports", host_network))
    problems.extend(_env(container.get("env") or [], f"{path}.env"))
    problems.extend(_mounts(container.get("volumeMounts") or [], f"{path}.volumeMounts", volumes))
    problems.extend(resources(container.get("resources") or {}, f"{path}.resources"))
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if isinstance(probe, Mapping):
            problems.extend(_probe(probe, f"{path}.{probe_name}", probe_name))
    return problems


def _ports(ports: list[Any], path: str, host_network: bool) -> list[FieldError]:
    problems: list[FieldError] = []
    names: set[str] = set()
    for index, port in enumerate(ports):
        if not isinstance(port, Mapping):
            continue
        where = f"{path}[{index}]"
        name = port.get("name")
        if name:
            problems.extend(field.invalid(f"{where}.name", name, p) for p in syntax.port_name(name))
            if name in names:
                problems.append(field.duplicate(f"{where}.name", name))
            names.add(name)
        number = port.get("containerPort")
        if not number:
            problems.append(field.required(f"{where}.containerPort"))
        else:
            problems.extend(
                field.invalid(f"{where}.containerPort", number, p)
                for p in syntax.port_number(number)
            )
        host = port.get("hostPort")
        if host:
            problems.extend(
                field.invalid(f"{where}.hostPort", host, p) for p in syntax.port_number(host)
            )
            if host_network and number and host != number:
                problems.append(
                    field.invalid(
                        f"{where}.hostPort",
                        host,
                        "must match `containerPort` when `hostNetwork` is true",
                    )
                )
        problems.extend(_enum(port.get("protocol"), f"{where}.protocol", PROTOCOLS))
    return problems


def _env(env: list[Any], path: str) -> list[FieldError]:
    problems: list[FieldError] = []
    for index, var in enumerate(env):
        if not isinstance(var, Mapping):
            continue
        where = f"{path}[{index}]"
        name = var.get("name") or ""
        if not name:
            problems.append(field.required(f"{where}.name"))
        else:
            problems.extend(
                field.invalid(f"{where}.name", name, p) for p in syntax.env_var_name(name)
            )
        source = var.get("valueFrom")
        if isinstance(source, Mapping):
            if var.get("value"):
                problems.append(
                    field.invalid(
                        f"{where}.valueFrom", "", "may not be specified when `value` is not empty"
                    )
                )
            chosen = [
                k
                for k in (
                    "fieldRef",
                    "resourceFieldRef",
                    "configMapKeyRef",
                    "secretKeyRef",
                    "fileKeyRef",
                )
                if source.get(k) is not None
            ]
            if not chosen:
                problems.append(
                    field.invalid(
                        f"{where}.valueFrom",
                        "",
                        "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` "
                        "or `secretKeyRef`",
                    )
                )
            elif len(chosen) > 1:
                problems.append(
                    field.invalid(
                        f"{where}.valueFrom",
                        "",
                        "may not have more than one field specified at a time",
                    )
                )
            ref = source.get("fieldRef")
            if isinstance(ref, Mapping) and not ref.get("fieldPath"):
                problems.append(field.required(f"{where}.valueFrom.fieldRef.fieldPath"))
            for key in ("configMapKeyRef", "secretKeyRef"):
                selector = source.get(key)
                if isinstance(selector, Mapping) and not selector.get("key"):
                    problems.append(field.required(f"{where}.valueFrom.{key}.key"))
    return problems


def _mounts(mounts: list[Any], path: str, volumes: set[str]) -> list[FieldError]:
    problems: list[FieldError] = []
    paths: set[str] = set()
    for index, mount in enumerate(mounts):
        if not isinstance(mount, Mapping):
            continue
        where = f"{path}[{index}]"
        name = mount.get("name") or ""
        if not name:
            problems.append(field.required(f"{where}.name"))
        elif name not in volumes:
            problems.append(FieldError("FieldValueNotFound", f"{where}.name", name))
        mount_path = mount.get("mountPath") or ""
        if not mount_path:
            problems.append(field.required(f"{where}.mountPath"))
        elif mount_path in paths:
            problems.append(field.invalid(f"{where}.mountPath", mount_path, "must be unique"))
        paths.add(mount_path)
    return problems


def _volumes(volumes: list[Any], path: str) -> tuple[set[str], list[FieldError]]:
    problems: list[FieldError] = []
    names: set[str] = set()
    for index, volume in enumerate(volumes):
        if not isinstance(volume, Mapping):
            continue
        where = f"{path}[{index}]"
        name = volume.get("name") or ""
        if not name:
            problems.append(field.required(f"{where}.name"))
        else:
            problems.extend(
                field.invalid(f"{where}.name", name, p) for p in syntax.dns1123_label(name)
            )
            if name in names:
                problems.append(field.duplicate(f"{where}.name", name))
            names.add(name)
        sources = [key for key in VOLUME_SOURCES if volume.get(key) is not None]
        if not sources:
            problems.append(field.required(where, "must specify a volume type"))
        elif len(sources) > 1:
            problems.append(
                field.forbidden(f"{where}.{sources[1]}", "may not specify more than 1 volume type")
            )
        host_path = volume.get("hostPath")
        if isinstance(host_path, Mapping):
            if not host_path.get("path"):
                problems.append(field.required(f"{where}.hostPath.path"))
            problems.extend(_enum(host_path.get("type"), f"{where}.hostPath.type", HOST_PATH_TYPES))
        config_map = volume.get("configMap")
        if isinstance(config_map, Mapping) and not config_map.get("name"):
            problems.append(field.required(f"{where}.configMap.name"))
        secret = volume.get("secret")
        if isinstance(secret, Mapping) and not secret.get("secretName"):
            problems.append(field.required(f"{where}.secret.secretName"))
        for source in ("configMap", "secret"):
            spec = volume.get(source)
            mode = spec.get("defaultMode") if isinstance(spec, Mapping) else None
            if isinstance(mode, int) and not 0 <= mode <= 0o777:
                problems.append(
                    field.invalid(
                        f"{where}.{source}.defaultMode",
                        mode,
                        "must be a number between 0 and 0777 (octal), both inclusive",
                    )
                )
    return names, problems


def _probe(probe: Mapping[str, Any], path: str, which: str) -> list[FieldError]:
    problems: list[FieldError] = []
    handlers = [h for h in PROBE_HANDLERS if probe.get(h) is not None]
    if not handlers:
        problems.append(field.required(path, "must specify a handler type"))
    elif len(handlers) > 1:
        problems.append(
            field.forbidden(f"{path}.{handlers[1]}", "may not specify more than 1 handler type")
        )
    for key in (
        "initialDelaySeconds",
        "timeoutSeconds",
        "periodSeconds",
        "successThreshold",
        "failureThreshold",
    ):
        problems.extend(_non_negative(probe.get(key), f"{path}.{key}"))
    success = probe.get("successThreshold")
    if which != "readinessProbe" and isinstance(success, int) and success != 1:
        problems.append(field.invalid(f"{path}.successThreshold", success, "must be 1"))
    http_get = probe.get("httpGet")
    if isinstance(http_get, Mapping):
        problems.extend(_handler_port(http_get.get("port"), f"{path}.httpGet.port"))
        scheme = http_get.get("scheme")
        problems.extend(_enum(scheme, f"{path}.httpGet.scheme", ("HTTP", "HTTPS")))
    tcp = probe.get("tcpSocket")
    if isinstance(tcp, Mapping):
        problems.extend(_handler_port(tcp.get("port"), f"{path}.tcpSocket.port"))
    command = (
        (probe.get("exec") or {}).get("command") if isinstance(probe.get("exec"), Mapping) else None
    )
    if probe.get("exec") is not None and not command:
        problems.append(field.required(f"{path}.exec.command"))
    return problems


def _handler_port(port: Any, path: str) -> list[FieldError]:
    if port is None or port == "":
        return [field.required(path)]
    if isinstance(port, int):
        return [field.invalid(path, port, p) for p in syntax.port_number(port)]
    return [field.invalid(path, port, p) for p in syntax.port_name(str(port))]


def resources(spec: Mapping[str, Any], path: str) -> list[FieldError]:
    """Resource names, non-negative amounts, and requests within limits."""
    problems: list[FieldError] = []
    limits = spec.get("limits") or {}
    requests = spec.get("requests") or {}
    parsed: dict[str, dict[str, Any]] = {"limits": {}, "requests": {}}
    for which, values in (("limits", limits), ("requests", requests)):
        for name, amount in values.items():
            where = f"{path}.{which}[{name}]"
            problems.extend(field.invalid(where, name, p) for p in syntax.qualified_name(name))
            try:
                number = quantity.value(str(amount))
            except quantity.QuantityError:
                continue
            if number < 0:
                problems.append(
                    field.invalid(where, str(amount), "must be greater than or equal to 0")
                )
            parsed[which][name] = number
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is None:
            if not _native(name) and name not in limits:
                problems.append(
                    field.required(
                        f"{path}.limits", "Limit must be set for non overcommitable resources"
                    )
                )
            continue
        if _native(name):
            if request > limit:
                problems.append(
                    field.invalid(
                        f"{path}.requests",
                        str(requests[name]),
                        f"must be less than or equal to {name} limit of {limits[name]}",
                    )
                )
        elif request != limit:
            problems.append(
                field.invalid(
                    f"{path}.requests",
                    str(requests[name]),
                    f"must be equal to {name} limit of {limits[name]}",
                )
            )
    return problems


def _native(name: str) -> bool:
    # Extended resources (a domain other than kubernetes.io) cannot be overcommitted.
    return name in _NATIVE or "/" not in name or name.startswith(_NATIVE_PREFIXES)


def _toleration(toleration: Any, path: str) -> list[FieldError]:
    problems: list[FieldError] = []
    if not isinstance(toleration, Mapping):
        return problems
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key:
        problems.extend(field.invalid(f"{path}.key", key, p) for p in syntax.qualified_name(key))
    elif operator != "Exists":
        problems.append(
            field.invalid(
                f"{path}.operator",
                operator,
                "operator must be Exists when `key` is empty, which means "
                '"match all values and all keys"',
            )
        )
    if operator == "Exists" and toleration.get("value"):
        problems.append(
            field.invalid(
                f"{path}.operator",
                toleration.get("value"),
                "value must be empty when `operator` is 'Exists'",
            )
        )
    problems.extend(_enum(toleration.get("operator"), f"{path}.operator", TOLERATION_OPERATORS))
    effect = toleration.get("effect")
    if effect:
        problems.extend(_enum(effect, f"{path}.effect", TAINT_EFFECTS))
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and effect != "NoExecute":
        problems.append(
            field.invalid(
                f"{path}.effect",
                effect or "",
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            )
        )
    return problems


# ----- kinds ------------------------------------------------------------------------------------


def pod(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Pod."""
    return pod_spec(obj.get("spec") or {}, "spec")


def pod_template_spec(
    template: Any, path: str, restart_policies: tuple[str, ...] | None
) -> list[FieldError]:
    """A workload's pod template: its labels, its pod spec and the restart policies allowed."""
    if not isinstance(template, Mapping):
        return [field.required(path)]
    problems = meta.template_meta(template.get("metadata"), f"{path}.metadata")
    spec = template.get("spec") or {}
    problems.extend(pod_spec(spec, f"{path}.spec"))
    policy = spec.get("restartPolicy")
    if restart_policies and policy not in restart_policies and policy in RESTART_POLICIES:
        problems.append(field.not_supported(f"{path}.spec.restartPolicy", policy, restart_policies))
    return problems


def service(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Service: type, ports, selector and affinity."""
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    kind = spec.get("type", "ClusterIP")
    problems.extend(_enum(spec.get("type"), "spec.type", SERVICE_TYPES))
    problems.extend(_enum(spec.get("sessionAffinity"), "spec.sessionAffinity", SESSION_AFFINITIES))
    problems.extend(
        _enum(spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy", TRAFFIC_POLICIES)
    )
    problems.extend(
        _enum(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy", TRAFFIC_POLICIES)
    )
    problems.extend(_enum(spec.get("ipFamilyPolicy"), "spec.ipFamilyPolicy", IP_FAMILY_POLICIES))
    ports = spec.get("ports") or []
    if kind == "ExternalName":
        name = spec.get("externalName") or ""
        if not name:
            problems.append(field.required("spec.externalName"))
    elif not ports and spec.get("clusterIP") != "None":
        problems.append(field.required("spec.ports"))
    names: set[str] = set()
    seen: set[tuple[Any, Any]] = set()
    for index, port in enumerate(ports):
        if not isinstance(port, Mapping):
            continue
        where = f"spec.ports[{index}]"
        name = port.get("name") or ""
        if len(ports) > 1 and not name:
            problems.append(field.required(f"{where}.name"))
        if name:
            problems.extend(
                field.invalid(f"{where}.name", name, p) for p in syntax.dns1123_label(name)
            )
            if name in names:
                problems.append(field.duplicate(f"{where}.name", name))
            names.add(name)
        number = port.get("port")
        if not number:
            problems.append(field.required(f"{where}.port"))
        else:
            problems.extend(
                field.invalid(f"{where}.port", number, p) for p in syntax.port_number(number)
            )
        problems.extend(_enum(port.get("protocol"), f"{where}.protocol", PROTOCOLS))
        target = port.get("targetPort")
        if isinstance(target, int):
            problems.extend(
                field.invalid(f"{where}.targetPort", target, p) for p in syntax.port_number(target)
            )
        elif isinstance(target, str) and target:
            problems.extend(
                field.invalid(f"{where}.targetPort", target, p) for p in syntax.port_name(target)
            )
        node_port = port.get("nodePort")
        if node_port and kind not in ("NodePort", "LoadBalancer"):
            problems.append(
                field.forbidden(f"{where}.nodePort", f"may not be used when `type` is '{kind}'")
            )
        key = (number, port.get("protocol", "TCP"))
        if number and key in seen:
            problems.append(
                field.duplicate(
                    where, field.GoValue(f'core.ServicePort{{Port:{number}, Protocol:"{key[1]}"}}')
                )
            )
        seen.add(key)
    problems.extend(meta.labels(spec.get("selector"), "spec.selector"))
    return problems


def config_map(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A ConfigMap: key syntax, no key in both maps, total size, immutability."""
    problems: list[FieldError] = []
    data = obj.get("data") or {}
    binary = obj.get("binaryData") or {}
    total = 0
    for key, value in data.items():
        bad = syntax.config_key(key)
        if bad:
            problems.extend(field.invalid(f"data[{key}]", key, p) for p in bad)
        total += len(str(value).encode())
    for key, value in binary.items():
        bad = syntax.config_key(key)
        if bad:
            problems.extend(field.invalid(f"binaryData[{key}]", key, p) for p in bad)
        if key in data:
            problems.append(
                field.invalid(f"data[{key}]", key, "duplicate of key present in binaryData")
            )
        total += len(str(value)) * 3 // 4
    if total > DATA_LIMIT:
        problems.append(field.too_long("", DATA_LIMIT))
    problems.extend(_immutable_data(obj, old))
    return problems


def _immutable_data(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    if old is None or not old.get("immutable"):
        return []
    problems = []
    if not obj.get("immutable"):
        problems.append(field.forbidden("immutable", "field is immutable when `immutable` is set"))
    for key in ("data", "binaryData", "stringData"):
        if (obj.get(key) or {}) != (old.get(key) or {}):
            problems.append(field.forbidden(key, "field is immutable when `immutable` is set"))
    return problems


def secret(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Secret: key syntax, size, keys its type requires, immutable type and data."""
    problems: list[FieldError] = []
    data = obj.get("data") or {}
    total = 0
    for key, value in data.items():
        bad = syntax.config_key(key)
        if bad:
            problems.extend(field.invalid(f"data[{key}]", key, p) for p in bad)
        total += len(str(value)) * 3 // 4
    if total > DATA_LIMIT:
        problems.append(field.too_long("data", DATA_LIMIT))
    kind = obj.get("type") or "Opaque"
    for key in _SECRET_REQUIRED_KEYS.get(kind, ()):
        if key not in data:
            problems.append(field.required(f"data[{key}]"))
    if old is not None and (old.get("type") or "Opaque") != kind:
        problems.append(field.invalid("type", kind, "field is immutable"))
    problems.extend(_immutable_data(obj, old))
    return problems


def node(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Node: taint keys, effects and uniqueness."""
    problems: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        if not isinstance(taint, Mapping):
            continue
        where = f"spec.taints[{index}]"
        key = taint.get("key") or ""
        if not key:
            problems.append(field.required(f"{where}.key"))
        else:
            problems.extend(
                field.invalid(f"{where}.key", key, p) for p in syntax.qualified_name(key)
            )
        effect = taint.get("effect") or ""
        if not effect:
            problems.append(field.required(f"{where}.effect"))
        else:
            problems.extend(_enum(effect, f"{where}.effect", TAINT_EFFECTS))
        value = taint.get("value")
        if value:
            problems.extend(
                field.invalid(f"{where}.value", value, p) for p in syntax.label_value(value)
            )
        if (key, effect) in seen:
            problems.append(
                field.duplicate(
                    where,
                    field.GoValue(
                        f"core.Taint{{Key:{key!r}, Effect:{effect!r}}}".replace("'", '"')
                    ),
                )
            )
        seen.add((key, effect))
    return problems


def persistent_volume_claim(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None
) -> list[FieldError]:
    """A PersistentVolumeClaim: access modes and a storage request."""
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    if not spec.get("accessModes"):
        problems.append(field.required("spec.accessModes", "at least 1 access mode is required"))
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage is None:
        problems.append(field.required("spec.resources[storage]"))
    return problems


VALIDATORS = {
    "Pod": pod,
    "Service": service,
    "ConfigMap": config_map,
    "Secret": secret,
    "Node": node,
    "PersistentVolumeClaim": persistent_volume_claim,
}
