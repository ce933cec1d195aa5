"""The NVIDIADriver planner: drivers, nodes and the policy in; pools, DaemonSets, problems out."""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import find, make_facts, make_policy

from gpu_operator.api import keys
from gpu_operator.operands import driver
from gpu_operator.operands import nvidiadriver as nd

GPU = {"feature.node.kubernetes.io/pci-10de.present": "true"}
UBUNTU22 = {**GPU, keys.NFD_OS_ID: "ubuntu", keys.NFD_OS_VERSION_ID: "22.04",
            keys.NFD_KERNEL_FULL: "5.15.0-1-generic"}  # fmt: skip
UBUNTU24 = {**GPU, keys.NFD_OS_ID: "ubuntu", keys.NFD_OS_VERSION_ID: "24.04",
            keys.NFD_KERNEL_FULL: "6.8.0-52-generic"}  # fmt: skip
RHEL94 = {**GPU, keys.NFD_OS_ID: "rhel", keys.NFD_OS_VERSION_ID: "9.4",
          keys.NFD_OS_VERSION_MAJOR: "9",
          keys.NFD_KERNEL_FULL: "5.14.0-427.el9.x86_64"}  # fmt: skip
HOPPER = {"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}
CRD_POLICY = make_policy(driver={"useNvidiaDriverCRD": True})


def nvd(name: str, uid: str | None = None, **spec: Any) -> nd.DriverInput:
    spec.setdefault("repository", "nvcr.io/nvidia")
    spec.setdefault("image", "driver")
    spec.setdefault("version", "580.95.05")
    return nd.DriverInput.from_object(
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "metadata": {"name": name, "uid": uid or f"uid-{name}", "generation": 1},
            "spec": spec,
        }
    )


def run(drivers: list[nd.DriverInput], nodes: dict[str, dict[str, str]], **facts: Any) -> nd.Plan:
    return nd.plan("active", drivers, list(nodes.items()), CRD_POLICY, make_facts(**facts))


def pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def ctr(ds: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(ds)
    return next(
        c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name
    )


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


# ----- modes and ownership ----------------------------------------------------------------------


def test_mode_follows_the_cluster_policy() -> None:
    assert nd.mode_of(False, None) == "no-policy"
    assert nd.mode_of(True, make_policy()) == "disabled"
    assert nd.mode_of(True, CRD_POLICY) == "active"


def test_not_active_plans_nothing() -> None:
    result = nd.plan("disabled", [nvd("default", default=True)], [("n1", UBUNTU22)],
                     make_policy(), make_facts())  # fmt: skip
    assert result.drivers["default"].daemonsets == []
    assert result.owners == {}


def test_default_driver_takes_the_nodes_no_other_selects() -> None:
    a100 = nvd("a100", nodeSelector={keys.GPU_PRODUCT: "A100"})
    result = run([nvd("default", default=True), a100],
                 {"n1": UBUNTU22, "n2": {**UBUNTU22, keys.GPU_PRODUCT: "A100"},
                  "cpu": {keys.NFD_OS_ID: "ubuntu"}})  # fmt: skip
    assert result.owners == {"n1": "default", "n2": "a100"}
    assert result.drivers["default"].nodes == ["n1"]
    assert result.drivers["a100"].nodes == ["n2"]


def test_a_conflict_is_reported_by_both_drivers_and_deploys_nothing_new() -> None:
    one = nvd("one", nodeSelector={"pool": "x"})
    two = nvd("two", nodeSelector={"pool": "x"})
    result = run([one, two], {"n1": {**UBUNTU22, "pool": "x"}})
    for name in ("one", "two"):
        entry = result.drivers[name]
        assert entry.conflicts == ["n1"]
        assert entry.problems[0][0] == nd.CONFLICTING_NODE_SELECTOR
        assert "n1" in entry.problems[0][1]
        assert entry.daemonsets == []
    assert result.owners == {"n1": None}


def test_an_invalid_driver_keeps_everything_it_has() -> None:
    broken = nvd("broken", default=True, nodeSelector={"a": "b"})  # a default with a selector
    result = run([broken], {"n1": UBUNTU22})
    entry = result.drivers["broken"]
    assert entry.keep_all
    assert entry.problems[0][0] == nd.INVALID_SPEC
    assert "nodeSelector" in entry.problems[0][1]


def test_an_unsupported_driver_type_is_a_clear_error() -> None:
    host = nvd("host", default=True, driverType="vgpu-host-manager")
    entry = run([host], {"n1": UBUNTU22}).drivers["host"]
    assert "vgpu-host-manager" in entry.problems[0][1]
    assert entry.keep_all


def test_a_driver_being_deleted_owns_nothing() -> None:
    going = nvd("going", default=True)
    going = nd.DriverInput(going.name, going.uid, going.spec, deleting=True)
    result = run([going], {"n1": UBUNTU22})
    assert "going" not in result.drivers
    assert result.owners == {"n1": None}


# ----- pools and variants ---------------------------------------------------------------------


def test_nodes_form_one_pool_per_os_with_its_selector_and_image_tag() -> None:
    result = run([nvd("default", default=True)],
                 {"a": UBUNTU22, "b": UBUNTU22, "c": UBUNTU24, "d": RHEL94})  # fmt: skip
    entry = result.drivers["default"]
    assert [p.pool.os_tag for p in entry.pools] == ["rhel9", "ubuntu22.04", "ubuntu24.04"]
    by_tag = {p.pool.os_tag: p for p in entry.pools}
    assert by_tag["ubuntu22.04"].pool.nodes == ("a", "b")
    dss = {d["metadata"]["labels"][keys.NODE_OS_VERSION]: d for d in entry.daemonsets}
    rhel = dss["rhel9"]
    assert pod_spec(rhel)["nodeSelector"] == {
        "nvidia.com/gpu.deploy.driver": "true",
        keys.DRIVER_OWNER: "default",
        keys.NFD_OS_ID: "rhel",
        keys.NFD_OS_VERSION_MAJOR: "9",
    }
    assert ctr(rhel, "nvidia-driver-ctr")["image"] == "nvcr.io/nvidia/driver:580.95.05-rhel9"
    ubuntu = dss["ubuntu24.04"]
    assert pod_spec(ubuntu)["nodeSelector"][keys.NFD_OS_VERSION_ID] == "24.04"
    assert ubuntu["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert ubuntu["metadata"]["name"].startswith("nvidia-gpu-driver-ubuntu24.04-")
    assert len(ubuntu["metadata"]["name"]) <= 63
    assert ubuntu["metadata"]["ownerReferences"][0]["uid"] == "uid-default"


def test_nodes_without_os_labels_are_skipped_and_listed() -> None:
    no_major = {k: v for k, v in RHEL94.items() if k != keys.NFD_OS_VERSION_MAJOR}
    nodes = {"a": UBUNTU22, "bare": GPU, "no-major": no_major}
    entry = run([nvd("default", default=True)], nodes).drivers["default"]
    assert entry.skipped == ["bare", "no-major"]
    assert len(entry.daemonsets) == 1


def test_precompiled_drivers_get_one_pool_per_kernel() -> None:
    other_kernel = {**UBUNTU22, keys.NFD_KERNEL_FULL: "5.15.0-2-generic"}
    entry = run([nvd("pre", default=True, usePrecompiled=True, version="580")],
                {"a": UBUNTU22, "b": other_kernel}).drivers["pre"]  # fmt: skip
    assert [p.pool.kernel for p in entry.pools] == ["5.15.0-1-generic", "5.15.0-2-generic"]
    names = {d["metadata"]["name"] for d in entry.daemonsets}
    assert len(names) == 2
    ds = entry.daemonsets[0]
    assert ctr(ds, "nvidia-driver-ctr")["image"] == (
        "nvcr.io/nvidia/driver:580-5.15.0-1-generic-ubuntu22.04"
    )
    assert pod_spec(ds)["nodeSelector"][keys.NFD_KERNEL_FULL] == "5.15.0-1-generic"
    assert ds["metadata"]["labels"][keys.PRECOMPILED] == "true"
    assert ctr(ds, "nvidia-driver-ctr")["startupProbe"]["initialDelaySeconds"] == 5


def test_gds_gdrcopy_and_peermem_sidecars_come_from_the_nvidiadriver() -> None:
    sidecar = {"enabled": True, "repository": "nvcr.io/nvidia/cloud-native", "version": "2.20.5"}
    item = nvd("default", default=True, kernelModuleType="open",
               gds={**sidecar, "image": "nvidia-fs"},
               gdrcopy={**sidecar, "image": "gdrdrv", "version": "v2.5.1"},
               rdma={"enabled": True, "useHostMofed": True})  # fmt: skip
    ds = run([item], {"a": UBUNTU22}).drivers["default"].daemonsets[0]
    names = [c["name"] for c in pod_spec(ds)["containers"]]
    assert names == ["nvidia-driver-ctr", "nvidia-peermem-ctr", "nvidia-fs-ctr",
                     "nvidia-gdrcopy-ctr"]  # fmt: skip
    assert ctr(ds, "nvidia-fs-ctr")["image"] == (
        "nvcr.io/nvidia/cloud-native/nvidia-fs:2.20.5-ubuntu22.04"
    )
    driver_env = env(ctr(ds, "nvidia-driver-ctr"))
    assert driver_env["GDS_ENABLED"] == "true"
    assert driver_env["GDRCOPY_ENABLED"] == "true"
    assert driver_env["USE_HOST_MOFED"] == "true"
    assert driver_env["KERNEL_MODULE_TYPE"] == "open"


def test_without_sidecars_only_the_driver_container_runs() -> None:
    ds = run([nvd("default", default=True)], {"a": UBUNTU22}).drivers["default"].daemonsets[0]
    assert [c["name"] for c in pod_spec(ds)["containers"]] == ["nvidia-driver-ctr"]


def test_licensing_mounts_the_secret_with_nls_on_by_default() -> None:
    item = nvd("vgpu", default=True, driverType="vgpu",
               licensingConfig={"secretName": "licensing"})  # fmt: skip
    ds = run([item], {"a": UBUNTU22}).drivers["vgpu"].daemonsets[0]
    assert ds["metadata"]["name"].startswith("nvidia-vgpu-driver-ubuntu22.04-")
    assert pod_spec(ds)["serviceAccountName"] == "nvidia-vgpu-driver"
    volume = next(v for v in pod_spec(ds)["volumes"] if v["name"] == "licensing-config")
    assert volume["secret"]["secretName"] == "licensing"
    keys_mounted = {i["key"] for i in volume["secret"]["items"]}
    assert keys_mounted == {"gridd.conf", "client_configuration_token.tok"}


def test_a_missing_repo_config_map_holds_the_pool_with_the_reason() -> None:
    item = nvd("default", default=True, repoConfig={"name": "repos"})
    entry = run([item], {"a": UBUNTU22}).drivers["default"]
    assert entry.daemonsets == []
    assert entry.problems[0][0] == nd.RECONCILE_FAILED
    assert "ConfigMap 'repos' not found" in entry.problems[0][1]
    assert entry.keep == {entry.pools[0].daemonset}


def test_pod_settings_come_from_the_nvidiadriver() -> None:
    item = nvd("default", default=True, priorityClassName="high",
               tolerations=[{"key": "dedicated", "operator": "Exists"}],
               labels={"team": "ml", "app": "ignored", "app.kubernetes.io/name": "ignored"},
               annotations={"note": "x"}, hostNetwork=True)  # fmt: skip
    ds = run([item], {"a": UBUNTU22}).drivers["default"].daemonsets[0]
    spec = pod_spec(ds)
    assert spec["priorityClassName"] == "high"
    assert {"key": "dedicated", "operator": "Exists"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "ml"
    assert labels["app"] == ds["metadata"]["name"]
    assert "app.kubernetes.io/name" not in labels
    assert ds["spec"]["template"]["metadata"]["annotations"]["note"] == "x"
    assert spec["hostNetwork"] is True
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["labelSelector"]["matchExpressions"][0]["values"][0] == "nvidia-driver"


def test_accounts_are_shared_per_driver_type_and_owned_by_every_driver() -> None:
    a = nvd("default", default=True)
    b = nvd("pool", nodeSelector={"pool": "b"})
    result = run([a, b], {"n": UBUNTU22})
    account = find(result.accounts, "ServiceAccount", "nvidia-gpu-driver")
    assert [r["name"] for r in account["metadata"]["ownerReferences"]] == ["default", "pool"]
    assert find(result.accounts, "ClusterRole", "nvidia-gpu-driver")["rules"]


# ----- version checks ---------------------------------------------------------------------------


def test_a_pool_whose_version_cannot_drive_its_gpus_is_held_back() -> None:
    old = nvd("default", default=True, version="515.65.01")
    entry = run([old], {"h1": {**UBUNTU22, **HOPPER}, "u": UBUNTU24}).drivers["default"]
    held = next(p for p in entry.pools if p.pool.os_tag == "ubuntu22.04")
    assert held.blocked is not None
    assert "older than 520.61.05" in held.blocked
    assert entry.keep == {held.daemonset}
    assert [d["metadata"]["labels"][keys.NODE_OS_VERSION] for d in entry.daemonsets] == [
        "ubuntu24.04"
    ]
    reason, message = entry.problems[0]
    assert reason == nd.VERSION_UNSUPPORTED
    assert "pool ubuntu22.04: not rolled out" in message


def test_unlabelled_gpus_are_counted_as_unchecked() -> None:
    entry = run([nvd("default", default=True)], {"a": UBUNTU22}).drivers["default"]
    assert entry.pools[0].unchecked == 1
    assert entry.problems == []


# ----- the same pod as the ClusterPolicy renders -------------------------------------------------


def test_an_nvidiadriver_saying_what_the_policy_said_renders_the_same_pod() -> None:
    policy = make_policy(driver={"repository": "nvcr.io/nvidia", "image": "driver",
                                 "version": "580.95.05"})  # fmt: skip
    facts = make_facts()
    cp_ds = find(driver.render(policy, facts), "DaemonSet")
    pool_ds = run([nvd("default", default=True)], {"a": UBUNTU22}).drivers["default"].daemonsets[0]
    assert nd.fingerprint(cp_ds["spec"]["template"]) == nd.fingerprint(pool_ds["spec"]["template"])


def test_a_different_version_is_a_different_pod() -> None:
    policy = make_policy(driver={"repository": "nvcr.io/nvidia", "image": "driver",
                                 "version": "570.195.03"})  # fmt: skip
    cp_ds = find(driver.render(policy, make_facts()), "DaemonSet")
    pool_ds = run([nvd("default", default=True)], {"a": UBUNTU22}).drivers["default"].daemonsets[0]
    assert nd.fingerprint(cp_ds["spec"]["template"]) != nd.fingerprint(pool_ds["spec"]["template"])


def test_placement_does_not_change_the_fingerprint() -> None:
    base = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    placement = {"nodeSelector": {"a": "b"}, "serviceAccountName": "s", "tolerations": [{}],
                 "priorityClassName": "p"}  # fmt: skip
    moved = {"metadata": {"labels": {"app": "x"}}, "spec": {**base["spec"], **placement}}
    assert nd.fingerprint(base) == nd.fingerprint(moved)


# ----- the hand-over ----------------------------------------------------------------------------


def live_pool(fingerprint: str | None = "fp", revision: bool = True) -> nd.LivePool:
    rev = nd.Revision("pool-ds", "newhash", 1, fingerprint, "ds-uid") if revision else None
    return nd.LivePool("pool-ds", "ds-uid", 2, {"app": "pool-ds", "x": "y"}, rev)


OLD_REVISION = nd.Revision("nvidia-driver-daemonset", "oldhash", 3, "fp", None)
ORPHAN = nd.DriverPod("nvidia-driver-daemonset-abc", "n1", "nvidia-driver-daemonset", "oldhash",
                      owned=False)  # fmt: skip


def test_an_orphan_running_the_pools_pod_is_adopted_without_a_restart() -> None:
    plan = nd.plan_hand_over([ORPHAN], {"n1": live_pool()}, [OLD_REVISION])
    assert plan.replace == []
    (adoption,) = plan.adopt
    assert adoption.pod == ORPHAN.name
    meta = adoption.patch["metadata"]
    assert meta["labels"]["app"] == "pool-ds"
    assert meta["labels"]["controller-revision-hash"] == "newhash"
    assert meta["labels"]["pod-template-generation"] == "2"
    assert meta["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                        "name": "pool-ds", "uid": "ds-uid", "controller": True,
                                        "blockOwnerDeletion": True}]  # fmt: skip


def test_an_orphan_running_another_pod_is_left_to_the_upgrade_flow() -> None:
    plan = nd.plan_hand_over([ORPHAN], {"n1": live_pool("other")}, [OLD_REVISION])
    assert plan.adopt == []
    assert plan.replace == ["n1"]


def test_an_orphan_whose_revision_is_unknown_is_replaced() -> None:
    plan = nd.plan_hand_over([ORPHAN], {"n1": live_pool()}, [])
    assert plan.replace == ["n1"]


@pytest.mark.parametrize("pool", [None, "no-revision"])
def test_adoption_waits_for_the_pools_daemonset_and_its_revision(pool: str | None) -> None:
    live = None if pool is None else live_pool(revision=False)
    plan = nd.plan_hand_over([ORPHAN], {"n1": live}, [OLD_REVISION])
    assert plan.waiting == ["n1"]
    assert plan.adopt == []
    assert plan.replace == []


def test_orphans_on_nodes_outside_any_ready_pool_are_not_touched() -> None:
    plan = nd.plan_hand_over([ORPHAN], {}, [OLD_REVISION])
    assert plan == nd.HandOver()
