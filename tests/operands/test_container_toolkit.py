"""The toolkit state: runtime wiring per CRI, CDI and NRI env, install dir."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import ctr, env_of, make_facts, make_policy, mounts_of, render_ds, volumes_of

from gpu_operator.operands import container_toolkit

CTR = "nvidia-container-toolkit-ctr"


def render(runtime: str = "containerd", **sections: Any) -> dict[str, Any]:
    return render_ds(container_toolkit, make_policy(**sections), make_facts(runtime=runtime))


@pytest.mark.parametrize(
    ("runtime", "expected_env", "expected_host_dirs"),
    [
        (
            "containerd",
            {
                "RUNTIME": "containerd",
                "CONTAINERD_RUNTIME_CLASS": "nvidia",
                "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
                "CONTAINERD_CONFIG": "/runtime/config-dir/config.toml",
                "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.toml",
                "RUNTIME_DROP_IN_CONFIG_HOST_PATH": "/etc/containerd/conf.d/99-nvidia.toml",
                "RUNTIME_SOCKET": "/runtime/sock-dir/containerd.sock",
                "CONTAINERD_SOCKET": "/runtime/sock-dir/containerd.sock",
            },
            {
                "containerd-config": "/etc/containerd",
                "containerd-drop-in-config": "/etc/containerd/conf.d",
                "containerd-socket": "/run/containerd",
            },
        ),
        (
            "crio",
            {
                "RUNTIME": "crio",
                "RUNTIME_CONFIG": "/runtime/config-dir/config.toml",
                "CRIO_CONFIG": "/runtime/config-dir/config.toml",
                "CRIO_CONFIG_MODE": "config",
                "RUNTIME_DROP_IN_CONFIG": "/runtime/config-dir.d/99-nvidia.conf",
                "RUNTIME_DROP_IN_CONFIG_HOST_PATH": "/etc/crio/crio.conf.d/99-nvidia.conf",
            },
            {
                "crio-config": "/etc/crio",
                "crio-drop-in-config": "/etc/crio/crio.conf.d",
                "crio-hooks": "/usr/share/containers/oci/hooks.d",
            },
        ),
        (
            "docker",
            {
                "RUNTIME": "docker",
                "RUNTIME_CONFIG": "/runtime/config-dir/daemon.json",
                "DOCKER_CONFIG": "/runtime/config-dir/daemon.json",
                "RUNTIME_SOCKET": "/runtime/sock-dir/docker.sock",
                "DOCKER_SOCKET": "/runtime/sock-dir/docker.sock",
            },
            {"docker-config": "/etc/docker", "docker-socket": "/var/run"},
        ),
    ],
)
def test_runtime_wiring(
    runtime: str, expected_env: dict[str, str], expected_host_dirs: dict[str, str]
) -> None:
    ds = render(runtime)
    env = env_of(ctr(ds, CTR))
    assert {k: env.get(k) for k in expected_env} == expected_env
    volumes = volumes_of(ds)
    assert {k: volumes[k]["hostPath"]["path"] for k in expected_host_dirs} == expected_host_dirs
    # Volumes are named after the runtime, as upstream names them.
    for absent in (f"{runtime}-socket", f"{runtime}-drop-in-config"):
        if absent not in expected_host_dirs:
            assert absent not in volumes
    if runtime != "crio":
        # Upstream's asset default, moved to CRI-O's hooks directory only on CRI-O nodes.
        assert volumes["crio-hooks"]["hostPath"]["path"] == "/run/containers/oci/hooks.d"
    if runtime != "containerd":
        assert "CONTAINERD_RUNTIME_CLASS" not in env


def test_cdi_env() -> None:
    env = env_of(ctr(render(), CTR))
    assert {
        k: env[k]
        for k in ("CDI_ENABLED", "NVIDIA_RUNTIME_SET_AS_DEFAULT", "NVIDIA_CONTAINER_RUNTIME_MODE")
    } == {
        "CDI_ENABLED": "true",
        "NVIDIA_RUNTIME_SET_AS_DEFAULT": "false",
        "NVIDIA_CONTAINER_RUNTIME_MODE": "cdi",
    }
    # Upstream sets CRI-O's config mode with CDI whatever the runtime.
    assert env["CRIO_CONFIG_MODE"] == "config"


def test_no_cdi() -> None:
    env = env_of(ctr(render(cdi={"enabled": False}), CTR))
    assert "CDI_ENABLED" not in env
    assert "NVIDIA_CONTAINER_RUNTIME_MODE" not in env
    assert env_of(ctr(render("crio", cdi={"enabled": False}), CTR))["CRIO_CONFIG_MODE"] == "hook"


def test_nri_mounts_only_the_nri_socket() -> None:
    ds = render(cdi={"nriPluginEnabled": True})
    env = env_of(ctr(ds, CTR))
    assert env["ENABLE_NRI_PLUGIN"] == "true"
    assert env["NRI_SOCKET"] == "/runtime/nri-sock-dir/nri.sock"
    assert volumes_of(ds)["nri-socket"]["hostPath"]["path"] == "/var/run/nri"
    assert not {"containerd-config", "containerd-socket", "containerd-drop-in-config"} & set(
        volumes_of(ds)
    )
    assert "RUNTIME_CONFIG" not in env


def test_user_config_paths_are_mounted_from_the_host() -> None:
    user_env = [
        {
            "name": "CONTAINERD_CONFIG",
            "value": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        },
        {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"},
        {"name": "RUNTIME_CONFIG_SOURCE", "value": "command,file=/etc/containerd/config.toml"},
    ]
    ds = render(toolkit={"env": user_env})
    env = env_of(ctr(ds, CTR))
    assert env["CONTAINERD_CONFIG"] == "/runtime/config-dir/config.toml"
    assert (
        volumes_of(ds)["containerd-config"]["hostPath"]["path"]
        == "/var/lib/rancher/k3s/agent/etc/containerd"
    )
    assert volumes_of(ds)["containerd-socket"]["hostPath"]["path"] == "/run/k3s/containerd"
    assert env["RUNTIME_CONFIG_SOURCE"] == "command,file=/host/etc/containerd/config.toml"


def test_custom_install_dir() -> None:
    ds = render(toolkit={"installDir": "/opt/nvidia"})
    assert env_of(ctr(ds, CTR))["ROOT"] == "/opt/nvidia"
    assert volumes_of(ds)["toolkit-install-dir"]["hostPath"]["path"] == "/opt/nvidia"
    assert mounts_of(ctr(ds, CTR))["/opt/nvidia"] == "toolkit-install-dir"
    assert env_of(ctr(render(), CTR))["ROOT"] == "/usr/local/nvidia"


def test_waits_for_the_driver_and_has_its_entrypoint() -> None:
    objects = container_toolkit.render(make_policy(), make_facts())
    ds = objects[-1]
    init = ctr(ds, "driver-validation")
    assert (env_of(init)["COMPONENT"], env_of(init)["WITH_WAIT"]) == ("driver", "true")
    entrypoint = next(o for o in objects if o["kind"] == "ConfigMap")
    assert entrypoint["metadata"]["name"] == "nvidia-container-toolkit-entrypoint"
    assert "driver-ready" in entrypoint["data"]["entrypoint.sh"]


def test_nri_management_namespaces_pass_through_and_nothing_runtime_specific_is_set() -> None:
    user_env = [{"name": "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES", "value": "monitoring,diag"}]
    ds = render(cdi={"nriPluginEnabled": True}, toolkit={"env": user_env})
    main = ctr(ds, CTR)
    env = env_of(main)
    assert env["NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES"] == "monitoring,diag"
    assert "CONTAINERD_RUNTIME_CLASS" not in env
    assert "RUNTIME_DROP_IN_CONFIG" not in env
    # The operator's own namespace is always allowed: the plugin reads it from NRI_NAMESPACE.
    [nri_namespace] = [e for e in main["env"] if e["name"] == "NRI_NAMESPACE"]
    assert nri_namespace["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # Without NRI the operator adds no namespace list of its own.
    assert "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES" not in env_of(ctr(render(), CTR))
