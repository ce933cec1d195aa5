"""Render one collection as dcgm-exporter renders it: Prometheus text format 0.0.4.

Per counter (in DCGM field id order, as upstream's template ranges over its counters): `# HELP`,
`# TYPE`, then one sample per entity in GPU order, labelled
`gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID][, Hostname]`, then the
`label`-type counters and then the attributes (`err_code`/`err_msg` on XID errors; `container`,
`namespace`, `pod` when a pod holds the device), each group sorted by name as Go templates sort
map keys. Integers print as `%d`, doubles as Go's `%f` (six decimals), strings raw. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_operator.agents.dcgm_exporter import counters as counters_mod
from gpu_operator.agents.dcgm_exporter import fields, xid
from gpu_operator.agents.dcgm_exporter.readers import Entity, NodeReading, Value

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"


@dataclass(frozen=True)
class PodRef:
    """Who holds a device: the pod-resources `List` entry, and the replica for shared GPUs."""

    namespace: str
    pod: str
    container: str
    replica: str | None = None


@dataclass(frozen=True)
class Options:
    """The label spellings and switches of upstream's flags."""

    hostname: str = ""  # empty: no host label (`--no-hostname`)
    hostname_label: str = "Hostname"  # `hostname` from dcgm-exporter 4.6 on
    old_namespace: bool = False  # `--use-old-namespace`: uuid, pod_name, pod_namespace, ...
    replace_blanks_in_model_name: bool = False
    virtual_gpus: bool = False  # KUBERNETES_VIRTUAL_GPUS: add `vgpu=<replica>`


def escape(value: str) -> str:
    """A label value as the text format wants it (backslash, quote and newline escaped)."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(kind: fields.Kind, value: Value) -> str:
    if kind is fields.Kind.DOUBLE:
        return f"{float(value):f}"
    if kind is fields.Kind.INT:
        return str(int(value))
    return str(value)


def _identity(entity: Entity, options: Options) -> str:
    model = entity.model
    if options.replace_blanks_in_model_name:
        model = "-".join(model.split())
    uuid_label = "uuid" if options.old_namespace else "UUID"
    parts = [
        f'gpu="{entity.gpu}"',
        f'{uuid_label}="{escape(entity.uuid)}"',
        f'pci_bus_id="{escape(entity.pci_bus_id)}"',
        f'device="nvidia{entity.gpu}"',
        f'modelName="{escape(model)}"',
    ]
    if entity.mig_profile is not None:
        parts.append(f'GPU_I_PROFILE="{escape(entity.mig_profile)}"')
        parts.append(f'GPU_I_ID="{entity.gpu_instance_id}"')
    if options.hostname:
        parts.append(f'{options.hostname_label}="{escape(options.hostname)}"')
    return ",".join(parts)


def _pod_attributes(holder: PodRef, options: Options) -> dict[str, str]:
    if options.old_namespace:
        attrs = {
            "container_name": holder.container,
            "pod_namespace": holder.namespace,
            "pod_name": holder.pod,
        }
    else:
        attrs = {"container": holder.container, "namespace": holder.namespace, "pod": holder.pod}
    if options.virtual_gpus and holder.replica is not None:
        attrs["vgpu"] = holder.replica
    return attrs


def _labels(pairs: Mapping[str, str]) -> str:
    return "".join(f',{k}="{escape(v)}"' for k, v in sorted(pairs.items()))


def render(
    counter_set: counters_mod.CounterSet,
    node: NodeReading,
    holders: Mapping[str, Sequence[PodRef]] | None = None,
    options: Options | None = None,
) -> str:
    """The `/metrics` body for one collection; `holders` maps entity keys to pods."""
    options = options or Options()
    holders = holders or {}
    label_counters = counter_set.labels
    prefixes: list[str] = []
    for reading in node.readings:
        extra = {
            c.name: format_value(c.field.kind, reading.values[c.name])
            for c in label_counters
            if c.name in reading.values
        }
        prefixes.append(_identity(reading.entity, options) + _labels(extra))
    pods = [
        [_pod_attributes(h, options) for h in holders.get(r.entity.key, ())] or [{}]
        for r in node.readings
    ]
    out: list[str] = []
    for counter in counter_set.metrics:
        name = counter.name
        kind = counter.field.kind
        lines: list[str] = []
        for reading, prefix, holder_attrs in zip(node.readings, prefixes, pods, strict=True):
            value = reading.values.get(name)
            if value is None:
                continue
            text = format_value(kind, value)
            own: dict[str, str] = {}
            if name == XID_FIELD:
                own = {"err_code": str(int(value)), "err_msg": xid.message(int(value))}
            for attrs in holder_attrs:
                lines.append(f"{name}{{{prefix}{_labels({**own, **attrs})}}} {text}")
        if lines:
            out.append(f"# HELP {name} {_escape_help(counter.help)}")
            out.append(f"# TYPE {name} {counter.prom_type}")
            out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
