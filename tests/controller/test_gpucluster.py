"""The GPUCluster reconciler on kubesim under the chart's RBAC: the DRA driver's objects, the
exclusivity with the ClusterPolicy (reported on both objects), and deletion by owner references."""

from __future__ import annotations

from typing import Any

from dra_fake_driver import FakeDRADriver
from operator_harness import NAMESPACE, Env, policy

from gpu_operator.api import keys
from gpu_operator.operands import dra_driver

GC = "gpuclusters.nvidia.com"
NVD = "nvidiadrivers.nvidia.com"
DRA = {"repository": "nvcr.io/nvidia", "image": "dra-driver-nvidia-gpu", "version": "v0.5.0"}
DRIVER = {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}


def nvidiadriver(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": {"default": False, "driverType": "gpu", **DRIVER, **spec},
    }


def gpu_cluster(**dra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": {"draDriver": {**DRA, **dra}},
    }


async def gpu_driver(env: Env, node: str) -> FakeDRADriver:
    """A stand-in for the kubelet plugin on one node: registered, one GPU published as NVIDIA's
    driver publishes it (the attribute gpu.nvidia.com's DeviceClass selects on)."""
    await env.sim.start_dra_manager(node)
    driver = FakeDRADriver(env.sim, node, name="gpu.nvidia.com", devices=("gpu-0",))
    await driver.start()
    await env.wait(lambda: driver.statuses == [(True, "")], f"plugin registered on {node}")
    env.sim.store.create({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    })  # fmt: skip
    return driver


def status(env: Env, resource: str, name: str) -> dict[str, Any]:
    found = env.sim.store.get(resource, name)
    return dict((found or {}).get("status") or {})


def condition(env: Env, resource: str, name: str, type_: str) -> dict[str, Any]:
    found = status(env, resource, name).get("conditions") or []
    return next((c for c in found if c.get("type") == type_), {})


def events(env: Env, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in env.sim.store.list("events", namespace="default") if e.get("reason") == reason
    ]


def dra_objects(env: Env) -> dict[str, bool]:
    store = env.sim.store
    return {
        "plugin": store.get("daemonsets", dra_driver.PLUGIN_DAEMONSET, NAMESPACE) is not None,
        "controller": store.get("deployments", dra_driver.CONTROLLER, NAMESPACE) is not None,
        "validator": store.get("daemonsets", dra_driver.VALIDATOR, NAMESPACE) is not None,
        "gpu-class": store.get("deviceclasses", "gpu.nvidia.com") is not None,
        "mig-class": store.get("deviceclasses", "mig.nvidia.com") is not None,
        "plugin-rbac": store.get("clusterroles", dra_driver.PLUGIN_ACCOUNT) is not None,
        "vap": store.get("validatingadmissionpolicies", dra_driver.SLICES_POLICY) is not None,
        "vap-binding": store.get("validatingadmissionpolicybindings", dra_driver.SLICES_POLICY)
        is not None,
    }


async def test_gpucluster_deploys_the_dra_driver(env: Env) -> None:
    # The validator's init container takes a GPU claim that the kubelet plugin answers: a fake
    # plugin stands in for it on each GPU node (registered before the validator pods come).
    drivers = [await gpu_driver(env, node) for node in ("gpu-1", "gpu-2")]
    try:
        await deploys_and_turns_ready(env)
    finally:
        for driver in drivers:
            await driver.stop()


async def deploys_and_turns_ready(env: Env) -> None:
    env.start_operator()
    env.sim.store.create(gpu_cluster())
    await env.wait(
        lambda: all(dra_objects(env).values()), "DRA objects", state=lambda: dra_objects(env)
    )
    ds = env.sim.store.get("daemonsets", dra_driver.PLUGIN_DAEMONSET, NAMESPACE)
    assert ds is not None
    owner = ds["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == (
        "GPUCluster",
        "gpu-cluster",
        True,
    )
    # The GPU nodes carry the deploy labels the DaemonSets select on; the CPU node does not.
    await env.wait(
        lambda: all(
            (env.sim.store.get("nodes", n) or {})["metadata"]["labels"].get(
                dra_driver.DEPLOY_DRA_DRIVER
            )
            == "true"
            for n in ("gpu-1", "gpu-2")
        ),
        "deploy labels",
    )
    cpu = env.sim.store.get("nodes", "cpu-1") or {}
    assert dra_driver.DEPLOY_DRA_DRIVER not in cpu["metadata"]["labels"]
    await env.wait(
        lambda: status(env, GC, "gpu-cluster").get("namespace") == NAMESPACE,
        "status written",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    # Ready once, and only once, the kubelet plugin and the validator DaemonSets and the
    # compute-domain controller Deployment are.
    await env.wait(
        lambda: status(env, GC, "gpu-cluster").get("state") == "ready",
        "GPUCluster ready",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    for name in (dra_driver.PLUGIN_DAEMONSET, dra_driver.VALIDATOR):
        live = env.sim.store.get("daemonsets", name, NAMESPACE) or {}
        ds_status = live.get("status") or {}
        assert ds_status.get("desiredNumberScheduled") == 2, (name, ds_status)
        assert ds_status.get("numberReady") == 2, (name, ds_status)
    controller = env.sim.store.get("deployments", dra_driver.CONTROLLER, NAMESPACE) or {}
    assert (controller.get("status") or {}).get("availableReplicas") == 1, controller.get("status")
    ready = condition(env, GC, "gpu-cluster", "Ready")
    assert (ready.get("status"), ready.get("reason")) == ("True", "Reconciled"), ready


async def test_hand_deleted_dra_objects_are_put_back(env: Env) -> None:
    """DeviceClasses, the admission policy and its binding, the claim template and the RBAC are
    watched: deleting one by hand brings a pass that applies it again."""
    env.start_operator()
    env.sim.store.create(gpu_cluster())
    await env.wait(
        lambda: all(dra_objects(env).values()), "DRA objects", state=lambda: dra_objects(env)
    )
    store = env.sim.store
    assert store.get("resourceclaimtemplates", dra_driver.VALIDATOR_CLAIM_TEMPLATE, NAMESPACE)
    uids = {
        "gpu-class": store.get("deviceclasses", "gpu.nvidia.com")["metadata"]["uid"],
        "vap": store.get("validatingadmissionpolicies", dra_driver.SLICES_POLICY)["metadata"][
            "uid"
        ],
    }
    store.delete("deviceclasses", "gpu.nvidia.com")
    store.delete("validatingadmissionpolicies", dra_driver.SLICES_POLICY)
    store.delete("validatingadmissionpolicybindings", dra_driver.SLICES_POLICY)
    store.delete("resourceclaimtemplates", dra_driver.VALIDATOR_CLAIM_TEMPLATE, NAMESPACE)
    store.delete("clusterroles", dra_driver.PLUGIN_ACCOUNT)

    def back() -> bool:
        return bool(
            all(dra_objects(env).values())
            and store.get("resourceclaimtemplates", dra_driver.VALIDATOR_CLAIM_TEMPLATE, NAMESPACE)
        )

    # No other event happens meanwhile: only the watch on the deleted objects brings the pass.
    await env.wait(back, "hand-deleted DRA objects re-applied", state=lambda: dra_objects(env))
    again = store.get("deviceclasses", "gpu.nvidia.com") or {}
    assert again["metadata"]["uid"] != uids["gpu-class"]
    assert again["metadata"]["ownerReferences"][0]["kind"] == "GPUCluster"


async def test_newer_clusterpolicy_is_refused_on_both_objects(env: Env) -> None:
    env.start_operator()
    env.sim.store.create(gpu_cluster())
    # The GPUCluster runs (reconciled, its status written) before the ClusterPolicy comes: the
    # two may still be created within the same second, a tie the statuses settle
    # (tests/status/test_gpucluster_conflict.py).
    await env.wait(lambda: dra_objects(env)["plugin"], "DRA driver deployed")
    await env.wait(
        lambda: bool(status(env, GC, "gpu-cluster").get("state")),
        "GPUCluster status written",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    env.sim.store.create(policy())
    await env.wait(
        lambda: (
            condition(env, "clusterpolicies.nvidia.com", "cluster-policy", "Error").get("reason")
            == "ConflictingCustomResource"
        ),
        "ClusterPolicy refused",
        state=lambda: status(env, "clusterpolicies.nvidia.com", "cluster-policy"),
    )
    refused = condition(env, "clusterpolicies.nvidia.com", "cluster-policy", "Error")["message"]
    assert "GPUCluster gpu-cluster" in refused
    assert "kubectl delete gpucluster" in refused
    # Nothing of the refused ClusterPolicy is applied.
    assert not [n for n in env.daemonsets() if n.startswith("nvidia-device-plugin")]
    # The GPUCluster, which keeps running, says so too.
    await env.wait(
        lambda: (
            "ClusterPolicy cluster-policy"
            in condition(env, GC, "gpu-cluster", "Conflict").get("message", "")
        ),
        "Conflict condition on the GPUCluster",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    await env.wait(lambda: bool(events(env, "ConflictingCustomResource")), "conflict Event")


async def test_newer_gpucluster_is_refused_and_applies_nothing(env: Env) -> None:
    env.start_operator()
    env.sim.store.create(policy())
    await env.wait(lambda: bool(env.daemonsets()), "ClusterPolicy operands")
    env.sim.store.create(gpu_cluster())
    await env.wait(
        lambda: (
            condition(env, GC, "gpu-cluster", "Error").get("reason") == "ConflictingCustomResource"
        ),
        "GPUCluster refused",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    assert (
        "kubectl delete clusterpolicy cluster-policy"
        in (condition(env, GC, "gpu-cluster", "Error")["message"])
    )
    assert not any(dra_objects(env).values()), dra_objects(env)
    await env.wait(
        lambda: (
            "GPUCluster gpu-cluster"
            in condition(env, "clusterpolicies.nvidia.com", "cluster-policy", "Conflict").get(
                "message", ""
            )
        ),
        "Conflict condition on the ClusterPolicy",
        state=lambda: status(env, "clusterpolicies.nvidia.com", "cluster-policy"),
    )
    # Deleting the ClusterPolicy lets the GPUCluster take over.
    env.sim.store.delete("clusterpolicies.nvidia.com", "cluster-policy")
    await env.wait(lambda: dra_objects(env)["plugin"], "GPUCluster takes over")


async def test_deleting_the_gpucluster_removes_its_objects(env: Env) -> None:
    env.start_operator()
    env.sim.store.create(gpu_cluster())
    await env.wait(
        lambda: all(dra_objects(env).values()), "DRA objects", state=lambda: dra_objects(env)
    )
    env.sim.store.delete(GC, "gpu-cluster")
    await env.wait(
        lambda: not any(dra_objects(env).values()),
        "DRA objects gone",
        state=lambda: dra_objects(env),
    )


async def test_a_refused_clusterpolicy_drives_no_other_reconciler(env: Env) -> None:
    """Node labelling and NVIDIADriver follow the ClusterPolicy in charge: a refused one is none,
    even with useNvidiaDriverCRD and an NVIDIADriver waiting for it."""
    operator = env.start_operator()
    env.sim.store.create(gpu_cluster())
    await env.wait(
        lambda: bool(status(env, GC, "gpu-cluster").get("state")),
        "GPUCluster status written",
        state=lambda: status(env, GC, "gpu-cluster"),
    )
    env.sim.store.create(policy(driver={**DRIVER, "useNvidiaDriverCRD": True}))
    env.sim.store.create(nvidiadriver("default-driver", default=True))
    await env.wait(
        lambda: (
            condition(env, "clusterpolicies.nvidia.com", "cluster-policy", "Error").get("reason")
            == "ConflictingCustomResource"
        ),
        "ClusterPolicy refused",
        state=lambda: status(env, "clusterpolicies.nvidia.com", "cluster-policy"),
    )
    assert operator.active_policy() is None
    assert not operator.labels.has_policy()
    await env.wait(
        lambda: any(
            "ClusterPolicy cluster-policy is refused" in c.get("message", "")
            for c in status(env, NVD, "default-driver").get("conditions") or []
        ),
        "NVIDIADriver says the ClusterPolicy is refused",
        state=lambda: status(env, NVD, "default-driver"),
    )
    assert status(env, NVD, "default-driver").get("state") == "notReady"
    # No driver pool, no ClusterPolicy deploy label on any node.
    assert not [n for n in env.daemonsets() if n.startswith("nvidia-gpu-driver-")]
    for name in ("gpu-1", "gpu-2"):
        labels = (env.sim.store.get("nodes", name) or {})["metadata"]["labels"]
        assert "nvidia.com/gpu.deploy.device-plugin" not in labels, labels
        assert keys.DRIVER_OWNER not in labels, labels


async def test_gpucluster_runs_dcgm_and_the_exporter_on_admin_claims(env: Env) -> None:
    """`dcgm.enabled` and a `dcgmExporter` section bring nvidia-dcgm-dra and
    nvidia-dcgm-exporter-dra on the GPU nodes (their deploy labels), each pod holding every GPU of
    its node through an adminAccess claim; the GPUCluster is ready only once they are. Switching
    them off deletes them."""
    drivers = [await gpu_driver(env, node) for node in ("gpu-1", "gpu-2")]
    try:
        env.start_operator()
        cluster = gpu_cluster()
        cluster["spec"].update(dcgm={"enabled": True}, dcgmExporter={})
        env.sim.store.create(cluster)
        store = env.sim.store
        names = (dra_driver.DCGM_DRA, dra_driver.DCGM_EXPORTER_DRA)

        def ready_counts() -> dict[str, Any]:
            return {
                n: ((store.get("daemonsets", n, NAMESPACE) or {}).get("status") or {}).get(
                    "numberReady"
                )
                for n in names
            }

        await env.wait(
            lambda: (
                status(env, GC, "gpu-cluster").get("state") == "ready"
                and ready_counts() == dict.fromkeys(names, 2)
            ),
            "DCGM and exporter ready",
            state=lambda: (status(env, GC, "gpu-cluster"), ready_counts()),
        )
        for node in ("gpu-1", "gpu-2"):
            labels = (store.get("nodes", node) or {})["metadata"]["labels"]
            assert labels[dra_driver.DEPLOY_DCGM_DRA] == "true"
            assert labels[dra_driver.DEPLOY_DCGM_EXPORTER_DRA] == "true"
        assert (
            dra_driver.DEPLOY_DCGM_DRA
            not in (store.get("nodes", "cpu-1") or {})["metadata"]["labels"]
        )
        claims = [
            c
            for c in store.list("resourceclaims", namespace=NAMESPACE)
            if c["metadata"]["name"].startswith(dra_driver.DCGM_EXPORTER_DRA)
        ]
        assert len(claims) == 2
        for claim in claims:
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["adminAccess"] is True
        # Off again: both DaemonSets and their claim templates go.
        live = store.get(GC, "gpu-cluster") or {}
        live["spec"].pop("dcgm")
        live["spec"]["dcgmExporter"] = {"enabled": False}
        store.update(live)
        await env.wait(
            lambda: (
                all(store.get("daemonsets", n, NAMESPACE) is None for n in names)
                and store.get(
                    "resourceclaimtemplates", dra_driver.DCGM_EXPORTER_ADMIN_TEMPLATE, NAMESPACE
                )
                is None
            ),
            "DCGM objects deleted",
        )
    finally:
        for driver in drivers:
            await driver.stop()


async def test_turning_compute_domains_off_deletes_their_objects(env: Env) -> None:
    """Objects a new spec no longer renders are deleted by the reconciler (not left behind)."""
    env.start_operator()
    env.sim.store.create(gpu_cluster())
    channel = "compute-domain-default-channel.nvidia.com"
    await env.wait(
        lambda: (
            all(dra_objects(env).values())
            and env.sim.store.get("deviceclasses", channel) is not None
        ),
        "DRA objects with compute domains",
        state=lambda: dra_objects(env),
    )
    live = env.sim.store.get(GC, "gpu-cluster") or {}
    spec = live["spec"]
    spec["draDriver"] = {**spec["draDriver"], "computeDomains": {"enabled": False}}
    env.sim.store.update({**live, "spec": spec})
    await env.wait(
        lambda: (
            not dra_objects(env)["controller"]
            and env.sim.store.get("deviceclasses", channel) is None
        ),
        "the compute-domain controller and DeviceClasses deleted",
        state=lambda: dra_objects(env),
    )
    # The rest of the stack stays.
    assert dra_objects(env)["plugin"]
    assert dra_objects(env)["gpu-class"]
