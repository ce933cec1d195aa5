"""The driver state: image tags, modes, sidecars, configs, probes and the config digest."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import (
    ctr,
    env_of,
    find,
    make_facts,
    make_policy,
    mounts_of,
    names,
    pod,
    volumes_of,
)

from gpu_operator.operands import common, driver

DRIVER = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}


def render(facts: Any = None, **driver_fields: Any) -> list[dict[str, Any]]:
    sections = {k: v for k, v in driver_fields.items() if k in ("gds", "gdrcopy")}
    fields = {k: v for k, v in driver_fields.items() if k not in sections}
    return driver.render(
        make_policy(driver={**DRIVER, **fields}, **sections), facts or make_facts()
    )


def the_ds(**driver_fields: Any) -> dict[str, Any]:
    return find(render(**driver_fields), "DaemonSet")


def test_default_daemonset() -> None:
    objects = render()
    assert [o["kind"] for o in objects][-1] == "DaemonSet"
    ds = find(objects, "DaemonSet", "nvidia-driver-daemonset")
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert names(ds, "initContainers") == ["k8s-driver-manager"]
    assert names(ds) == ["nvidia-driver-ctr"]
    main = ctr(ds, "nvidia-driver-ctr")
    assert main["image"] == "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"
    assert env_of(main)["KERNEL_MODULE_TYPE"] == "auto"
    assert "OPEN_KERNEL_MODULES_ENABLED" not in env_of(main)
    assert pod(ds)["hostPID"] is True
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"
    manager = ctr(ds, "k8s-driver-manager")
    assert manager["image"] == make_facts().operator_env["DRIVER_MANAGER_IMAGE"]
    assert "GPU_DIRECT_RDMA_ENABLED" not in env_of(manager)


def test_startup_probe_defaults_and_overrides() -> None:
    main = ctr(the_ds(), "nvidia-driver-ctr")
    probe = main["startupProbe"]
    assert {
        k: probe[k]
        for k in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "failureThreshold")
    } == {
        "initialDelaySeconds": 60,
        "timeoutSeconds": 60,
        "periodSeconds": 10,
        "failureThreshold": 120,
    }
    assert "livenessProbe" not in main
    main = ctr(
        the_ds(startupProbe={"failureThreshold": 200}, livenessProbe={"periodSeconds": 30}),
        "nvidia-driver-ctr",
    )
    assert main["startupProbe"]["failureThreshold"] == 200
    assert main["startupProbe"]["initialDelaySeconds"] == 60
    assert main["livenessProbe"]["periodSeconds"] == 30


def test_open_kernel_modules_flag() -> None:
    env = env_of(ctr(the_ds(useOpenKernelModules=True), "nvidia-driver-ctr"))
    assert (env["KERNEL_MODULE_TYPE"], env["OPEN_KERNEL_MODULES_ENABLED"]) == ("open", "true")
    assert (
        env_of(ctr(the_ds(kernelModuleType="proprietary"), "nvidia-driver-ctr"))[
            "KERNEL_MODULE_TYPE"
        ]
        == "proprietary"
    )


def test_manager_spec_env_comes_last() -> None:
    manager = {
        "repository": "r",
        "image": "k8s-driver-manager",
        "version": "v1",
        "env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}],
    }
    env = env_of(ctr(the_ds(manager=manager), "k8s-driver-manager"))
    assert env["ENABLE_AUTO_DRAIN"] == "true"
    assert ctr(the_ds(manager=manager), "k8s-driver-manager")["image"] == "r/k8s-driver-manager:v1"


def test_image_pinned_by_digest_gets_no_os_tag() -> None:
    ds = the_ds(version="sha256:0123")
    assert ctr(ds, "nvidia-driver-ctr")["image"] == "nvcr.io/nvidia/driver@sha256:0123"


def test_rhel_tags_with_the_major_version_only() -> None:
    ds = find(render(make_facts(os_id="rhel", os_version_id="9.4")), "DaemonSet")
    assert ctr(ds, "nvidia-driver-ctr")["image"].endswith("-rhel9")


def test_rdma_adds_peermem_and_flags() -> None:
    ds = the_ds(rdma={"enabled": True})
    assert names(ds) == ["nvidia-driver-ctr", "nvidia-peermem-ctr"]
    assert ctr(ds, "nvidia-peermem-ctr")["image"] == ctr(ds, "nvidia-driver-ctr")["image"]
    assert env_of(ctr(ds, "nvidia-driver-ctr"))["GPU_DIRECT_RDMA_ENABLED"] == "true"
    assert env_of(ctr(ds, "k8s-driver-manager"))["GPU_DIRECT_RDMA_ENABLED"] == "true"
    assert (
        volumes_of(ds)["mlnx-ofed-usr-src"]["hostPath"]["path"] == "/run/mellanox/drivers/usr/src"
    )


def test_host_mofed_uses_the_host_sources() -> None:
    ds = the_ds(rdma={"enabled": True, "useHostMofed": True})
    assert env_of(ctr(ds, "nvidia-driver-ctr"))["USE_HOST_MOFED"] == "true"
    assert env_of(ctr(ds, "k8s-driver-manager"))["USE_HOST_MOFED"] == "true"
    assert volumes_of(ds)["mlnx-ofed-usr-src"]["hostPath"]["path"] == "/usr/src"


def test_gds_and_gdrcopy_sidecars() -> None:
    sidecar = {"repository": "nvcr.io/nvidia/cloud-native", "version": "2.26.6", "enabled": True}
    ds = the_ds(gds={**sidecar, "image": "nvidia-fs"}, gdrcopy={**sidecar, "image": "gdrdrv"})
    assert names(ds) == ["nvidia-driver-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr"]
    assert (
        ctr(ds, "nvidia-fs-ctr")["image"]
        == "nvcr.io/nvidia/cloud-native/nvidia-fs:2.26.6-ubuntu22.04"
    )
    assert ctr(ds, "nvidia-gdrcopy-ctr")["image"].endswith("gdrdrv:2.26.6-ubuntu22.04")
    env = env_of(ctr(ds, "nvidia-driver-ctr"))
    assert (env["GDS_ENABLED"], env["GDRCOPY_ENABLED"]) == ("true", "true")


def test_precompiled_one_daemonset_per_kernel() -> None:
    facts = make_facts(kernels=("6.8.0-1017-aws", "5.15.0-105-generic", "6.8.0-1017-aws"))
    objects = render(facts, usePrecompiled=True)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert [d["metadata"]["name"] for d in daemonsets] == [
        "nvidia-driver-daemonset-5.15.0-105-generic-ubuntu22.04",
        "nvidia-driver-daemonset-6.8.0-1017-aws-ubuntu22.04",
    ]
    ds = daemonsets[0]
    assert pod(ds)["nodeSelector"] == {
        "nvidia.com/gpu.deploy.driver": "true",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-105-generic",
    }
    assert (
        ctr(ds, "nvidia-driver-ctr")["image"]
        == "nvcr.io/nvidia/driver:580.95.05-5.15.0-105-generic-ubuntu22.04"
    )
    assert ds["metadata"]["labels"]["nvidia.com/precompiled"] == "true"
    assert ctr(ds, "nvidia-driver-ctr")["startupProbe"]["initialDelaySeconds"] == 5
    # As upstream: every per-kernel DaemonSet selects app=nvidia-driver-daemonset (selectors
    # overlap; pods belong to the DaemonSet named in their controller reference).
    for d in daemonsets:
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert d["spec"]["selector"] == {"matchLabels": {"app": "nvidia-driver-daemonset"}}
        assert labels == {
            "app": "nvidia-driver-daemonset",
            "app.kubernetes.io/component": "nvidia-driver",
            "nvidia.com/precompiled": "true",
        }


def test_precompiled_without_known_kernels_renders_only_rbac() -> None:
    assert [o["kind"] for o in render(usePrecompiled=True) if o["kind"] == "DaemonSet"] == []


def test_precompiled_rejects_gds() -> None:
    with pytest.raises(common.RenderError, match="precompiled"):
        render(make_facts(kernels=("6.8.0",)), usePrecompiled=True, gds={"enabled": True})


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("5.15.0-105-generic", "5.15.0-105-generic"),
        ("5.14.0-427.13.1.el9_4.x86_64", "5.14.0-427.13.1.el9.4"),
        ("6.1.0-aarch64_64k", "6.1.0"),
        ("6.1.0-28-arm64", "6.1.0-28-arm64"),
        ("6.1.0-1-aarch64", "6.1.0-1"),
        ("4.18.0-513.5.1.el8_9.X86_64", "4.18.0-513.5.1.el8.9.x86.64"),
    ],
)
def test_sanitize_kernel(kernel: str, expected: str) -> None:
    assert driver.sanitize_kernel(kernel) == expected


def test_licensing_topology_and_secret_env() -> None:
    ds = the_ds(
        licensingConfig={"secretName": "licensing", "nlsEnabled": True},
        virtualTopology={"config": "topology"},
        secretEnv="driver-secrets",
    )
    main = ctr(ds, "nvidia-driver-ctr")
    mounts = mounts_of(main)
    assert mounts["/drivers/gridd.conf"] == "licensing-config"
    assert mounts["/drivers/ClientConfigToken/client_configuration_token.tok"] == "licensing-config"
    assert mounts["/etc/nvidia/nvidia-topologyd.conf"] == "topology-config"
    assert volumes_of(ds)["licensing-config"]["secret"]["secretName"] == "licensing"
    assert main["envFrom"] == [{"secretRef": {"name": "driver-secrets"}}]


def test_licensing_from_a_config_map_without_nls() -> None:
    ds = the_ds(licensingConfig={"configMapName": "lic"})
    assert volumes_of(ds)["licensing-config"]["configMap"] == {
        "name": "lic",
        "items": [{"key": "gridd.conf", "path": "gridd.conf"}],
    }


def test_config_maps_are_mounted_key_by_key() -> None:
    facts = make_facts(config_map_keys={"kmod": ("nvidia.conf",), "repo": ("a.list", "b.list")})
    ds = find(
        render(facts, kernelModuleConfig={"name": "kmod"}, repoConfig={"configMapName": "repo"}),
        "DaemonSet",
    )
    mounts = mounts_of(ctr(ds, "nvidia-driver-ctr"))
    assert mounts["/drivers/nvidia.conf"] == "kernel-module-configs"
    assert mounts["/etc/apt/sources.list.d/a.list"] == "repo-config"
    assert mounts["/etc/apt/sources.list.d/b.list"] == "repo-config"


def test_a_missing_config_map_is_a_clear_error() -> None:
    with pytest.raises(
        common.RenderError, match=r"kernelModuleConfig.name: ConfigMap 'kmod' not found"
    ):
        render(kernelModuleConfig={"name": "kmod"})


def test_config_digest_is_on_manager_and_driver_and_tracks_install_fields() -> None:
    ds = the_ds()
    digest = env_of(ctr(ds, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]
    assert digest is not None
    assert digest.isdigit()  # upstream's decimal FNV-1a
    assert env_of(ctr(ds, "k8s-driver-manager"))["DRIVER_CONFIG_DIGEST"] == digest
    assert env_of(ctr(the_ds(), "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"] == digest
    unchanged = the_ds(
        resources={"limits": {"memory": "1Gi"}},
        startupProbe={"periodSeconds": 5},
        livenessProbe={"periodSeconds": 5},
    )
    assert env_of(ctr(unchanged, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"] == digest
    for changed in (
        the_ds(version="580.95.06"),
        the_ds(kernelModuleType="open"),
        the_ds(env=[{"name": "X", "value": "1"}]),
        the_ds(rdma={"enabled": True}),
        # As upstream: the driver manager's image and env are part of the install state.
        the_ds(manager={"repository": "r", "image": "m", "version": "v2"}),
        the_ds(manager={"env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}]}),
    ):
        assert env_of(ctr(changed, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"] != digest


def test_crd_mode_disables_the_state() -> None:
    assert driver.enabled(make_policy(driver={"useNvidiaDriverCRD": True}), make_facts()) is False
    assert driver.enabled(make_policy(), make_facts()) is True


def test_secret_env_reaches_the_gds_and_gdrcopy_sidecars_too() -> None:
    ds = the_ds(secretEnv="driver-secrets", gds={"enabled": True}, gdrcopy={"enabled": True})
    expected = [{"secretRef": {"name": "driver-secrets"}}]
    for name in ("nvidia-driver-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr"):
        assert ctr(ds, name)["envFrom"] == expected, name
    assert "envFrom" not in ctr(the_ds(gds={"enabled": True}), "nvidia-fs-ctr")
