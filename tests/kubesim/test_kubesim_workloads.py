"""Workload controllers and Services: Jobs, CronJobs, StatefulSets, Service IPs and node ports,
Endpoints and EndpointSlices, the scale subresource, Deployment revisions and rollouts,
controller Events and printer columns; then the same features driven by the real kubectl."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubesim_helpers import Api, instant, kubectl, needs_kubectl
from waiting import DEADLINE, eventually

import kubesim
from kubesim import columns, cron, errors
from kubesim.controllers import endpoints as endpoints_controller
from kubesim.controllers.endpoints import batch_delay
from kubesim.controllers.endpointslice import EndpointSliceController
from kubesim.controllers.kubelet import PodContext

TASK = "example/task"
KUBECTL_WAIT = f"--timeout={DEADLINE:g}s"  # `kubectl rollout status`'s deadline


# ----- helpers ----------------------------------------------------------------------------------


def container(image: str = f"{TASK}:1", name: str = "main", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def job(name: str, *, image: str = f"{TASK}:1", **spec: Any) -> dict[str, Any]:
    template_spec = {"restartPolicy": "Never", "containers": [container(image)]}
    template_spec.update(spec.pop("pod", {}))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"template": {"spec": template_spec}, **spec},
    }


def workload(kind: str, name: str, replicas: int = 1, **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    pod_spec = {"containers": [container(spec.pop("image", f"example/{name}:1"))]}
    pod_spec.update(spec.pop("pod", {}))
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            **spec,
        },
    }


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ports": [{"port": 80}], **spec},
    }


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for found in ((obj or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == ctype:
            return dict(found)
    return None


def get(sim: kubesim.Cluster, resource: str, name: str) -> dict[str, Any]:
    found = sim.store.get(resource, name, "default")
    assert found is not None, f"{resource}/{name} missing"
    return found


def pods(sim: kubesim.Cluster, selector: str | None = None) -> list[dict[str, Any]]:
    return sim.store.list("pods", "default", label_selector=selector)


def events(sim: kubesim.Cluster, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in sim.store.list("events", "default")
        if e["involvedObject"]["name"] == name
    ]


def invalid_message(excinfo: pytest.ExceptionInfo[errors.ApiError]) -> str:
    assert excinfo.value.code == 422, excinfo.value.message
    return excinfo.value.message


async def finish(sim: kubesim.Cluster, name: str, ctype: str = "Complete") -> dict[str, Any]:
    await eventually(
        lambda: condition(sim.store.get("jobs", name, "default"), ctype) is not None,
        f"job {name} {ctype}",
        state=lambda: (sim.store.get("jobs", name, "default") or {}).get("status"),
    )
    return get(sim, "jobs", name)


class Readiness:
    """A runner for containers with a readinessProbe: ready only once the test says so."""

    def __init__(self) -> None:
        self.contexts: dict[str, PodContext] = {}
        self.ready: set[str] = set()

    async def __call__(self, ctx: PodContext) -> int:
        self.contexts[ctx.name] = ctx
        ctx.set_ready(ctx.name in self.ready or "*" in self.ready)
        await asyncio.Event().wait()
        return 0

    def make_ready(self, *names: str) -> None:
        self.ready.update(names)
        for name in names:
            if name in self.contexts:
                self.contexts[name].set_ready(True)


PROBE = {"readinessProbe": {"exec": {"command": ["true"]}}}


@pytest.fixture
async def endpoint_sim() -> AsyncIterator[kubesim.Cluster]:
    """Only the endpoint controllers: pod status is written by the test, not a kubelet."""
    async with kubesim.Cluster(
        nodes=0, kubelet=instant(), controllers=["endpoint", "endpointslice", "garbage-collector"]
    ) as cluster:
        yield cluster


def endpoint_pod(name: str, ip: str, *, ready: bool, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {"app": "web"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [
                container(ports=[{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def add_pod(sim: kubesim.Cluster, pod: dict[str, Any]) -> None:
    status = pod.pop("status")
    created = sim.store.create(pod)
    created["status"] = status
    sim.store.update(created, status=True)


# ----- Services: ClusterIP and node-port allocation ---------------------------------------------


async def test_service_gets_a_cluster_ip_from_the_service_cidr_with_single_stack_defaults(
    sim: kubesim.Cluster,
) -> None:
    created = sim.store.create(service("web", selector={"app": "web"}))
    spec = created["spec"]
    ip = spec["clusterIP"]
    assert ip.startswith("10.")
    assert 96 <= int(ip.split(".")[1]) <= 111
    assert spec["clusterIPs"] == [ip]
    assert spec["ipFamilies"] == ["IPv4"]
    assert spec["ipFamilyPolicy"] == "SingleStack"
    assert spec["internalTrafficPolicy"] == "Cluster"
    assert "externalTrafficPolicy" not in spec
    assert created["status"] == {"loadBalancer": {}}


async def test_requested_cluster_ip_that_is_taken_or_outside_the_range_is_refused(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(service("a", clusterIP="10.96.5.5"))
    with pytest.raises(errors.ApiError) as taken:
        sim.store.create(service("b", clusterIP="10.96.5.5"))
    assert invalid_message(taken).startswith('Service "b" is invalid: ')
    assert (
        'spec.clusterIPs: Invalid value: []string{"10.96.5.5"}: failed to allocate IP '
        "10.96.5.5: provided IP is already allocated"
    ) in invalid_message(taken)
    with pytest.raises(errors.ApiError) as outside:
        sim.store.create(service("c", clusterIP="192.168.1.1"))
    assert (
        "failed to allocate IP 192.168.1.1: the provided IP (192.168.1.1) is not in the valid "
        "range. The range of valid IPs is 10.96.0.0/12"
    ) in invalid_message(outside)
    assert sim.store.get("services", "c", "default") is None


async def test_kubernetes_service_holds_the_first_address_and_points_at_the_api_server(
    sim: kubesim.Cluster,
) -> None:
    kubernetes = get(sim, "services", "kubernetes")
    assert kubernetes["spec"]["clusterIP"] == "10.96.0.1"
    endpoints = get(sim, "endpoints", "kubernetes")
    assert endpoints["subsets"][0]["ports"][0]["port"] == sim.port
    with pytest.raises(errors.ApiError) as taken:
        sim.store.create(service("x", clusterIP="10.96.0.1"))
    assert "provided IP is already allocated" in invalid_message(taken)


async def test_deleting_a_service_releases_its_cluster_ip(sim: kubesim.Cluster) -> None:
    sim.store.create(service("a", clusterIP="10.100.0.9"))
    sim.store.delete("services", "a", "default")
    assert sim.store.create(service("b", clusterIP="10.100.0.9"))["spec"]["clusterIP"] == (
        "10.100.0.9"
    )


async def test_cluster_ip_is_immutable_but_an_update_without_it_keeps_it(
    sim: kubesim.Cluster,
) -> None:
    created = sim.store.create(service("web", type="NodePort"))
    ip, node_port = created["spec"]["clusterIP"], created["spec"]["ports"][0]["nodePort"]
    replacement = service("web", type="NodePort")
    replacement["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    kept = sim.store.update(replacement)
    assert kept["spec"]["clusterIP"] == ip
    assert kept["spec"]["ports"][0]["nodePort"] == node_port
    kept["spec"]["clusterIP"] = "10.96.9.9"
    kept["spec"]["clusterIPs"] = ["10.96.9.9"]
    with pytest.raises(errors.ApiError) as changed:
        sim.store.update(kept)
    assert "may not change once set" in invalid_message(changed)


async def test_node_ports_are_allocated_in_range_and_conflicts_are_refused(
    sim: kubesim.Cluster,
) -> None:
    created = sim.store.create(
        service(
            "np",
            type="NodePort",
            ports=[
                {"name": "http", "port": 80},
                {"name": "https", "port": 443, "nodePort": 30443},
            ],
        )
    )
    ports = created["spec"]["ports"]
    assert 30000 <= ports[0]["nodePort"] <= 32767
    assert ports[1]["nodePort"] == 30443
    assert created["spec"]["externalTrafficPolicy"] == "Cluster"
    with pytest.raises(errors.ApiError) as taken:
        sim.store.create(service("np2", type="NodePort", ports=[{"port": 1, "nodePort": 30443}]))
    assert (
        "spec.ports[0].nodePort: Invalid value: 30443: provided port is already allocated"
        in invalid_message(taken)
    )
    with pytest.raises(errors.ApiError) as outside:
        sim.store.create(service("np3", type="NodePort", ports=[{"port": 1, "nodePort": 80}]))
    assert (
        "provided port is not in the valid range. The range of valid ports is 30000-32767"
        in invalid_message(outside)
    )
    balancer = sim.store.create(service("lb", type="LoadBalancer"))
    assert balancer["spec"]["ports"][0]["nodePort"] >= 30000
    assert balancer["spec"]["allocateLoadBalancerNodePorts"] is True


async def test_changing_the_service_type_allocates_and_gives_back_node_ports(
    sim: kubesim.Cluster,
) -> None:
    created = sim.store.create(service("web"))
    assert "nodePort" not in created["spec"]["ports"][0]
    created["spec"]["type"] = "NodePort"
    node_port = sim.store.update(created)["spec"]["ports"][0]["nodePort"]
    assert 30000 <= node_port <= 32767
    back = get(sim, "services", "web")
    back["spec"]["type"] = "ClusterIP"
    cleared = sim.store.update(back)
    assert "nodePort" not in cleared["spec"]["ports"][0]
    assert "externalTrafficPolicy" not in cleared["spec"]
    other = service("other", type="NodePort", ports=[{"port": 80, "nodePort": node_port}])
    assert sim.store.create(other)["spec"]["ports"][0]["nodePort"] == node_port


async def test_headless_and_external_name_services_get_no_cluster_ip(
    sim: kubesim.Cluster,
) -> None:
    headless = sim.store.create(service("db", clusterIP="None", selector={"app": "db"}))
    assert headless["spec"]["clusterIPs"] == ["None"]
    assert headless["spec"]["ipFamilyPolicy"] == "SingleStack"
    external = sim.store.create(service("ext", type="ExternalName", externalName="example.com"))
    assert "clusterIP" not in external["spec"]
    assert "ipFamilies" not in external["spec"]
    with pytest.raises(errors.ApiError) as missing:
        sim.store.create(service("bad", type="ExternalName"))
    assert "spec.externalName: Required value" in invalid_message(missing)


# ----- Endpoints and EndpointSlices -------------------------------------------------------------


async def test_endpoints_list_ready_and_not_ready_pods_with_named_target_ports(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    sim.store.create(
        service("web", selector={"app": "web"}, ports=[{"port": 80, "targetPort": "http"}])
    )
    add_pod(sim, endpoint_pod("a", "10.1.0.2", ready=True))
    add_pod(sim, endpoint_pod("b", "10.1.0.3", ready=False))
    add_pod(sim, endpoint_pod("other", "10.1.0.4", ready=True, app="other"))
    await sim.wait_for(
        lambda: (
            len(((sim.store.get("endpoints", "web", "default") or {}).get("subsets") or [{}])[0])
            == 3
        ),
        DEADLINE,
        "both address lists",
    )
    endpoints = get(sim, "endpoints", "web")
    subset = endpoints["subsets"][0]
    assert [a["ip"] for a in subset["addresses"]] == ["10.1.0.2"]
    assert subset["addresses"][0]["targetRef"]["name"] == "a"
    assert subset["addresses"][0]["nodeName"] == "node-1"
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["10.1.0.3"]
    assert subset["ports"] == [{"port": 8080, "protocol": "TCP"}]
    assert endpoints["metadata"]["labels"]["endpoints.kubernetes.io/managed-by"] == (
        "endpoint-controller"
    )


async def test_publish_not_ready_addresses_publishes_every_pod_as_ready(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    sim.store.create(service("web", selector={"app": "web"}, publishNotReadyAddresses=True))
    add_pod(sim, endpoint_pod("b", "10.1.0.3", ready=False))
    await sim.wait_for(
        lambda: bool((sim.store.get("endpoints", "web", "default") or {}).get("subsets")), DEADLINE
    )
    subset = get(sim, "endpoints", "web")["subsets"][0]
    assert [a["ip"] for a in subset["addresses"]] == ["10.1.0.3"]
    assert "notReadyAddresses" not in subset


async def test_endpointslices_carry_labels_owner_and_conditions_and_a_placeholder_when_empty(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    svc = sim.store.create(
        service("web", selector={"app": "web"}, ports=[{"name": "web", "port": 80}])
    )
    selector = "kubernetes.io/service-name=web"
    await sim.wait_for(
        lambda: len(sim.store.list("endpointslices", "default", selector)) == 1, DEADLINE
    )
    placeholder = sim.store.list("endpointslices", "default", selector)[0]
    assert placeholder.get("endpoints") is None
    assert placeholder.get("ports") is None
    assert placeholder["metadata"]["name"].startswith("web-")
    assert placeholder["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == (
        "endpointslice-controller.k8s.io"
    )
    assert placeholder["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
    add_pod(sim, endpoint_pod("a", "10.1.0.2", ready=True))
    add_pod(sim, endpoint_pod("b", "10.1.0.3", ready=False))

    def endpoints_listed() -> list[Any]:
        found = sim.store.list("endpointslices", "default", selector)
        return list(found[0].get("endpoints") or []) if len(found) == 1 else []

    await sim.wait_for(lambda: len(endpoints_listed()) == 2, DEADLINE)
    current = sim.store.list("endpointslices", "default", selector)[0]
    assert current["metadata"]["name"] == placeholder["metadata"]["name"]
    assert current["addressType"] == "IPv4"
    assert current["ports"] == [{"name": "web", "port": 80, "protocol": "TCP"}]
    by_ip = {e["addresses"][0]: e for e in current["endpoints"]}
    assert by_ip["10.1.0.2"]["conditions"] == {"ready": True, "serving": True, "terminating": False}
    assert by_ip["10.1.0.3"]["conditions"] == {
        "ready": False,
        "serving": False,
        "terminating": False,
    }
    assert by_ip["10.1.0.2"]["targetRef"]["name"] == "a"


async def test_terminating_pod_leaves_endpoints_but_stays_in_its_slice_as_terminating(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    sim.store.create(service("web", selector={"app": "web"}))
    pod = endpoint_pod("a", "10.1.0.2", ready=True)
    pod["metadata"]["finalizers"] = ["example.com/hold"]
    add_pod(sim, pod)
    await sim.wait_for(
        lambda: bool((sim.store.get("endpoints", "web", "default") or {}).get("subsets")), DEADLINE
    )
    sim.store.delete("pods", "a", "default")
    await sim.wait_for(
        lambda: not (sim.store.get("endpoints", "web", "default") or {}).get("subsets"), DEADLINE
    )
    endpoint = sim.store.list("endpointslices", "default", "kubernetes.io/service-name=web")[0][
        "endpoints"
    ][0]
    assert endpoint["conditions"] == {"ready": False, "serving": True, "terminating": True}


async def test_service_without_selector_gets_no_managed_endpoints(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    sim.store.create(service("manual"))
    add_pod(sim, endpoint_pod("a", "10.1.0.2", ready=True))
    await sim.settle(timeout=DEADLINE)
    assert sim.store.get("endpoints", "manual", "default") is None
    assert sim.store.list("endpointslices", "default", "kubernetes.io/service-name=manual") == []


async def test_endpoints_sync_rederives_only_changed_pods_and_keeps_same_ip_pods_apart(
    endpoint_sim: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = endpoint_sim
    sim.store.create(service("web", selector={"app": "web"}, ports=[{"port": 80}]))
    for index in range(120):
        add_pod(sim, endpoint_pod(f"p{index:03d}", f"10.1.0.{index + 2}", ready=True))
    # Two host-network pods share their node's IP: upstream keys addresses by IP and pod.
    add_pod(sim, endpoint_pod("host-a", "10.2.0.1", ready=True))
    add_pod(sim, endpoint_pod("host-b", "10.2.0.1", ready=True))

    def addresses(field: str = "addresses") -> list[Any]:
        found = sim.store.get("endpoints", "web", "default") or {}
        return [a for s in found.get("subsets") or [] for a in s.get(field) or []]

    await sim.wait_for(lambda: len(addresses()) == 122, DEADLINE)
    assert [a["targetRef"]["name"] for a in addresses()][-2:] == ["host-a", "host-b"]
    await sim.settle(timeout=DEADLINE)
    derived: list[str] = []
    original = endpoints_controller._address

    def address(service: dict[str, Any], pod: dict[str, Any]) -> Any:
        derived.append(pod["metadata"]["name"])
        return original(service, pod)

    monkeypatch.setattr(endpoints_controller, "_address", address)
    pod = sim.store.get("pods", "p050", "default")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    sim.store.update(pod, status=True)
    await sim.wait_for(
        lambda: [a["targetRef"]["name"] for a in addresses("notReadyAddresses")] == ["p050"],
        DEADLINE,
    )
    assert derived == ["p050"]
    ips = [a["ip"] for a in addresses()]
    assert len(ips) == 121
    assert ips[:2] == ["10.1.0.2", "10.1.0.3"]
    assert "10.1.0.52" not in ips
    sim.store.delete("pods", "host-a", "default")
    await sim.wait_for(
        lambda: (
            [a["targetRef"]["name"] for a in addresses()][-1:] == ["host-b"]
            and len(addresses()) == 120
        ),
        DEADLINE,
    )


async def test_endpointslice_zone_follows_its_node_zone_label_without_a_pod_change(
    endpoint_sim: kubesim.Cluster,
) -> None:
    sim = endpoint_sim
    zone = "topology.kubernetes.io/zone"
    sim.store.create(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {zone: "a"}}}
    )
    sim.store.create(service("web", selector={"app": "web"}))
    add_pod(sim, endpoint_pod("a", "10.1.0.2", ready=True))
    add_pod(sim, endpoint_pod("b", "10.1.0.3", ready=True))

    def zones() -> list[Any]:
        found = sim.store.list("endpointslices", "default", "kubernetes.io/service-name=web")
        return [e.get("zone") for s in found for e in s.get("endpoints") or []]

    await sim.wait_for(lambda: zones() == ["a", "a"], DEADLINE)
    node = sim.store.get("nodes", "node-1")
    node["metadata"]["labels"][zone] = "b"
    sim.store.update(node)
    # The real controller watches nodes: the slice follows the zone with no pod changing.
    await sim.wait_for(lambda: zones() == ["b", "b"], DEADLINE)
    node = sim.store.get("nodes", "node-1")
    del node["metadata"]["labels"][zone]
    sim.store.update(node)
    await sim.wait_for(lambda: zones() == [None, None], DEADLINE)
    endpoint = sim.store.list("endpointslices", "default", "kubernetes.io/service-name=web")[0][
        "endpoints"
    ][0]
    assert list(endpoint) == ["addresses", "conditions", "nodeName", "targetRef"]


async def test_endpointslice_sync_rederives_only_changed_pods_and_ignores_its_own_writes(
    endpoint_sim: kubesim.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = endpoint_sim
    sim.store.create(service("web", selector={"app": "web"}))
    for index in range(150):
        add_pod(sim, endpoint_pod(f"p{index:03d}", f"10.1.{index // 100}.{index % 100 + 2}",
                                  ready=True))  # fmt: skip
    selector = "kubernetes.io/service-name=web"

    def listed() -> list[Any]:
        found = sim.store.list("endpointslices", "default", selector)
        return [e for s in found for e in s.get("endpoints") or []]

    await sim.wait_for(lambda: len(listed()) == 150, DEADLINE)
    await sim.settle(timeout=DEADLINE)
    controller = sim.controllers["endpointslice"]
    assert isinstance(controller, EndpointSliceController)
    derived: list[str] = []
    syncs: list[Any] = []
    original_entry, original_reconcile = controller._entry, controller.reconcile

    def entry(service: dict[str, Any], pod: dict[str, Any]) -> Any:
        derived.append(pod["metadata"]["name"])
        return original_entry(service, pod)

    def reconcile(key: Any) -> None:
        syncs.append(key)
        original_reconcile(key)

    monkeypatch.setattr(controller, "_entry", entry)
    monkeypatch.setattr(controller, "reconcile", reconcile)
    before = [e["targetRef"]["name"] for e in listed()]
    pod = sim.store.get("pods", "p007", "default")
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    sim.store.update(pod, status=True)
    await sim.wait_for(
        lambda: any(e["targetRef"]["name"] == "p007" and not e["conditions"]["ready"]
                    for e in listed()),
        DEADLINE,
    )  # fmt: skip
    # A requeue would come after the batch delay of 150 pods (batch_delay: 0.03 s).
    await asyncio.sleep(10 * batch_delay(150))
    await sim.settle(timeout=DEADLINE)
    assert derived == ["p007"]
    # One sync for the pod change; the slice write it made does not queue another.
    assert syncs == [("default", "web")]
    # The changed endpoint is updated in place: every slice lists the same pods in the same order.
    assert [e["targetRef"]["name"] for e in listed()] == before


# ----- Jobs -------------------------------------------------------------------------------------


async def test_job_runs_to_its_completions_and_reports_success_then_complete(
    sim: kubesim.Cluster,
) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    created = sim.store.create(job("work", completions=3, parallelism=2))
    uid = created["metadata"]["uid"]
    template_labels = created["spec"]["template"]["metadata"]["labels"]
    assert template_labels == {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "work",
        "controller-uid": uid,
        "job-name": "work",
    }
    assert created["spec"]["selector"] == {
        "matchLabels": {"batch.kubernetes.io/controller-uid": uid}
    }
    assert created["metadata"]["labels"] == template_labels
    finished = await finish(sim, "work")
    status = finished["status"]
    assert status["succeeded"] == 3
    assert "active" not in status
    assert (status["ready"], status["terminating"]) == (0, 0)
    assert status["uncountedTerminatedPods"] == {}
    assert status["startTime"] <= status["completionTime"]
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert {c["reason"] for c in status["conditions"]} == {"CompletionsReached"}
    job_pods = pods(sim, "job-name=work")
    assert len(job_pods) == 3
    assert all(not p["metadata"].get("finalizers") for p in job_pods)
    assert all(p["status"]["phase"] == "Succeeded" for p in job_pods)
    recorded = events(sim, "work")
    assert sum(1 for e in recorded if e[1] == "SuccessfulCreate") == 3
    assert ("Normal", "Completed", "Job completed") in recorded


async def test_job_pods_hold_the_tracking_finalizer_while_they_run(sim: kubesim.Cluster) -> None:
    readiness = Readiness()
    sim.register_pod_runner(readiness, image=TASK)
    sim.store.create(job("slow", pod={"containers": [container(**PROBE)]}))
    await sim.wait_for(lambda: len(pods(sim, "job-name=slow")) == 1, DEADLINE)
    pod = pods(sim, "job-name=slow")[0]
    assert pod["metadata"]["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    await sim.wait_for(
        lambda: (get(sim, "jobs", "slow").get("status") or {}).get("active") == 1, DEADLINE
    )


@pytest.mark.parametrize("propagation", ["Background", "Foreground"])
async def test_deleting_a_running_job_takes_its_pods_with_it(
    sim: kubesim.Cluster, propagation: str
) -> None:
    sim.register_pod_runner(Readiness(), image=TASK)
    sim.store.create(job("gone", parallelism=2, completions=2))
    await sim.wait_for(lambda: len(pods(sim, "job-name=gone")) == 2, DEADLINE)
    sim.store.delete("jobs", "gone", "default", propagation=propagation)
    await sim.wait_for(lambda: not pods(sim, "job-name=gone"), DEADLINE, "pods deleted")
    await sim.wait_for(lambda: sim.store.get("jobs", "gone", "default") is None, DEADLINE)


async def test_a_manual_selector_is_required_to_choose_the_selector(sim: kubesim.Cluster) -> None:
    chosen = job("mine", selector={"matchLabels": {"run": "mine"}})
    chosen["spec"]["template"]["metadata"] = {"labels": {"run": "mine"}}
    with pytest.raises(errors.ApiError) as refused:
        sim.store.create(chosen)
    assert "`selector` not auto-generated" in invalid_message(refused)
    chosen["spec"]["manualSelector"] = True
    created = sim.store.create(chosen)
    assert created["spec"]["selector"] == {"matchLabels": {"run": "mine"}}
    assert created["spec"]["template"]["metadata"]["labels"] == {"run": "mine"}


async def test_job_fails_after_its_backoff_limit_with_failure_target_then_failed(
    sim: kubesim.Cluster,
) -> None:
    async def crash(ctx: PodContext) -> int:
        return 2

    sim.register_pod_runner(crash, image=TASK)
    sim.store.create(job("doomed", backoffLimit=1))
    failed = await finish(sim, "doomed", "Failed")
    status = failed["status"]
    assert status["failed"] == 2
    assert "completionTime" not in status
    assert [(c["type"], c["reason"]) for c in status["conditions"]] == [
        ("FailureTarget", "BackoffLimitExceeded"),
        ("Failed", "BackoffLimitExceeded"),
    ]
    assert status["conditions"][1]["message"] == "Job has reached the specified backoff limit"
    assert (
        "Warning",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    ) in events(sim, "doomed")


async def test_pod_failure_policy_fails_the_job_on_a_matching_exit_code(
    sim: kubesim.Cluster,
) -> None:
    async def fatal(ctx: PodContext) -> int:
        return 42

    sim.register_pod_runner(fatal, image=TASK)
    policy = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}
    sim.store.create(job("strict", backoffLimit=5, podFailurePolicy=policy))
    failed = await finish(sim, "strict", "Failed")
    reason = condition(failed, "Failed")
    assert reason is not None
    assert reason["reason"] == "PodFailurePolicy"
    assert "failed with exit code 42 matching FailJob rule at index 0" in reason["message"]
    assert failed["status"]["failed"] == 1


async def test_active_deadline_fails_the_job_when_the_clock_passes_it(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(Readiness(), image=TASK)
    sim.store.create(job("bounded", activeDeadlineSeconds=600))
    await sim.wait_for(
        lambda: (get(sim, "jobs", "bounded").get("status") or {}).get("active") == 1, DEADLINE
    )
    await sim.settle(timeout=DEADLINE)
    assert condition(get(sim, "jobs", "bounded"), "FailureTarget") is None
    sim.clock.advance(601)
    failed = await finish(sim, "bounded", "Failed")
    assert condition(failed, "Failed") is not None
    assert condition(failed, "Failed")["reason"] == "DeadlineExceeded"  # type: ignore[index]
    assert not [p for p in pods(sim, "job-name=bounded") if p["status"]["phase"] == "Running"]


async def test_ttl_after_finished_deletes_the_job_and_its_pods(sim: kubesim.Cluster) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(job("brief", ttlSecondsAfterFinished=100))
    await finish(sim, "brief")
    await sim.settle(timeout=DEADLINE)
    assert sim.store.get("jobs", "brief", "default") is not None
    sim.clock.advance(101)
    await sim.wait_for(lambda: sim.store.get("jobs", "brief", "default") is None, DEADLINE)
    await sim.wait_for(lambda: not pods(sim, "job-name=brief"), DEADLINE)


async def test_indexed_job_gives_each_pod_its_index_label_hostname_and_env(
    sim: kubesim.Cluster,
) -> None:
    seen: dict[str, str] = {}

    async def done(ctx: PodContext) -> int:
        seen[ctx.name] = ctx.pod["spec"]["hostname"]
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(job("shards", completions=3, parallelism=3, completionMode="Indexed"))
    finished = await finish(sim, "shards")
    assert finished["status"]["completedIndexes"] == "0-2"
    assert finished["status"]["succeeded"] == 3
    by_index = {
        p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]: p
        for p in pods(sim, "job-name=shards")
    }
    assert sorted(by_index) == ["0", "1", "2"]
    first = by_index["0"]
    assert first["metadata"]["name"].startswith("shards-0-")
    assert first["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert first["spec"]["hostname"] == "shards-0"
    env = first["spec"]["containers"][0]["env"]
    assert env[0]["name"] == "JOB_COMPLETION_INDEX"
    assert sorted(seen.values()) == ["shards-0", "shards-1", "shards-2"]


async def test_suspended_job_starts_no_pods_until_it_is_resumed(sim: kubesim.Cluster) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(job("later", suspend=True))
    await sim.settle(timeout=DEADLINE)
    suspended = get(sim, "jobs", "later")
    assert not pods(sim, "job-name=later")
    assert condition(suspended, "Suspended") is not None
    assert condition(suspended, "Suspended")["reason"] == "JobSuspended"  # type: ignore[index]
    assert "startTime" not in suspended["status"]
    sim.store.patch("jobs", "later", {"spec": {"suspend": False}}, "default")
    resumed = await finish(sim, "later")
    assert condition(resumed, "Suspended")["status"] == "False"  # type: ignore[index]
    assert ("Normal", "Resumed", "Job resumed") in events(sim, "later")


# ----- CronJobs -------------------------------------------------------------------------------


def test_cron_schedules_parse_ranges_steps_names_macros_and_either_day_field() -> None:
    saturday = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
    assert cron.parse("*/15 9-17 * * MON-FRI").next_after(saturday) == dt.datetime(
        2024, 6, 3, 9, 0, tzinfo=dt.UTC
    )
    assert cron.parse("@hourly").next_after(saturday) == dt.datetime(
        2024, 6, 1, 13, 0, tzinfo=dt.UTC
    )
    # Both day fields restricted: the 13th or a Friday, whichever comes first.
    assert cron.parse("0 0 13 * 5").next_after(saturday) == dt.datetime(
        2024, 6, 7, 0, 0, tzinfo=dt.UTC
    )
    assert cron.parse("0 0 1 jan,jul ?").next_after(saturday) == dt.datetime(
        2024, 7, 1, tzinfo=dt.UTC
    )
    new_york = cron.time_zone("America/New_York")
    assert cron.parse("0 9 * * *").next_after(saturday, new_york) == dt.datetime(
        2024, 6, 1, 13, 0, tzinfo=dt.UTC
    )
    latest, missed = cron.parse("* * * * *").most_recent(
        dt.datetime(2020, 1, 1, tzinfo=dt.UTC), saturday
    )
    assert latest == saturday
    assert missed > 100
    for bad, reason in (
        ("* * *", "expected exactly 5 fields, found 3"),
        ("61 * * * *", "end of range (61) above maximum (59)"),
        ("x * * * *", "failed to parse int from x"),
        ("@fortnightly", "unrecognized descriptor"),
    ):
        with pytest.raises(
            cron.ScheduleError, match=reason.replace("(", r"\(").replace(")", r"\)")
        ):
            cron.parse(bad)


def cronjob(name: str, schedule: str = "*/5 * * * *", **spec: Any) -> dict[str, Any]:
    job_spec = job(name)["spec"]
    job_spec.update(spec.pop("job", {}))
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": schedule,
            "jobTemplate": {"metadata": {"labels": {"cron": name}}, "spec": job_spec},
            **spec,
        },
    }


def cron_jobs(sim: kubesim.Cluster, name: str) -> list[dict[str, Any]]:
    return sim.store.list("jobs", "default", label_selector=f"cron={name}")


async def test_cronjob_creates_a_job_for_each_firing_as_the_clock_advances(
    sim: kubesim.Cluster,
) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(cronjob("tick"))
    await sim.settle(timeout=DEADLINE)
    assert cron_jobs(sim, "tick") == []
    sim.clock.advance(300)
    await sim.wait_for(lambda: len(cron_jobs(sim, "tick")) == 1, DEADLINE, "first firing")
    created = cron_jobs(sim, "tick")[0]
    scheduled = created["metadata"]["annotations"][
        "batch.kubernetes.io/cronjob-scheduled-timestamp"
    ]
    moment = dt.datetime.fromisoformat(scheduled.replace("Z", "+00:00"))
    assert moment.minute % 5 == 0
    assert moment.second == 0
    assert created["metadata"]["name"] == f"tick-{int(moment.timestamp()) // 60}"
    assert created["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
    await finish(sim, created["metadata"]["name"])
    await sim.wait_for(
        lambda: "lastSuccessfulTime" in (get(sim, "cronjobs", "tick").get("status") or {}), DEADLINE
    )
    status = get(sim, "cronjobs", "tick")["status"]
    assert status["lastScheduleTime"] == scheduled
    assert "active" not in status
    recorded = events(sim, "tick")
    assert ("Normal", "SuccessfulCreate", f"Created job {created['metadata']['name']}") in recorded
    assert any(e[1] == "SawCompletedJob" and e[2].endswith("condition: Complete") for e in recorded)
    sim.clock.advance(300)
    await sim.wait_for(lambda: len(cron_jobs(sim, "tick")) == 2, DEADLINE, "second firing")


async def test_forbid_skips_a_firing_while_a_job_runs_and_replace_deletes_it(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(Readiness(), image=TASK)
    sim.store.create(cronjob("only", concurrencyPolicy="Forbid"))
    sim.store.create(cronjob("fresh", concurrencyPolicy="Replace"))
    sim.clock.advance(300)
    await sim.wait_for(
        lambda: len(cron_jobs(sim, "only")) == 1 and len(cron_jobs(sim, "fresh")) == 1, DEADLINE
    )
    first_fresh = cron_jobs(sim, "fresh")[0]["metadata"]["name"]
    sim.clock.advance(300)
    await sim.wait_for(
        lambda: any(e[1] == "JobAlreadyActive" for e in events(sim, "only")), DEADLINE, "forbid"
    )
    await sim.wait_for(
        lambda: (
            [
                j["metadata"]["name"]
                for j in cron_jobs(sim, "fresh")
                if not j["metadata"].get("deletionTimestamp")
            ]
            not in ([], [first_fresh])
        ),
        DEADLINE,
        "replacement",
    )
    assert len(cron_jobs(sim, "only")) == 1
    assert ("Normal", "SuccessfulDelete", f"Deleted job {first_fresh}") in events(sim, "fresh")


async def test_a_firing_older_than_the_starting_deadline_is_skipped(
    sim: kubesim.Cluster,
) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(cronjob("late", schedule="0 * * * *", startingDeadlineSeconds=10))
    # Past the top of the hour by more than ten seconds: that firing is never started.
    now = sim.clock.now()
    sim.clock.advance(3600 - now.minute * 60 - now.second + 120)
    await sim.settle(timeout=DEADLINE)
    assert cron_jobs(sim, "late") == []
    # The next firing is started when the controller wakes for it, within the deadline.
    sim.clock.advance(3600 - 120)
    await sim.wait_for(lambda: len(cron_jobs(sim, "late")) == 1, DEADLINE)


async def test_finished_jobs_beyond_the_history_limit_are_deleted_oldest_first(
    sim: kubesim.Cluster,
) -> None:
    async def done(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(done, image=TASK)
    sim.store.create(cronjob("kept", schedule="* * * * *", successfulJobsHistoryLimit=1))
    sim.clock.advance(60)
    await sim.wait_for(lambda: len(names_of(cron_jobs(sim, "kept"))) == 1, DEADLINE)
    (first,) = names_of(cron_jobs(sim, "kept"))
    await finish(sim, first)
    sim.clock.advance(60)
    await sim.wait_for(lambda: len(cron_jobs(sim, "kept")) == 2, DEADLINE, "second job")
    second = next(n for n in names_of(cron_jobs(sim, "kept")) if n != first)
    await finish(sim, second)
    await sim.wait_for(lambda: names_of(cron_jobs(sim, "kept")) == [second], DEADLINE, "cleanup")
    assert ("Normal", "SuccessfulDelete", f"Deleted job {first}") in events(sim, "kept")


def names_of(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp")]


async def test_suspended_cronjob_creates_no_jobs(sim: kubesim.Cluster) -> None:
    sim.store.create(cronjob("paused", suspend=True))
    sim.clock.advance(900)
    await sim.settle(timeout=DEADLINE)
    assert cron_jobs(sim, "paused") == []


# ----- StatefulSets ---------------------------------------------------------------------------


async def test_ordered_ready_statefulset_creates_pods_one_at_a_time_in_order(
    sim: kubesim.Cluster,
) -> None:
    readiness = Readiness()
    sim.register_pod_runner(readiness, image="example/db")
    sts = workload(
        "StatefulSet",
        "db",
        3,
        serviceName="db",
        pod={"containers": [container("example/db:1", **PROBE)]},
    )
    sim.store.create(sts)
    await sim.wait_for(lambda: [p["metadata"]["name"] for p in pods(sim)] == ["db-0"], DEADLINE)
    await sim.settle(timeout=DEADLINE)
    assert [p["metadata"]["name"] for p in pods(sim)] == ["db-0"]
    first = pods(sim)[0]
    assert first["spec"]["hostname"] == "db-0"
    assert first["spec"]["subdomain"] == "db"
    labels = first["metadata"]["labels"]
    assert labels["statefulset.kubernetes.io/pod-name"] == "db-0"
    assert labels["apps.kubernetes.io/pod-index"] == "0"
    assert labels["controller-revision-hash"].startswith("db-")
    readiness.make_ready("db-0")
    await sim.wait_for(lambda: len(pods(sim)) == 2, DEADLINE)
    readiness.make_ready("db-1", "db-2")
    await sim.wait_for(
        lambda: (get(sim, "statefulsets", "db").get("status") or {}).get("readyReplicas") == 3,
        DEADLINE,
    )
    status = get(sim, "statefulsets", "db")["status"]
    assert status["replicas"] == status["currentReplicas"] == status["updatedReplicas"] == 3
    assert status["availableReplicas"] == 3
    assert (
        status["currentRevision"] == status["updateRevision"] == labels["controller-revision-hash"]
    )
    assert status["collisionCount"] == 0
    assert status["observedGeneration"] == 1
    revisions = sim.store.list("controllerrevisions", "default")
    assert [r["metadata"]["name"] for r in revisions] == [status["updateRevision"]]
    created = [e[2] for e in events(sim, "db") if e[1] == "SuccessfulCreate"]
    assert created == [f"create Pod db-{i} in StatefulSet db successful" for i in range(3)]


async def test_parallel_statefulset_creates_all_pods_at_once_and_scales_down_from_the_top(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(Readiness(), image="example/db")
    sts = workload(
        "StatefulSet",
        "db",
        3,
        podManagementPolicy="Parallel",
        pod={"containers": [container("example/db:1", **PROBE)]},
    )
    sim.store.create(sts)
    await sim.wait_for(lambda: len(pods(sim)) == 3, DEADLINE)
    sim.store.patch("statefulsets", "db", {"spec": {"replicas": 1}}, "default")
    await sim.wait_for(lambda: [p["metadata"]["name"] for p in pods(sim)] == ["db-0"], DEADLINE)
    deleted = [e[2] for e in events(sim, "db") if e[1] == "SuccessfulDelete"]
    assert sorted(deleted) == [
        "delete Pod db-1 in StatefulSet db successful",
        "delete Pod db-2 in StatefulSet db successful",
    ]


async def test_ordered_scale_down_removes_the_highest_ordinal_first(sim: kubesim.Cluster) -> None:
    sim.store.create(workload("StatefulSet", "db", 3))
    await sim.wait_for(
        lambda: (get(sim, "statefulsets", "db").get("status") or {}).get("readyReplicas") == 3,
        DEADLINE,
    )
    sim.store.patch("statefulsets", "db", {"spec": {"replicas": 1}}, "default")
    await sim.wait_for(lambda: [p["metadata"]["name"] for p in pods(sim)] == ["db-0"], DEADLINE)
    deleted = [e[2] for e in events(sim, "db") if e[1] == "SuccessfulDelete"]
    assert deleted == [
        "delete Pod db-2 in StatefulSet db successful",
        "delete Pod db-1 in StatefulSet db successful",
    ]


async def test_rolling_update_replaces_pods_from_the_top_down_to_the_partition(
    sim: kubesim.Cluster,
) -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}
    sim.store.create(workload("StatefulSet", "db", 3, updateStrategy=strategy))
    await sim.wait_for(
        lambda: (get(sim, "statefulsets", "db").get("status") or {}).get("readyReplicas") == 3,
        DEADLINE,
    )
    old_revision = get(sim, "statefulsets", "db")["status"]["currentRevision"]
    patch = {"spec": {"template": {"spec": {"containers": [container("example/db:2")]}}}}
    sim.store.patch("statefulsets", "db", patch, "default")

    def revisions() -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["metadata"]["labels"]["controller-revision-hash"]
            for p in pods(sim)
            if not p["metadata"].get("deletionTimestamp")
        }

    await sim.wait_for(
        lambda: (
            (get(sim, "statefulsets", "db").get("status") or {}).get("updatedReplicas") == 2
            and (get(sim, "statefulsets", "db").get("status") or {}).get("readyReplicas") == 3
        ),
        DEADLINE,
    )
    await sim.settle(timeout=DEADLINE)
    status = get(sim, "statefulsets", "db")["status"]
    new_revision = status["updateRevision"]
    assert new_revision != old_revision
    assert revisions() == {"db-0": old_revision, "db-1": new_revision, "db-2": new_revision}
    assert status["currentRevision"] == old_revision
    assert status["currentReplicas"] == 1
    deleted = [e[2] for e in events(sim, "db") if e[1] == "SuccessfulDelete"]
    assert deleted == [
        "delete Pod db-2 in StatefulSet db successful",
        "delete Pod db-1 in StatefulSet db successful",
    ]
    sim.store.patch(
        "statefulsets",
        "db",
        {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}},
        "default",
    )
    await sim.wait_for(
        lambda: (
            (get(sim, "statefulsets", "db").get("status") or {}).get("currentRevision")
            == new_revision
        ),
        DEADLINE,
    )
    assert set(revisions().values()) == {new_revision}
    numbers = sorted(r["revision"] for r in sim.store.list("controllerrevisions", "default"))
    assert numbers == [1, 2]


async def test_volume_claim_templates_become_claims_per_pod(sim: kubesim.Cluster) -> None:
    claim = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    sim.store.create(workload("StatefulSet", "db", 2, volumeClaimTemplates=[claim]))
    await sim.wait_for(
        lambda: len(sim.store.list("persistentvolumeclaims", "default")) == 2, DEADLINE
    )
    claims = sim.store.list("persistentvolumeclaims", "default")
    assert [c["metadata"]["name"] for c in claims] == ["data-db-0", "data-db-1"]
    assert claims[0]["metadata"]["labels"] == {"app": "db"}
    assert claims[0]["status"]["phase"] == "Pending"
    volumes = get(sim, "pods", "db-0")["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}} in volumes


# ----- the scale subresource and HPAs -----------------------------------------------------------


async def test_scale_subresource_reads_and_writes_the_replica_count(
    sim: kubesim.Cluster, api: Api
) -> None:
    sim.store.create(workload("Deployment", "web", 2))
    path = "/apis/apps/v1/namespaces/default/deployments/web/scale"
    await sim.wait_for(
        lambda: (get(sim, "deployments", "web").get("status") or {}).get("replicas") == 2, DEADLINE
    )
    scale = await api.ok("GET", path)
    assert scale["kind"] == "Scale"
    assert scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2}
    assert scale["status"] == {"replicas": 2, "selector": "app=web"}
    patched = await api.ok(
        "PATCH", path, {"spec": {"replicas": 3}}, ctype="application/merge-patch+json"
    )
    assert patched["spec"]["replicas"] == 3
    assert get(sim, "deployments", "web")["spec"]["replicas"] == 3
    json_patched = await api.ok(
        "PATCH",
        path,
        [{"op": "replace", "path": "/spec/replicas", "value": 4}],
        ctype="application/json-patch+json",
    )
    assert json_patched["spec"]["replicas"] == 4
    stale = {**scale, "spec": {"replicas": 1}}
    status, body = await api.req("PUT", path, stale)
    assert (status, body["reason"]) == (409, "Conflict")

    async def put_replicas(replicas: int) -> tuple[int, dict[str, Any]]:
        # A GET-modify-PUT races the deployment controller's status writes (they move the
        # Scale's resourceVersion too): retried on 409 as client-go's RetryOnConflict does.
        for _ in range(20):
            fresh = await api.ok("GET", path)
            fresh["spec"]["replicas"] = replicas
            status, body = await api.req("PUT", path, fresh)
            if status != 409:
                return status, body
        raise AssertionError("the Scale PUT conflicted 20 times in a row")

    status, body = await put_replicas(1)
    assert (status, body["spec"]["replicas"]) == (200, 1)
    status, body = await put_replicas(-1)
    assert status == 422
    assert "spec.replicas: Invalid value: -1: must be greater than or equal to 0" in body["message"]
    sim.store.create(workload("StatefulSet", "db", 1))
    sts_scale = await api.ok(
        "PATCH",
        "/apis/apps/v1/namespaces/default/statefulsets/db/scale",
        {"spec": {"replicas": 2}},
        ctype="application/strategic-merge-patch+json",
    )
    assert sts_scale["spec"]["replicas"] == 2


async def test_horizontal_pod_autoscalers_are_stored_with_v2_defaults(
    sim: kubesim.Cluster, api: Api
) -> None:
    body = {
        "apiVersion": "autoscaling/v1",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "maxReplicas": 5,
            "targetCPUUtilizationPercentage": 60,
        },
    }
    await api.ok("POST", "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", body)
    stored = await api.ok(
        "GET", "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web"
    )
    assert stored["spec"]["minReplicas"] == 1
    assert stored["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 60},
            },
        }
    ]


# ----- Deployments: revisions, rollouts, events --------------------------------------------------


def replica_sets(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return sim.store.list("replicasets", "default")


def revision_of(obj: dict[str, Any]) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision")


async def rolled_out(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    def done() -> bool:
        deploy = get(sim, "deployments", name)
        progressing = condition(deploy, "Progressing") or {}
        return (
            progressing.get("reason") == "NewReplicaSetAvailable"
            and deploy["status"].get("observedGeneration") == deploy["metadata"]["generation"]
            and deploy["status"].get("replicas") == deploy["spec"]["replicas"]
        )

    await eventually(
        done, f"{name} rolled out", state=lambda: get(sim, "deployments", name).get("status")
    )
    return get(sim, "deployments", name)


async def test_deployment_and_its_replica_sets_carry_revision_and_replica_annotations(
    sim: kubesim.Cluster,
) -> None:
    created = workload("Deployment", "web", 4)
    created["metadata"]["annotations"] = {"kubernetes.io/change-cause": "first"}
    sim.store.create(created)
    deploy = await rolled_out(sim, "web")
    assert revision_of(deploy) == "1"
    (rs,) = replica_sets(sim)
    annotations = rs["metadata"]["annotations"]
    assert annotations["deployment.kubernetes.io/revision"] == "1"
    assert annotations["deployment.kubernetes.io/desired-replicas"] == "4"
    assert annotations["deployment.kubernetes.io/max-replicas"] == "5"
    assert annotations["kubernetes.io/change-cause"] == "first"
    assert rs["metadata"]["labels"]["pod-template-hash"] in rs["metadata"]["name"]
    assert [c["type"] for c in deploy["status"]["conditions"]] == ["Available", "Progressing"]
    assert condition(deploy, "Available")["reason"] == "MinimumReplicasAvailable"  # type: ignore[index]
    assert (
        "Normal",
        "ScalingReplicaSet",
        f"Scaled up replica set {rs['metadata']['name']} from 0 to 4",
    ) in events(sim, "web")
    rs_events = events(sim, rs["metadata"]["name"])
    assert (
        sum(1 for e in rs_events if e[1] == "SuccessfulCreate" and e[2].startswith("Created pod: "))
        == 4
    )


async def test_rolling_update_surges_and_scales_the_old_replica_set_down(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(workload("Deployment", "web", 4))
    await rolled_out(sim, "web")
    old_name = replica_sets(sim)[0]["metadata"]["name"]
    patch = {"spec": {"template": {"spec": {"containers": [container("example/web:2")]}}}}
    sim.store.patch("deployments", "web", patch, "default")
    deploy = await rolled_out(sim, "web")
    assert revision_of(deploy) == "2"
    by_name = {rs["metadata"]["name"]: rs for rs in replica_sets(sim)}
    assert by_name[old_name]["spec"]["replicas"] == 0
    (new_name,) = [n for n in by_name if n != old_name]
    assert revision_of(by_name[new_name]) == "2"
    messages = [e[2] for e in events(sim, "web") if e[1] == "ScalingReplicaSet"]
    # maxSurge 25% of 4 is one pod: the new set grows one at a time.
    assert f"Scaled up replica set {new_name} from 0 to 1" in messages
    assert f"Scaled down replica set {old_name} from 4 to 3" in messages
    assert f"Scaled down replica set {old_name} from 1 to 0" in messages


async def test_scaling_during_a_stuck_rollout_spreads_replicas_proportionally(
    sim: kubesim.Cluster,
) -> None:
    readiness = Readiness()
    readiness.ready.add("*")
    sim.register_pod_runner(readiness, image="example/web:1")
    sim.register_pod_runner(Readiness(), image="example/web:2")  # never ready
    sim.store.create(
        workload("Deployment", "web", 10, pod={"containers": [container("example/web:1", **PROBE)]})
    )
    await rolled_out(sim, "web")
    new_template = {"containers": [container("example/web:2", **PROBE)]}
    sim.store.patch("deployments", "web", {"spec": {"template": {"spec": new_template}}}, "default")

    def sizes() -> list[int]:
        return sorted(rs["spec"]["replicas"] for rs in replica_sets(sim))

    # 25% of 10: surge 3 (rounded up), unavailable 2 (rounded down): 8 old + 5 new.
    await sim.wait_for(lambda: sizes() == [5, 8], DEADLINE, "stuck rollout")
    sim.store.patch("deployments", "web", {"spec": {"replicas": 20}}, "default")
    # 25 allowed now; each set grows by its share of max-replicas (13): 8 -> 15, 5 -> 10.
    await sim.wait_for(lambda: sizes() == [10, 15], DEADLINE, "proportional scale")
    assert all(
        rs["metadata"]["annotations"]["deployment.kubernetes.io/max-replicas"] == "25"
        for rs in replica_sets(sim)
    )


async def test_recreate_removes_every_old_pod_before_starting_new_ones(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(workload("Deployment", "web", 2, strategy={"type": "Recreate"}))
    await rolled_out(sim, "web")
    old_name = replica_sets(sim)[0]["metadata"]["name"]
    patch = {"spec": {"template": {"spec": {"containers": [container("example/web:2")]}}}}
    sim.store.patch("deployments", "web", patch, "default")
    await rolled_out(sim, "web")
    messages = [e[2] for e in events(sim, "web") if e[1] == "ScalingReplicaSet"]
    new_name = next(
        rs["metadata"]["name"] for rs in replica_sets(sim) if rs["metadata"]["name"] != old_name
    )
    down = messages.index(f"Scaled down replica set {old_name} from 2 to 0")
    up = messages.index(f"Scaled up replica set {new_name} from 0 to 2")
    assert down < up


async def test_revision_history_limit_deletes_the_oldest_unused_replica_sets(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(workload("Deployment", "web", 1, revisionHistoryLimit=1))
    await rolled_out(sim, "web")
    for version in (2, 3, 4):
        patch = {
            "spec": {"template": {"spec": {"containers": [container(f"example/web:{version}")]}}}
        }
        sim.store.patch("deployments", "web", patch, "default")
        await rolled_out(sim, "web")
    await sim.wait_for(lambda: len(replica_sets(sim)) == 2, DEADLINE)
    assert sorted(revision_of(rs) or "" for rs in replica_sets(sim)) == ["3", "4"]


async def test_rollback_to_an_old_template_reuses_its_replica_set_under_a_new_revision(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(workload("Deployment", "web", 1))
    await rolled_out(sim, "web")
    first = replica_sets(sim)[0]["metadata"]["name"]
    original = get(sim, "deployments", "web")["spec"]["template"]
    patch = {"spec": {"template": {"spec": {"containers": [container("example/web:2")]}}}}
    sim.store.patch("deployments", "web", patch, "default")
    await rolled_out(sim, "web")
    back = get(sim, "deployments", "web")
    back["spec"]["template"] = original
    sim.store.update(back)
    deploy = await rolled_out(sim, "web")
    reused = get(sim, "replicasets", first)
    assert revision_of(reused) == revision_of(deploy) == "3"
    assert reused["metadata"]["annotations"]["deployment.kubernetes.io/revision-history"] == "1"
    assert reused["spec"]["replicas"] == 1
    assert len(replica_sets(sim)) == 2


async def test_paused_deployment_reports_paused_and_rolls_out_only_once_resumed(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(workload("Deployment", "web", 2))
    await rolled_out(sim, "web")
    sim.store.patch("deployments", "web", {"spec": {"paused": True}}, "default")
    patch = {"spec": {"template": {"spec": {"containers": [container("example/web:2")]}}}}
    sim.store.patch("deployments", "web", patch, "default")
    await sim.wait_for(
        lambda: (
            (condition(get(sim, "deployments", "web"), "Progressing") or {}).get("reason")
            == "DeploymentPaused"
        ),
        DEADLINE,
    )
    await sim.settle(timeout=DEADLINE)
    paused = get(sim, "deployments", "web")
    progressing = condition(paused, "Progressing")
    assert progressing is not None
    assert (progressing["status"], progressing["message"]) == ("Unknown", "Deployment is paused")
    assert len(replica_sets(sim)) == 1
    assert "updatedReplicas" not in paused["status"]
    sim.store.patch("deployments", "web", {"spec": {"paused": False}}, "default")
    deploy = await rolled_out(sim, "web")
    assert len(replica_sets(sim)) == 2
    assert revision_of(deploy) == "2"


async def test_progress_deadline_is_exceeded_when_pods_never_become_ready(
    sim: kubesim.Cluster,
) -> None:
    sim.register_pod_runner(Readiness(), image="example/stuck")
    sim.store.create(
        workload(
            "Deployment",
            "stuck",
            1,
            progressDeadlineSeconds=60,
            pod={"containers": [container("example/stuck:1", **PROBE)]},
        )
    )
    await sim.wait_for(lambda: len(pods(sim)) == 1, DEADLINE)
    await sim.settle(timeout=DEADLINE)
    before = condition(get(sim, "deployments", "stuck"), "Progressing")
    assert before is not None
    assert before["status"] == "True"
    available = condition(get(sim, "deployments", "stuck"), "Available")
    assert available is not None
    assert available["reason"] == "MinimumReplicasUnavailable"
    sim.clock.advance(61)
    await sim.wait_for(
        lambda: (
            (condition(get(sim, "deployments", "stuck"), "Progressing") or {}).get("reason")
            == "ProgressDeadlineExceeded"
        ),
        DEADLINE,
    )
    timed_out = condition(get(sim, "deployments", "stuck"), "Progressing")
    assert timed_out is not None
    assert timed_out["status"] == "False"
    assert timed_out["message"].endswith("has timed out progressing.")


async def test_daemonset_records_pod_create_and_delete_events(sim: kubesim.Cluster) -> None:
    daemon = workload("DaemonSet", "agent")
    daemon["spec"].pop("replicas")
    sim.store.create(daemon)
    await sim.wait_for(lambda: len(pods(sim)) == 2, DEADLINE)
    created = [e for e in events(sim, "agent") if e[1] == "SuccessfulCreate"]
    assert len(created) == 2
    assert all(e[2].startswith("Created pod: agent-") for e in created)
    hide = {"spec": {"template": {"spec": {"nodeSelector": {"pool": "none"}}}}}
    sim.store.patch("daemonsets", "agent", hide, "default")
    await sim.wait_for(
        lambda: sum(1 for e in events(sim, "agent") if e[1] == "SuccessfulDelete") == 2, DEADLINE
    )
    deleted = [e[2] for e in events(sim, "agent") if e[1] == "SuccessfulDelete"]
    assert all(message.startswith("Deleted pod: agent-") for message in deleted)


# ----- printer columns --------------------------------------------------------------------------


def test_durations_are_written_like_the_real_printers() -> None:
    assert [columns.duration(s) for s in (-5, -1, 59, 119, 125, 600, 10000, 18060, 100000)] == [
        "<invalid>",
        "0s",
        "59s",
        "119s",
        "2m5s",
        "10m",
        "166m",
        "5h1m",
        "27h",
    ]
    assert columns.duration(3 * 86400 + 3600) == "3d1h"
    assert columns.duration(400 * 86400) == "400d"
    assert columns.duration(800 * 86400) == "2y70d"


async def table(api: Api, path: str, wide: bool = False) -> tuple[list[str], list[list[Any]]]:
    headers = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    body = await api.ok("GET", path, headers=headers)
    names = [c["name"] for c in body["columnDefinitions"] if wide or c["priority"] == 0]
    keep = [i for i, c in enumerate(body["columnDefinitions"]) if wide or c["priority"] == 0]
    rows = [[row["cells"][i] for i in keep] for row in body["rows"]]
    return names, rows


async def test_tables_use_the_real_printer_columns(sim: kubesim.Cluster, api: Api) -> None:
    sim.store.create(
        service(
            "web", type="NodePort", selector={"app": "web"}, ports=[{"port": 80, "nodePort": 30080}]
        )
    )
    names, rows = await table(api, "/api/v1/namespaces/default/services", wide=True)
    assert names == ["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"]
    web = next(r for r in rows if r[0] == "web")
    assert web[1] == "NodePort"
    assert web[3] == "<none>"
    assert web[4] == "80:30080/TCP"
    assert web[6] == "app=web"
    sim.store.create(job("j"))
    names, rows = await table(api, "/apis/batch/v1/namespaces/default/jobs")
    assert names == ["Name", "Status", "Completions", "Duration", "Age"]
    assert rows[0][1:3] == ["Running", "0/1"]
    sim.store.create(cronjob("c"))
    names, rows = await table(api, "/apis/batch/v1/namespaces/default/cronjobs")
    assert names == ["Name", "Schedule", "Timezone", "Suspend", "Active", "Last Schedule", "Age"]
    assert rows[0][1:6] == ["*/5 * * * *", "<none>", "False", 0, "<none>"]
    sim.store.create(workload("StatefulSet", "db", 2))
    names, _ = await table(api, "/apis/apps/v1/namespaces/default/statefulsets", wide=True)
    assert names == ["Name", "Ready", "Age", "Containers", "Images"]
    names, _ = await table(api, "/apis/apps/v1/namespaces/default/deployments", wide=True)
    assert names == [
        "Name",
        "Ready",
        "Up-to-date",
        "Available",
        "Age",
        "Containers",
        "Images",
        "Selector",
    ]
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "default"},
            "type": "Opaque",
            "data": {"a": "Yg=="},
        }
    )
    names, rows = await table(api, "/api/v1/namespaces/default/secrets")
    assert (names, rows[0][1:3]) == (["Name", "Type", "Data", "Age"], ["Opaque", 1])
    names, _ = await table(api, "/api/v1/namespaces/default/serviceaccounts")
    assert names == ["Name", "Secrets", "Age"]
    sim.store.create(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
        }
    )
    names, rows = await table(api, "/apis/scheduling.k8s.io/v1/priorityclasses")
    assert names == ["Name", "Value", "Global-Default", "Age", "PreemptionPolicy"]
    assert rows[0][1:3] == [1000, False]
    names, rows = await table(api, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert names == ["Name", "Holder", "Age"]
    assert rows[0][1] == "node-1"
    sim.store.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "r", "namespace": "default"},
            "rules": [],
        }
    )
    names, rows = await table(api, "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles")
    assert names == ["Name", "Created At"]
    assert rows[0][1].endswith("Z")
    names, _ = await table(api, "/api/v1/namespaces/default/events", wide=True)
    assert names == [
        "Last Seen",
        "Type",
        "Reason",
        "Object",
        "Subobject",
        "Source",
        "Message",
        "First Seen",
        "Count",
        "Name",
    ]
    await sim.wait_for(lambda: bool(sim.store.list("events", "default")), DEADLINE)
    _, rows = await table(api, "/api/v1/namespaces/default/events")
    assert all(not str(r[0]).endswith("Z") for r in rows)


# ----- real kubectl -----------------------------------------------------------------------------


async def poll(sim: kubesim.Cluster, what: str, *args: str, until: Callable[[str], bool]) -> str:
    """Re-run `kubectl args` until `until` accepts its output, and return that output (a failed
    wait shows the last one)."""
    last = [""]

    async def check() -> str:
        last[0] = await kubectl(sim, *args)
        return last[0] if until(last[0]) else ""

    return await eventually(check, what, interval=0.1, state=lambda: last[0])


@needs_kubectl
async def test_kubectl_job_completes_and_describe_shows_its_events(sim: kubesim.Cluster) -> None:
    await kubectl(sim, "create", "job", "hello", "--image=busybox", "--", "echo", "hi")

    out = await poll(
        sim, "the job complete", "get", "job", "hello", until=lambda out: "Complete" in out
    )
    assert "COMPLETIONS" in out
    assert "1/1" in out
    described = await kubectl(sim, "describe", "job", "hello")
    assert "SuccessfulCreate" in described
    assert "Job completed" in described
    assert "Completed" in await kubectl(sim, "get", "pods", "-l", "job-name=hello")


@needs_kubectl
async def test_kubectl_cronjob_fires_when_the_clock_advances(sim: kubesim.Cluster) -> None:
    await kubectl(
        sim,
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=*/10 * * * *",
        "--",
        "echo",
        "tick",
    )
    out = await kubectl(sim, "get", "cj")
    assert "SCHEDULE" in out
    assert "*/10 * * * *" in out
    assert "<none>" in out
    sim.clock.advance(600)

    await poll(
        sim, "a job of the CronJob", "get", "jobs", "-o", "name",
        until=lambda out: "job.batch/tick-" in out,
    )  # fmt: skip
    described = await kubectl(sim, "describe", "cronjob", "tick")
    assert "Created job tick-" in described


@needs_kubectl
async def test_kubectl_expose_scale_and_autoscale(sim: kubesim.Cluster) -> None:
    await kubectl(sim, "create", "deployment", "web", "--image=nginx", "--replicas=2", "--port=80")
    await kubectl(sim, "expose", "deployment", "web", "--port", "80")
    out = await kubectl(sim, "get", "svc", "web")
    assert "ClusterIP" in out
    assert "10." in out
    assert "80/TCP" in out

    await poll(
        sim, "two endpoints of web", "get", "endpointslices", "-l",
        "kubernetes.io/service-name=web",
        until=lambda out: out.count(",") >= 1 and ":80" not in out,
    )  # fmt: skip
    assert "scaled" in await kubectl(sim, "scale", "deployment", "web", "--replicas=3")

    await poll(
        sim, "3/3 replicas of web", "get", "deployment", "web", until=lambda out: "3/3" in out
    )
    assert "autoscaled" in await kubectl(sim, "autoscale", "deployment", "web", "--max=5")
    out = await kubectl(sim, "get", "hpa")
    assert "Deployment/web" in out
    assert "cpu: <unknown>/80%" in out


@needs_kubectl
async def test_kubectl_rollout_history_undo_restart_pause_and_resume(
    sim: kubesim.Cluster,
) -> None:
    await kubectl(sim, "create", "deployment", "web", "--image=nginx:1.26")
    await kubectl(sim, "rollout", "status", "deployment/web", KUBECTL_WAIT)
    await kubectl(sim, "set", "image", "deployment/web", "nginx=nginx:1.27")
    await kubectl(sim, "annotate", "deployment", "web", "kubernetes.io/change-cause=bump")
    await kubectl(sim, "rollout", "status", "deployment/web", KUBECTL_WAIT)
    history = await kubectl(sim, "rollout", "history", "deployment/web")
    assert "1         <none>" in history
    assert "2         bump" in history
    await kubectl(sim, "rollout", "undo", "deployment/web", "--to-revision=1")
    await kubectl(sim, "rollout", "status", "deployment/web", KUBECTL_WAIT)
    assert "nginx:1.26" in await kubectl(sim, "get", "deployment", "web", "-o", "wide")
    history = await kubectl(sim, "rollout", "history", "deployment/web")
    assert "3 " in history
    assert "\n1 " not in history
    await kubectl(sim, "rollout", "restart", "deployment/web")
    await kubectl(sim, "rollout", "status", "deployment/web", KUBECTL_WAIT)
    assert "4 " in await kubectl(sim, "rollout", "history", "deployment/web")
    await kubectl(sim, "rollout", "pause", "deployment/web")
    refused = await kubectl(sim, "rollout", "undo", "deployment/web", check=False)
    assert "you cannot rollback a paused deployment" in refused
    await kubectl(sim, "rollout", "resume", "deployment/web")
    described = await kubectl(sim, "describe", "deployment", "web")
    assert "ScalingReplicaSet" in described
    assert "Scaled up replica set web-" in described


@needs_kubectl
async def test_kubectl_tables_for_workload_and_cluster_kinds(sim: kubesim.Cluster) -> None:
    manifest = """
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: pg, image: "postgres:16"}]}
"""
    await kubectl(sim, "apply", "-f", "-", stdin=manifest)
    await kubectl(sim, "create", "secret", "generic", "s1", "--from-literal=a=b")
    await kubectl(sim, "create", "serviceaccount", "bot")
    await kubectl(sim, "create", "priorityclass", "high", "--value=1000")

    await poll(sim, "2/2 replicas of db", "get", "sts", "db", until=lambda out: "2/2" in out)
    assert "CLUSTER-IP" in await kubectl(sim, "get", "svc")
    assert "TYPE     DATA" in await kubectl(sim, "get", "secret", "s1")
    assert "SECRETS" in await kubectl(sim, "get", "sa", "bot")
    assert "GLOBAL-DEFAULT" in await kubectl(sim, "get", "pc", "high")
    assert "HOLDER" in await kubectl(sim, "get", "leases", "-n", "kube-node-lease")
    events_out = await kubectl(sim, "get", "ev")
    assert "LAST SEEN" in events_out
    assert "statefulset/db" in events_out
    lines = events_out.splitlines()
    first_row = lines[next(i for i, line in enumerate(lines) if line.startswith("LAST SEEN")) + 1]
    assert re.match(r"^\d+[smhdy]", first_row.split()[0])  # relative, not an ISO time
    assert "create Pod db-0 in StatefulSet db successful" in await kubectl(
        sim, "describe", "sts", "db"
    )


async def test_v1_endpoints_requests_carry_the_deprecation_warning(api: Api) -> None:
    async with api.session.get("/api/v1/namespaces/default/endpoints") as resp:
        assert resp.status == 200
        assert resp.headers["Warning"] == (
            '299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"'
        )
    async with api.session.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices") as r:
        assert "Warning" not in r.headers
