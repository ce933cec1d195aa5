"""The node status as Prometheus gauges (pure: a status in, metric families out).

Names, help texts and the `node` label are upstream's (nvidia-validator `COMPONENT=metrics`):
`gpu_operator_node_metrics_ready_ts_seconds`,
`gpu_operator_node_{driver,toolkit,plugin,cuda}_ready`,
`gpu_operator_node_driver_validation` (+ `_last_success_ts_seconds`),
`gpu_operator_node_device_plugin_devices_total` (+ `..._validation_last_success_ts_seconds`) and
`gpu_operator_nvidia_pci_devices_total`. Our addition: `gpu_operator_node_validation_ready` with a
`component` label for every validation marker, so the markers upstream has no gauge for (mofed,
vfio-pci, vgpu-manager, ...) show up too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Upstream's four barrier gauges: component -> marker file stem.
BARRIERS = {"driver": "driver", "toolkit": "toolkit", "plugin": "plugin", "cuda": "cuda"}
_BARRIER_HELP = {
    "driver": "1 if the driver synchronization barrier of the the local node is open, 0 otherwise",
    "toolkit": "1 if the container-toolkit synchronization barrier on the local node is open, "
    "0 otherwise",
    "plugin": "1 if the device plugin synchronization barrier on the local is open, 0 otherwise",
    "cuda": "1 if cuda synchronization barrier on the local node is open, 0 otherwise",
}
# Markers the validator writes (`<component>-ready`); always reported, 0 until they appear.
KNOWN_COMPONENTS = ("driver", "toolkit", "cuda", "plugin", "mofed", "nvidia-fs", "gdrcopy")
MARKER_SUFFIX = "-ready"


@dataclass
class NodeStatus:
    """What the pollers last saw; -1 means "could not tell", as upstream reports it."""

    node: str
    started_at: float
    markers: frozenset[str] = frozenset()
    driver_ok: bool = False
    driver_last_success: float = 0.0
    devices: int = -1
    plugin_last_success: float = 0.0
    pci_devices: int = -1
    extra_components: tuple[str, ...] = field(default=())


def components(file_names: Iterable[str]) -> frozenset[str]:
    """The components whose marker is among `file_names` (`driver-ready` -> `driver`)."""
    return frozenset(n.removesuffix(MARKER_SUFFIX) for n in file_names if n.endswith(MARKER_SUFFIX))


def _gauge(name: str, help_text: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["node"])
    family.add_metric([node], value)
    return family


def families(status: NodeStatus) -> list[GaugeMetricFamily]:
    node = status.node
    out = [
        _gauge(
            "gpu_operator_node_metrics_ready_ts_seconds",
            "timestamp (in seconds) of the launch time of the GPU Operator node metrics Pod",
            node,
            int(status.started_at),
        )
    ]
    for component, stem in BARRIERS.items():
        out.append(
            _gauge(
                f"gpu_operator_node_{component}_ready",
                _BARRIER_HELP[component],
                node,
                1 if stem in status.markers else 0,
            )
        )
    out += [
        _gauge(
            "gpu_operator_node_driver_validation",
            "1 if the driver validation test passed on the local node, 0 otherwise",
            node,
            1 if status.driver_ok else 0,
        ),
        _gauge(
            "gpu_operator_node_driver_validation_last_success_ts_seconds",
            "timestamp (in seconds) of the last successful driver test validation",
            node,
            int(status.driver_last_success),
        ),
        _gauge(
            "gpu_operator_node_device_plugin_devices_total",
            "number of GPU devices exposed by the DevicePlugin on the local node. "
            "-1 if failing to inspect the node spec.",
            node,
            status.devices,
        ),
        _gauge(
            "gpu_operator_node_device_plugin_validation_last_success_ts_seconds",
            "timestamp (in seconds) of the last time GPU devices were found on the local node spec",
            node,
            int(status.plugin_last_success),
        ),
        _gauge(
            "gpu_operator_nvidia_pci_devices_total",
            "number of NVIDIA devices found in the node. -1 if failing to count",
            node,
            status.pci_devices,
        ),
    ]
    ready = GaugeMetricFamily(
        "gpu_operator_node_validation_ready",
        "1 if the validation marker /run/nvidia/validations/<component>-ready exists, 0 otherwise",
        labels=["node", "component"],
    )
    for component in sorted({*KNOWN_COMPONENTS, *status.markers, *status.extra_components}):
        ready.add_metric([node, component], 1 if component in status.markers else 0)
    out.append(ready)
    return out


class _StatusCollector(Collector):
    def __init__(self, status: NodeStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from families(self.status)


def render(status: NodeStatus) -> bytes:
    """The `/metrics` body (Prometheus text format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(status))
    return generate_latest(registry)
