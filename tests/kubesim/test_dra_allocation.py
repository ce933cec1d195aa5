"""DRA on kubesim: claims from templates, allocation by the scheduler's DRA plugin (CEL
selectors, classes, constraints, firstAvailable, adminAccess, shared counters, pools with
generations, node-selector and all-nodes slices), reservation, deallocation, and the race for
the last device."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, instant
from waiting import eventually

import kubesim

DRIVER = "gpu.example.com"


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=2, kubelet=instant()) as cluster:
        yield cluster


def device(name: str, **attributes: Any) -> dict[str, Any]:
    attrs = {
        k: ({"int": v} if isinstance(v, int) else {"string": v}) for k, v in attributes.items()
    }
    return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": "80Gi"}}}


def node_slice(node: str, devices: list[dict[str, Any]], **pool: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{DRIVER}-{pool.get('generation', 0)}-{pool.get('suffix', '')}".rstrip(
                "-"
            )
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {
                "name": node,
                "generation": pool.get("generation", 0),
                "resourceSliceCount": pool.get("count", 1),
            },
            "devices": devices,
        },
    }


def device_class(
    name: str = "gpu", expression: str = f'device.driver == "{DRIVER}"'
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def claim(name: str, *requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exactly(name: str = "gpu", *selectors: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu", **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def pod(name: str, claim_name: str | None = None, template: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "gpu"}
    if claim_name:
        entry["resourceClaimName"] = claim_name
    if template:
        entry["resourceClaimTemplateName"] = template
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "example/app:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [entry],
        },
    }


async def until(condition: Callable[[], Any], what: str = "the DRA flow to settle") -> Any:
    """`eventually`, where a failed assertion in the condition means "not yet"."""

    def probe() -> Any:
        try:
            return condition()
        except AssertionError:
            return None

    return await eventually(probe, what)


def get(sim: kubesim.Cluster, resource: str, name: str) -> dict[str, Any]:
    found = sim.store.get(resource, name, "default")
    assert found is not None, name
    return found


def scheduled_message(sim: kubesim.Cluster, name: str) -> str:
    conditions = (get(sim, "pods", name).get("status") or {}).get("conditions") or []
    return next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "")


async def test_exact_count_with_cel_selector_allocates_and_binds(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(
        node_slice("node-1", [device("gpu-0", model="a100"), device("gpu-1", model="h100")])
    )
    sim.store.create(node_slice("node-2", [device("gpu-0", model="a100")]))
    sim.store.create(claim("c", exactly("gpu", f'device.attributes["{DRIVER}"].model == "h100"')))
    stored = get(sim, "resourceclaims", "c")
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"
    assert stored["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    sim.store.create(pod("p", claim_name="c"))

    def allocated() -> dict[str, Any]:
        status = get(sim, "resourceclaims", "c").get("status") or {}
        assert status.get("allocation"), status
        return status

    status = await until(allocated)
    assert status["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-1"}
    ]
    terms = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
    ]
    uid = get(sim, "pods", "p")["metadata"]["uid"]
    assert status["reservedFor"] == [{"resource": "pods", "name": "p", "uid": uid}]
    await until(lambda: get(sim, "pods", "p")["spec"].get("nodeName") == "node-1" or None)


async def test_unsatisfiable_selector_is_pending_with_the_scheduler_message(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("gpu-0", model="a100")]))
    sim.store.create(claim("c", exactly("gpu", f'device.attributes["{DRIVER}"].model == "b200"')))
    sim.store.create(pod("p", claim_name="c"))
    message = await until(lambda: scheduled_message(sim, "p") or None)
    assert message.startswith("0/2 nodes are available: 2 cannot allocate all claims."), message
    assert not (get(sim, "resourceclaims", "c").get("status") or {}).get("allocation")


async def test_two_pods_race_for_the_last_device(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("gpu-0", model="a100")]))
    sim.store.create(claim("a", exactly()))
    sim.store.create(claim("b", exactly()))
    sim.store.create(pod("pa", claim_name="a"))
    sim.store.create(pod("pb", claim_name="b"))

    def settled() -> tuple[list[str], list[str]]:
        bound = [n for n in ("pa", "pb") if get(sim, "pods", n)["spec"].get("nodeName")]
        waiting = [
            n for n in ("pa", "pb") if "cannot allocate all claims" in scheduled_message(sim, n)
        ]
        assert len(bound) == 1, (bound, waiting)
        assert len(waiting) == 1, (bound, waiting)
        return bound, waiting

    bound, waiting = await until(settled)
    # The winner's device is not handed out again; deleting it frees the device for the other.
    sim.store.delete("pods", bound[0], "default", grace=0)
    await until(lambda: get(sim, "pods", waiting[0])["spec"].get("nodeName") or None)


async def test_template_claim_lifecycle(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-2", [device("gpu-0", model="a100")]))
    sim.store.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [exactly()]}}},
        }
    )
    sim.store.create(pod("p", template="one-gpu"))

    def generated() -> str:
        statuses = (get(sim, "pods", "p").get("status") or {}).get("resourceClaimStatuses")
        assert statuses, statuses
        return str(statuses[0]["resourceClaimName"])

    name = await until(generated)
    assert name.startswith("p-gpu-")
    made = get(sim, "resourceclaims", name)
    assert made["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    owner = made["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Pod", "p", True)
    await until(lambda: get(sim, "pods", "p")["spec"].get("nodeName") == "node-2" or None)
    sim.store.delete("pods", "p", "default", grace=0)
    await until(lambda: sim.store.get("resourceclaims", name, "default") is None or None)


async def test_shared_claim_deallocated_when_no_consumer_is_left(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("gpu-0", model="a100")]))
    sim.store.create(claim("c", exactly()))
    sim.store.create(pod("p", claim_name="c"))
    await until(lambda: get(sim, "pods", "p")["spec"].get("nodeName") or None)
    claim_obj = get(sim, "resourceclaims", "c")
    assert "resource.kubernetes.io/delete-protection" in claim_obj["metadata"]["finalizers"]
    sim.store.delete("pods", "p", "default", grace=0)

    def released() -> bool:
        obj = get(sim, "resourceclaims", "c")
        status = obj.get("status") or {}
        assert not status.get("allocation"), status
        assert not status.get("reservedFor"), status
        assert not obj["metadata"].get("finalizers"), obj["metadata"]
        return True

    await until(released)


async def test_first_available_match_attribute_and_all(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(
        node_slice(
            "node-1",
            [
                device("g0", model="a100", numa=0),
                device("g1", model="a100", numa=1),
                device("g2", model="a100", numa=1),
            ],
        )
    )
    first = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": "gpu",
                "selectors": [
                    {"cel": {"expression": f'device.attributes["{DRIVER}"].model == "h100"'}}
                ],
            },
            {"name": "small", "deviceClassName": "gpu", "count": 2},
        ],
    }
    sim.store.create(claim("c", first, constraints=[{"matchAttribute": f"{DRIVER}/numa"}]))
    sim.store.create(pod("p", claim_name="c"))

    def allocated() -> list[dict[str, Any]]:
        status = get(sim, "resourceclaims", "c").get("status") or {}
        assert status.get("allocation"), status
        return list(status["allocation"]["devices"]["results"])

    results = await until(allocated)
    assert [r["request"] for r in results] == ["gpu/small", "gpu/small"]
    assert sorted(r["device"] for r in results) == ["g1", "g2"]  # same numa
    sim.store.create(
        claim(
            "all", {"name": "gpu", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}
        )
    )
    sim.store.create(pod("q", claim_name="all"))
    message = await until(lambda: scheduled_message(sim, "q") or None)
    assert "cannot allocate all claims" in message  # g1, g2 are taken: All cannot have them


async def test_admin_access_and_shared_counters(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    partitions = [
        {
            "name": f"part-{i}",
            "consumesCounters": [
                {"counterSet": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}
            ],
        }
        for i in range(3)
    ]
    sliced = node_slice("node-1", partitions)
    sliced["spec"]["sharedCounters"] = [
        {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}
    ]
    sim.store.create(sliced)
    for name in ("a", "b", "c"):
        sim.store.create(claim(name, exactly()))
        sim.store.create(pod(f"p{name}", claim_name=name))
    await until(
        lambda: (
            sum(1 for n in "abc" if get(sim, "pods", f"p{n}")["spec"].get("nodeName")) == 2 or None
        )
    )
    waiting = next(n for n in "abc" if not get(sim, "pods", f"p{n}")["spec"].get("nodeName"))
    await until(
        lambda: "cannot allocate all claims" in scheduled_message(sim, f"p{waiting}") or None
    )


async def test_incomplete_and_old_pool_generations_are_not_used(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("old", model="a100")], generation=1))
    sim.store.create(
        node_slice("node-1", [device("new", model="a100")], generation=2, count=2, suffix="a")
    )
    sim.store.create(claim("c", exactly()))
    sim.store.create(pod("p", claim_name="c"))
    message = await until(lambda: scheduled_message(sim, "p") or None)
    assert "cannot allocate all claims" in message
    sim.store.create(
        node_slice("node-1", [device("new2", model="a100")], generation=2, count=2, suffix="b")
    )
    await until(lambda: get(sim, "pods", "p")["spec"].get("nodeName") or None)
    results = get(sim, "resourceclaims", "c")["status"]["allocation"]["devices"]["results"]
    assert results[0]["device"] in ("new", "new2")


async def test_all_nodes_slice_has_no_node_selector(sim: kubesim.Cluster) -> None:
    sim.store.create(device_class())
    shared = node_slice("x", [device("net-0", model="nic")])
    shared["metadata"]["name"] = "network"
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    shared["spec"]["pool"]["name"] = "fabric"
    sim.store.create(shared)
    sim.store.create(claim("c", exactly()))
    sim.store.create(pod("p", claim_name="c"))
    await until(lambda: get(sim, "pods", "p")["spec"].get("nodeName") or None)
    allocation = get(sim, "resourceclaims", "c")["status"]["allocation"]
    assert "nodeSelector" not in allocation
    assert allocation["devices"]["results"][0]["pool"] == "fabric"


def admin_namespace(sim: kubesim.Cluster, name: str, labelled: bool) -> None:
    labels = {"resource.kubernetes.io/admin-access": "true"} if labelled else {}
    sim.store.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )


def in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj["metadata"]["namespace"] = namespace
    return obj


async def test_admin_access_needs_the_namespace_label(sim: kubesim.Cluster) -> None:
    from kubesim import errors

    admin_namespace(sim, "plain", labelled=False)
    admin_namespace(sim, "admins", labelled=True)
    expected = (
        'ResourceClaim.resource.k8s.io "monitor" is invalid: '
        "spec.devices.requests[0].exactly.adminAccess: Forbidden: admin access to devices "
        "requires the `resource.kubernetes.io/admin-access: true` label on the containing "
        "namespace"
    )
    for namespace in ("default", "plain"):
        with pytest.raises(errors.ApiError) as caught:
            sim.store.create(in_namespace(claim("monitor", exactly(adminAccess=True)), namespace))
        assert caught.value.code == 422
        assert str(caught.value.message) == expected
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "monitor", "namespace": namespace},
            "spec": {"spec": claim("x", exactly(adminAccess=True))["spec"]},
        }
        with pytest.raises(errors.ApiError) as caught:
            sim.store.create(template)
        assert "ResourceClaimTemplate.resource.k8s.io" in str(caught.value.message)
        assert "label on the containing namespace" in str(caught.value.message)
    # Labelled: stored; a request without admin access needs no label.
    sim.store.create(in_namespace(claim("monitor", exactly(adminAccess=True)), "admins"))
    sim.store.create(in_namespace(claim("ordinary", exactly()), "plain"))


async def test_admin_access_claim_gets_a_device_another_claim_holds(
    sim: kubesim.Cluster,
) -> None:
    admin_namespace(sim, "admins", labelled=True)
    sim.store.create(device_class())
    sim.store.create(node_slice("node-1", [device("gpu-0")]))
    sim.store.create(claim("user", exactly()))
    sim.store.create(pod("worker", claim_name="user"))
    await until(lambda: get(sim, "pods", "worker")["spec"].get("nodeName") or None)
    (held,) = get(sim, "resourceclaims", "user")["status"]["allocation"]["devices"]["results"]

    sim.store.create(in_namespace(claim("monitor", exactly(adminAccess=True)), "admins"))
    sim.store.create(in_namespace(pod("monitor", claim_name="monitor"), "admins"))

    def monitor_bound() -> str | None:
        found = sim.store.get("pods", "monitor", "admins") or {}
        return (found.get("spec") or {}).get("nodeName")

    assert await until(monitor_bound) == "node-1"
    monitor = sim.store.get("resourceclaims", "monitor", "admins")
    assert monitor is not None
    (result,) = monitor["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"], result["adminAccess"]) == (
        held["pool"],
        held["device"],
        True,
    )
    # The device is still the user claim's alone: a second ordinary claim cannot have it.
    sim.store.create(claim("another", exactly()))
    sim.store.create(pod("another", claim_name="another"))
    message = await until(lambda: scheduled_message(sim, "another") or None)
    assert "cannot allocate all claims" in message
