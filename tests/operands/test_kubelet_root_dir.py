"""`hostPaths.kubeletRootDir` moves every kubelet path an operand mounts from the host; the paths
inside the containers stay where the agents look for them."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from operand_helpers import ctr, find, make_facts, make_policy, volumes_of

from gpu_operator.operands import (
    dcgm_exporter,
    device_plugin,
    kata_device_plugin,
    sandbox_device_plugin,
)

# (state, volume, container, path under the kubelet root, path inside the container)
KUBELET_MOUNTS: list[tuple[ModuleType, str, str, str, str]] = [
    (device_plugin, "device-plugin", "nvidia-device-plugin", "device-plugins",
     "/var/lib/kubelet/device-plugins"),
    (dcgm_exporter, "pod-gpu-resources", "nvidia-dcgm-exporter", "pod-resources",
     "/var/lib/kubelet/pod-resources"),
    (sandbox_device_plugin, "device-plugin", sandbox_device_plugin.CTR, "device-plugins",
     "/var/lib/kubelet/device-plugins"),
    (kata_device_plugin, "device-plugin", kata_device_plugin.CTR, "device-plugins",
     "/var/lib/kubelet/device-plugins"),
]  # fmt: skip


def _daemonset(module: ModuleType, **host_paths: str) -> dict[str, Any]:
    policy = make_policy(hostPaths=host_paths) if host_paths else make_policy()
    return find(module.render(policy, make_facts()), "DaemonSet")


@pytest.mark.parametrize(
    ("module", "volume", "container", "under", "inside"),
    KUBELET_MOUNTS,
    ids=[m[0].NAME for m in KUBELET_MOUNTS],
)
@pytest.mark.parametrize(
    ("root", "expected"),
    [
        (None, "/var/lib/kubelet"),
        ("/var/lib/k0s/kubelet", "/var/lib/k0s/kubelet"),
        ("/var/snap/microk8s/common/var/lib/kubelet/", "/var/snap/microk8s/common/var/lib/kubelet"),
        # Upstream reads an empty value as unset.
        ("", "/var/lib/kubelet"),
    ],
)
def test_kubelet_root_dir_moves_the_host_side_only(
    module: ModuleType,
    volume: str,
    container: str,
    under: str,
    inside: str,
    root: str | None,
    expected: str,
) -> None:
    ds = _daemonset(module, **({} if root is None else {"kubeletRootDir": root}))
    assert volumes_of(ds)[volume]["hostPath"]["path"] == f"{expected}/{under}"
    paths = {m["name"]: m["mountPath"] for m in ctr(ds, container)["volumeMounts"]}
    assert paths[volume] == inside
