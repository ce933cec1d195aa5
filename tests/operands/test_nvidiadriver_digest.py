"""DRIVER_CONFIG_DIGEST as NVIDIA's operator (26.x) computes it, so a swap between the two
operators neither restarts driver pods through drains nor reinstalls drivers.

Upstream facts used here: the value NVIDIA's operator wrote on its ClusterPolicy driver DaemonSet
(../shared/reference/upstream-objects-26.7, skipped where absent), and the values its own unit
tests expect for NVIDIADriver DaemonSets (internal/state/testdata/golden at v26.7.0), with the
render data those tests use: driver image `nvcr.io/nvidia/driver:525.85.03-ubuntu22.04`, manager
image `nvcr.io/nvidia/cloud-native/k8s-driver-manager:devel`, driver type `gpu`, no kernel
module type, no host root, and for some a fixed set of three extra volumes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from operand_helpers import ctr, env_of, find, make_facts, make_policy

from gpu_operator.api import ClusterPolicy, NVIDIADriverSpec
from gpu_operator.operands import driver, driver_digest, nvidiadriver, nvidiadriver_digest
from gpu_operator.operands.facts import ClusterFacts

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "upstream-objects-26.7"
IMAGE = "nvcr.io/nvidia/driver:525.85.03-ubuntu22.04"
MANAGER = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:devel"
GDS = "nvcr.io/nvidia/cloud-native/nvidia-fs:2.16.1"
GDRCOPY = "nvcr.io/nvidia/cloud-native/gdrdrv:v2.4.1"
PRECOMPILED = "nvcr.io/nvidia/driver:535-5.4.0-150-generic-ubuntu22.04"

# The three extra volumes upstream's tests add (a ConfigMap file, two host paths).
SAMPLE = nvidiadriver_digest.PoolConfigs(
    volumes=(
        {"name": "test-cm", "configMap": {"name": "test-cm"}},
        {"name": "test-host-path", "hostPath": {"path": "/opt/config/test-host-path"}},
        {"name": "test-host-path-ro", "hostPath": {"path": "/opt/config/test-host-path-ro"}},
    ),
    mounts=(
        {"name": "test-cm", "readOnly": True, "mountPath": "/opt/config/test-file",
         "subPath": "test-file"},
        {"name": "test-host-path", "mountPath": "/opt/config/test-host-path"},
        {"name": "test-host-path-ro", "mountPath": "/opt/config/test-host-path-ro",
         "readOnly": True},
    ),
)  # fmt: skip


def reference(kind_file: str, name: str) -> dict[str, Any]:
    path = REFERENCE / kind_file
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    found: dict[str, Any] = next(
        d for d in yaml.safe_load_all(path.read_text()) if d and d["metadata"]["name"] == name
    )
    return found


def pod(image: str = IMAGE, *sidecars: tuple[str, str]) -> dict[str, Any]:
    return {
        "initContainers": [{"name": "k8s-driver-manager", "image": MANAGER}],
        "containers": [
            {"name": "nvidia-driver-ctr", "image": image},
            *({"name": n, "image": i} for n, i in sidecars),
        ],
    }


def golden(
    spec: dict[str, Any],
    pod_spec: dict[str, Any] | None = None,
    *,
    kernel: str | None = None,
    configs: nvidiadriver_digest.PoolConfigs = nvidiadriver_digest.PoolConfigs(),
) -> str:
    state = nvidiadriver_digest.install_state(
        NVIDIADriverSpec.model_validate({"driverType": "gpu", **spec}),
        pod_spec or pod(),
        kernel=kernel,
        host_root="",
        configs=configs,
    )
    # Upstream's test data carries no kernel module type; a real object gets the CRD's "auto".
    return dataclasses.replace(state, kernel_module_type="").digest()


# ----- ClusterPolicy: from the finished pod ---------------------------------------------------


def test_upstreams_driver_pod_gives_the_digest_it_carries() -> None:
    ds = reference("daemonsets.apps.yaml", "nvidia-driver-daemonset")
    spec = ds["spec"]["template"]["spec"]
    carried = env_of(ctr(ds, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]
    assert carried == "3379408550"
    assert driver_digest.digest(spec) == carried


def test_our_render_of_upstreams_default_policy_carries_upstreams_digest() -> None:
    """The swap-in case: same policy, same number, so NVIDIA's running driver pods are restarted
    in place at most (never drained) and their drivers are kept."""
    ds = reference("daemonsets.apps.yaml", "nvidia-driver-daemonset")
    policy = ClusterPolicy.model_validate(reference("clusterpolicy.yaml", "cluster-policy"))
    manager = ctr(ds, "k8s-driver-manager")["image"]
    facts = ClusterFacts(operator_env={"DRIVER_MANAGER_IMAGE": manager}, namespace="gpu-operator")
    ours = find(driver.render(policy, facts), "DaemonSet", "nvidia-driver-daemonset")
    theirs = env_of(ctr(ds, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]
    assert env_of(ctr(ours, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"] == theirs
    assert env_of(ctr(ours, "k8s-driver-manager"))["DRIVER_CONFIG_DIGEST"] == theirs


# ----- NVIDIADriver: from the spec ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected", "spec", "sidecars", "configs"),
    [
        ("minimal", "886542011", {}, (), None),
        ("additional-configs", "2057338482", {}, (), SAMPLE),
        ("rdma", "3271748789", {"rdma": {"enabled": True}}, (), SAMPLE),
        ("rdma-hostmofed", "3567795386", {"rdma": {"enabled": True, "useHostMofed": True}}, (),
         SAMPLE),
        ("gds", "3167573620", {"gds": {"enabled": True}}, (("nvidia-fs-ctr", GDS),), SAMPLE),
        ("gdrcopy", "3850098627", {"gdrcopy": {"enabled": True}},
         (("nvidia-gdrcopy-ctr", GDRCOPY),), SAMPLE),
        ("secret-env", "576617039",
         {"secretEnv": "test-secret-env", "gds": {"enabled": True}, "gdrcopy": {"enabled": True}},
         (("nvidia-fs-ctr", GDS), ("nvidia-gdrcopy-ctr", GDRCOPY)), None),
    ],
    ids=lambda v: v if isinstance(v, str) and not v.isdigit() else "",
)  # fmt: skip
def test_nvidiadriver_digests_equal_upstreams_golden_values(
    case: str,
    expected: str,
    spec: dict[str, Any],
    sidecars: tuple[tuple[str, str], ...],
    configs: nvidiadriver_digest.PoolConfigs | None,
) -> None:
    kwargs = {"configs": configs} if configs else {}
    assert golden(spec, pod(IMAGE, *sidecars), **kwargs) == expected, case


def test_a_precompiled_pool_digest_equals_upstreams() -> None:
    assert golden({"usePrecompiled": True}, pod(PRECOMPILED), kernel="5.4.0-150-generic") == (
        "648926272"
    )


def pool(os_id: str = "ubuntu", version: str = "22.04", kernel: str | None = None) -> Any:
    return nvidiadriver.Pool(
        os_id=os_id,
        os_version_id=version,
        os_tag=f"{os_id}{version}" if os_id == "ubuntu" else f"{os_id}{version.split('.')[0]}",
        selector=(),
        kernel=kernel,
        nodes=("gpu-1",),
    )


def pool_ds(facts: ClusterFacts | None = None, the_pool: Any = None, **spec: Any) -> Any:
    spec.setdefault("version", "580.95.05")
    item = nvidiadriver.DriverInput("default", "uid-1", NVIDIADriverSpec.model_validate(spec))
    return nvidiadriver.render_pool(item, the_pool or pool(), make_policy(), facts or make_facts())


def digest_of(ds: dict[str, Any]) -> str | None:
    return env_of(ctr(ds, "nvidia-driver-ctr"))["DRIVER_CONFIG_DIGEST"]


def test_a_pool_carries_upstreams_nvidiadriver_digest_on_manager_and_driver() -> None:
    ds = pool_ds()
    spec = NVIDIADriverSpec.model_validate({"version": "580.95.05"})
    expected = nvidiadriver_digest.install_state(
        spec, ds["spec"]["template"]["spec"], kernel=None, host_root="/",
        configs=nvidiadriver_digest.PoolConfigs(),
    ).digest()  # fmt: skip
    assert digest_of(ds) == expected
    assert env_of(ctr(ds, "k8s-driver-manager"))["DRIVER_CONFIG_DIGEST"] == expected


def test_the_same_driver_has_two_digests_but_one_fingerprint() -> None:
    """Upstream hashes ClusterPolicy pods and NVIDIADriver specs differently; the restart-free
    hand-over compares what the pods run, so it leaves the digest out."""
    policy = make_policy(driver={"repository": "nvcr.io/nvidia", "image": "driver",
                                 "version": "580.95.05"})  # fmt: skip
    cp_ds = find(driver.render(policy, make_facts()), "DaemonSet")
    item = nvidiadriver.DriverInput(
        "default",
        "uid-1",
        NVIDIADriverSpec.model_validate(
            {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}
        ),
    )
    pool_daemonset = nvidiadriver.render_pool(item, pool(), policy, make_facts())
    assert digest_of(cp_ds) != digest_of(pool_daemonset)
    assert nvidiadriver.fingerprint(cp_ds["spec"]["template"]) == nvidiadriver.fingerprint(
        pool_daemonset["spec"]["template"]
    )


def test_a_pool_digest_ignores_how_the_pod_runs_and_follows_what_it_installs() -> None:
    base = digest_of(pool_ds())
    for same in (
        pool_ds(resources={"limits": {"memory": "1Gi"}}),
        pool_ds(startupProbe={"periodSeconds": 5}),
        pool_ds(tolerations=[{"key": "x", "operator": "Exists"}]),
        pool_ds(labels={"team": "a"}),
        pool_ds(priorityClassName="high"),
    ):
        assert digest_of(same) == base
    for changed in (
        pool_ds(version="580.95.06"),
        pool_ds(kernelModuleType="open"),
        pool_ds(env=[{"name": "X", "value": "1"}]),
        pool_ds(manager={"env": [{"name": "ENABLE_AUTO_DRAIN", "value": "true"}]}),
        pool_ds(rdma={"enabled": True}),
        pool_ds(make_facts(config_map_keys={"kmod": ("nvidia.conf",)}),
                kernelModuleConfig={"name": "kmod"}),
    ):  # fmt: skip
        assert digest_of(changed) != base


def test_pool_configs_follow_upstreams_volumes() -> None:
    spec = NVIDIADriverSpec.model_validate(
        {
            "version": "580.95.05",
            "repoConfig": {"name": "repos"},
            "certConfig": {"name": "certs"},
            "kernelModuleConfig": {"name": "kmod"},
            "licensingConfig": {"secretName": "licence"},
            "virtualTopologyConfig": {"name": "topology"},
        }
    )
    keys = {"repos": ("b.list", "a.list"), "certs": ("ca.crt",), "kmod": ("nvidia.conf",)}
    configs = nvidiadriver_digest.pool_configs(
        spec, os_id="ubuntu", precompiled=False, runtime="containerd", config_map_keys=keys
    )
    assert [m["mountPath"] for m in configs.mounts] == [
        "/etc/apt/sources.list.d/a.list",
        "/etc/apt/sources.list.d/b.list",
        "/usr/local/share/ca-certificates/ca.crt",
        "/drivers/nvidia.conf",
        "/drivers/gridd.conf",
        "/drivers/ClientConfigToken/client_configuration_token.tok",  # NLS: unset means on
        "/etc/nvidia/nvidia-topologyd.conf",
    ]
    assert [v["name"] for v in configs.volumes] == [
        "repos", "certs", "kmod", "licensing-config", "topology-config"
    ]  # fmt: skip
    assert configs.volumes[3] == {"name": "licensing-config", "secret": {"secretName": "licence"}}
    # Precompiled drivers take no repo or cert ConfigMap.
    precompiled = nvidiadriver_digest.pool_configs(
        spec, os_id="ubuntu", precompiled=True, runtime="containerd", config_map_keys=keys
    )
    assert [v["name"] for v in precompiled.volumes] == ["kmod", "licensing-config",
                                                        "topology-config"]  # fmt: skip


def test_rhel_and_sles_pools_mount_the_hosts_subscriptions_as_upstream() -> None:
    plain = NVIDIADriverSpec.model_validate({"version": "580.95.05"})
    rhel = nvidiadriver_digest.pool_configs(
        plain, os_id="rhel", precompiled=False, runtime="containerd", config_map_keys={}
    )
    assert [(m["name"], m["mountPath"]) for m in rhel.mounts] == [
        ("subscription-config-0", "/run/secrets/etc-pki-entitlement"),
        ("subscription-config-1", "/run/secrets/redhat.repo"),
        ("subscription-config-2", "/run/secrets/rhsm"),
    ]
    assert rhel.volumes[1] == {
        "name": "subscription-config-1", "hostPath": {"path": "/etc/yum.repos.d/redhat.repo"}
    }  # fmt: skip
    on_crio = nvidiadriver_digest.pool_configs(
        plain, os_id="rhel", precompiled=False, runtime="crio", config_map_keys={}
    )
    assert on_crio == nvidiadriver_digest.PoolConfigs()
    with_repo = nvidiadriver_digest.pool_configs(
        NVIDIADriverSpec.model_validate({"version": "580.95.05", "repoConfig": {"name": "r"}}),
        os_id="rhel", precompiled=False, runtime="containerd", config_map_keys={"r": ("a.repo",)},
    )  # fmt: skip
    assert [m["name"] for m in with_repo.mounts] == ["r"]  # the repo replaces the subscription
    sles = nvidiadriver_digest.pool_configs(
        plain, os_id="sles", precompiled=False, runtime="containerd", config_map_keys={}
    )
    assert [m["mountPath"] for m in sles.mounts] == ["/etc/SUSEConnect", "/etc/zypp/credentials.d"]
