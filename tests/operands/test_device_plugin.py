"""Device plugin, GFD and MPS daemon: config-manager wiring, CDI env, MPS root."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from operand_helpers import (
    ctr,
    env_of,
    make_facts,
    make_policy,
    mounts_of,
    names,
    pod,
    render_ds,
    volumes_of,
)

from gpu_operator.operands import device_plugin, gpu_feature_discovery, mps_control_daemon

PLUGIN = "nvidia-device-plugin"


def render(module: ModuleType = device_plugin, **sections: Any) -> dict[str, Any]:
    return render_ds(module, make_policy(**sections))


@pytest.mark.parametrize(
    ("module", "main", "signalled"),
    [
        (device_plugin, PLUGIN, "nvidia-device-plugin"),
        (gpu_feature_discovery, "gpu-feature-discovery", "gpu-feature-discovery"),
        (mps_control_daemon, "mps-control-daemon-ctr", "/usr/bin/mps-control-daemon"),
    ],
)
def test_config_manager_only_with_a_named_config(
    module: ModuleType, main: str, signalled: str
) -> None:
    plain = render(module)
    assert "config-manager" not in names(plain)
    assert "config-manager-init" not in names(plain, "initContainers")
    assert "CONFIG_FILE" not in env_of(ctr(plain, main))

    ds = render(module, devicePlugin={"config": {"name": "time-slicing", "default": "any"}})
    assert names(ds)[-1] == "config-manager"
    assert names(ds, "initContainers")[-1] == "config-manager-init"
    assert env_of(ctr(ds, main))["CONFIG_FILE"] == "/config/config.yaml"
    for name, oneshot in (("config-manager-init", "true"), ("config-manager", "false")):
        env = env_of(ctr(ds, name))
        assert (env["ONESHOT"], env["DEFAULT_CONFIG"], env["FALLBACK_STRATEGIES"]) == (
            oneshot,
            "any",
            "empty",
        )
        assert env["PROCESS_TO_SIGNAL"] == signalled
        assert ctr(ds, name)["image"] == ctr(ds, main)["image"]
    assert volumes_of(ds)["available-configs"]["configMap"] == {"name": "time-slicing"}
    assert volumes_of(ds)["config"] == {"name": "config", "emptyDir": {}}
    assert mounts_of(ctr(ds, main))["/config"] == "config"
    # hostPID already shares PIDs with the host; otherwise the pod shares one namespace.
    assert pod(ds).get("shareProcessNamespace") is (None if pod(ds).get("hostPID") else True)


def test_cdi_env() -> None:
    env = env_of(ctr(render(toolkit={"installDir": "/opt/nv"}), PLUGIN))
    assert env["CDI_ENABLED"] == "true"
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-annotations,cdi-cri"
    assert env["CDI_ANNOTATION_PREFIX"] == "cdi.k8s.io/"
    assert env["NVIDIA_CDI_HOOK_PATH"] == "/opt/nv/toolkit/nvidia-cdi-hook"
    plain = env_of(ctr(render(cdi={"enabled": False}), PLUGIN))
    assert plain["DEVICE_LIST_STRATEGY"] == "envvar"
    assert "CDI_ENABLED" not in plain


def test_gds_and_gdrcopy_flags() -> None:
    env = env_of(ctr(render(gds={"enabled": True}, gdrcopy={"enabled": True}), PLUGIN))
    assert (env["GDS_ENABLED"], env["MOFED_ENABLED"], env["GDRCOPY_ENABLED"]) == (
        "true",
        "true",
        "true",
    )
    assert "GDS_ENABLED" not in env_of(ctr(render(), PLUGIN))


@pytest.mark.parametrize(
    ("mps", "root"), [(None, "/run/nvidia/mps"), ({"root": "/var/mps/"}, "/var/mps")]
)
def test_mps_root(mps: dict[str, str] | None, root: str) -> None:
    plugin = render(devicePlugin={"mps": mps} if mps else {})
    assert env_of(ctr(plugin, PLUGIN))["MPS_ROOT"] == (mps["root"] if mps else root)
    for ds in (plugin, render(mps_control_daemon, devicePlugin={"mps": mps} if mps else {})):
        assert volumes_of(ds)["mps-root"]["hostPath"]["path"] == root
        assert volumes_of(ds)["mps-shm"]["hostPath"]["path"] == f"{root}/shm"


def test_mps_daemon_runs_from_the_plugin_image_on_mps_capable_nodes() -> None:
    plugin = {"repository": "nvcr.io/nvidia", "image": "k8s-device-plugin", "version": "v0.18.0"}
    ds = render(mps_control_daemon, devicePlugin=plugin)
    assert ctr(ds, "mps-control-daemon-ctr")["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"
    assert (
        ctr(ds, "mps-control-daemon-mounts")["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"
    )
    assert names(ds, "initContainers") == ["toolkit-validation", "mps-control-daemon-mounts"]
    assert pod(ds)["nodeSelector"]["nvidia.com/mps.capable"] == "true"


def test_kubelet_root_dir_moves_the_device_plugin_socket_dir() -> None:
    ds = render(hostPaths={"kubeletRootDir": "/var/lib/k0s/kubelet"})
    assert (
        volumes_of(ds)["device-plugin"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/device-plugins"
    )


def test_gfd_rbac_allows_node_features() -> None:
    objects = gpu_feature_discovery.render(make_policy(), make_facts())
    role = next(o for o in objects if o["kind"] == "Role")
    nfd = next(r for r in role["rules"] if r["apiGroups"] == ["nfd.k8s-sigs.io"])
    assert "create" in nfd["verbs"]
