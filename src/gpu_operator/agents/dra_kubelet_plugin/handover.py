"""Never both on one GPU: what the plugin may publish while a device plugin is (or was) on the node.

Pure. When a node moves from the device plugin to DRA (the `nvidia.com/dra-kubelet-plugin=true`
label), the operator takes its device plugin off the node and the DRA plugin's DaemonSet starts
there: two rollouts that race. Publishing slices while the kubelet still offers `nvidia.com/gpu`
from the device plugin would let the scheduler hand the same GPU out twice (once as an extended
resource, once as a claim). So the plugin publishes nothing while the node's allocatable for a
device plugin's NVIDIA resource (`nvidia.com/gpu`, `nvidia.com/mig-*`, a renamed shared
resource) is above zero, and once it is zero it still leaves out every GPU (and its MIG devices)
that a running container holds through the device plugin (the kubelet's pod-resources API),
publishing each as soon as it is free. The reason is logged and kept for `explain node`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_operator.agents.dra_kubelet_plugin.inventory import Inventory

# A device plugin's NVIDIA resources: nvidia.com/gpu, nvidia.com/mig-1g.5gb,
# nvidia.com/gpu.shared (renamed replicas)... but not our own DRA driver's names.
RESOURCE_PREFIX = "nvidia.com/"


@dataclass(frozen=True)
class Held:
    """One device a container holds through a device plugin (from the pod-resources API)."""

    resource: str
    device_id: str
    pod: str  # namespace/name


@dataclass(frozen=True)
class Handover:
    """What to publish: nothing (`blocked` says why) or every device except `withheld`."""

    blocked: str | None
    withheld: frozenset[str]  # device names and UUIDs left out
    reasons: tuple[str, ...]  # one line per withheld GPU

    @property
    def summary(self) -> str | None:
        if self.blocked is not None:
            return self.blocked
        if self.reasons:
            return "; ".join(self.reasons)
        return None


def device_plugin_resources(allocatable: Mapping[str, str]) -> dict[str, int]:
    """The node's device-plugin NVIDIA resources with a non-zero allocatable."""
    found: dict[str, int] = {}
    for name, value in allocatable.items():
        if not name.startswith(RESOURCE_PREFIX):
            continue
        try:
            count = int(str(value))
        except ValueError:
            continue
        if count > 0:
            found[name] = count
    return found


def _base_id(device_id: str) -> str:
    """A shared replica's ID (`GPU-...::3`) names its GPU (`GPU-...`)."""
    return device_id.split("::", 1)[0]


def decide(
    node: str, allocatable: Mapping[str, str], held: Iterable[Held], inv: Inventory
) -> Handover:
    serving = device_plugin_resources(allocatable)
    if serving:
        listed = ", ".join(f"{name}={count}" for name, count in sorted(serving.items()))
        return Handover(
            blocked=(
                f"publishing no devices: the kubelet on node {node} still offers {listed} from "
                "a device plugin; the same GPUs would be handed out twice. Take the device "
                "plugin off the node (nvidia.com/gpu.deploy.device-plugin=false, which the "
                "operator writes on a nvidia.com/dra-kubelet-plugin=true node) and the slices "
                "follow"
            ),
            withheld=frozenset(),
            reasons=(),
        )
    by_id: dict[str, list[Held]] = {}
    for h in held:
        if h.resource.startswith(RESOURCE_PREFIX):
            by_id.setdefault(_base_id(h.device_id), []).append(h)
    withheld: set[str] = set()
    reasons: list[str] = []
    for gpu in inv.gpus:
        ids = {gpu.uuid, str(gpu.index)} | {m.uuid for m in gpu.migs}
        ids |= {f"{gpu.index}:{i}" for i in range(len(gpu.migs))}  # index strategy for MIG
        holders = sorted({h.pod for i in ids for h in by_id.get(i, ())})
        if not holders:
            continue
        withheld |= {gpu.uuid} | {m.uuid for m in gpu.migs}
        reasons.append(
            f"GPU {gpu.index} ({gpu.uuid}) withheld: held through the device plugin by "
            f"{', '.join(holders)}"
        )
    return Handover(blocked=None, withheld=frozenset(withheld), reasons=tuple(reasons))
