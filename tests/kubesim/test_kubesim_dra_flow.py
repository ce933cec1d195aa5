"""Dynamic Resource Allocation end to end on a served kubesim with the real kubectl: a fake DRA
driver (tests/kubesim/dra_fake_driver.py) registers with the node's kubelet and publishes its
devices; a DeviceClass, a ResourceClaimTemplate and a pod applied with kubectl get a claim that
the scheduler allocates, the kubelet prepares and whose CDI devices reach the container; deleting
the pod unprepares, deallocates and deletes the claim. Needs the scheduler's DRA plugin and the
resource claim controller (kubesim.controllers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from dra_fake_driver import FakeDRADriver, cdi_env
from kubesim_helpers import TEST_IMAGES, kubectl, needs_kubectl
from waiting import eventually

import kubesim
from kubesim import KubeletConfig
from kubesim.programs import ProgramRun

NODE = "node-1"
DRIVER = "gpu.example.com"

MANIFESTS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.example.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
  namespace: default
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
"""


def pod_manifest(name: str, template: str = "one-gpu") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {template}
  containers:
  - name: main
    image: example/app:1
    resources:
      claims:
      - name: gpu
"""


class CdiRuntime:
    """A CDI-enabled container runtime: it remembers each container's CDI devices."""

    def __init__(self) -> None:
        self.created: dict[tuple[str, str], tuple[str, ...]] = {}

    def run_sandbox(self, sandbox: kubesim.PodSandbox) -> None:
        return None

    def create_container(self, view: kubesim.ContainerView) -> None:
        self.created[(view.pod["metadata"]["name"], view.container_name)] = view.cdi_devices


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    config = KubeletConfig(
        instant=True, lease_interval=None, dra_plugin_watch_interval=0.02, dra_wiping_delay=60
    )
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config) as cluster:
        yield cluster


def claims(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    return sim.store.list("resourceclaims", "default")


@needs_kubectl
async def test_whole_flow_with_kubectl(sim: kubesim.Cluster) -> None:
    runtime = CdiRuntime()
    sim.register_container_runtime(runtime)

    async def env(run: ProgramRun) -> int:
        # The container's environment with what the runtime's CDI edits add.
        values = {**run.view.env, **cdi_env(sim, NODE, run.view.cdi_devices)}
        for key in sorted(values):
            run.stdout.write(f"{key}={values[key]}\n")
        return 0

    sim.register_program("env", env)
    await sim.start_dra_manager(NODE)
    fake = FakeDRADriver(sim, NODE, devices=("gpu-0",))
    await fake.start()
    try:
        await eventually(lambda: fake.statuses == [(True, "")], "driver registered")
        fake.publish_slice()
        await kubectl(sim, "apply", "-f", "-", stdin=MANIFESTS)
        await kubectl(sim, "apply", "-f", "-", stdin=pod_manifest("app"))
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/app", "--timeout=20s")

        (claim,) = claims(sim)
        name = claim["metadata"]["name"]
        assert name.startswith("app-gpu-")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, NODE, "gpu-0")
        assert fake.prepare_calls == [[name]]
        uid = claim["metadata"]["uid"]
        assert runtime.created[("app", "main")] == (f"example.com/gpu=claim-{uid}-gpu-0",)
        out = await kubectl(sim, "exec", "app", "--", "env")
        assert "EXAMPLE_GPU_GPU-0=present" in out.splitlines()

        # The last device is taken: a second pod stays Pending with the scheduler's reason.
        await kubectl(sim, "apply", "-f", "-", stdin=pod_manifest("second"))
        await eventually(
            lambda: any(
                e.get("reason") == "FailedScheduling"
                for e in sim.store.list("events", "default")
                if (e.get("involvedObject") or {}).get("name") == "second"
            ),
            "second pod FailedScheduling",
        )
        described = await kubectl(sim, "describe", "pod", "second")
        assert "cannot allocate all claims" in described
        assert "Pending" in (await kubectl(sim, "get", "pod", "second"))

        # Deleting the first pod unprepares its claim, which is then deleted; the second pod
        # gets the device.
        await kubectl(sim, "delete", "pod", "app", "--wait=true", "--timeout=20s")
        assert fake.unprepare_calls[0] == [name]
        await eventually(
            lambda: all(c["metadata"]["name"] != name for c in claims(sim)), "claim deleted"
        )
        await kubectl(sim, "wait", "--for=condition=Ready", "pod/second", "--timeout=20s")
    finally:
        await fake.stop()


@needs_kubectl
async def test_unsatisfiable_selector_stays_pending_with_the_schedulers_message(
    sim: kubesim.Cluster,
) -> None:
    await sim.start_dra_manager(NODE)
    fake = FakeDRADriver(sim, NODE)
    await fake.start()
    try:
        await eventually(lambda: fake.statuses == [(True, "")], "driver registered")
        fake.publish_slice()
        await kubectl(sim, "apply", "-f", "-", stdin=MANIFESTS)
        # A request under `exactly` with a selector no published device satisfies.
        template = MANIFESTS.split("---")[1].replace("one-gpu", "huge-gpu") + (
            "          selectors:\n"
            "          - cel:\n"
            '              expression: device.capacity["gpu.example.com"].memory'
            '.compareTo(quantity("1Ti")) >= 0\n'
        )
        await kubectl(sim, "apply", "-f", "-", stdin=template)
        await kubectl(sim, "apply", "-f", "-", stdin=pod_manifest("big", "huge-gpu"))
        await eventually(
            lambda: any(
                e.get("reason") == "FailedScheduling"
                for e in sim.store.list("events", "default")
                if (e.get("involvedObject") or {}).get("name") == "big"
            ),
            "FailedScheduling",
        )
        await asyncio.sleep(0.2)
        described = await kubectl(sim, "describe", "pod", "big")
        assert "cannot allocate all claims" in described
        assert fake.prepare_calls == []
    finally:
        await fake.stop()


async def test_pod_resources_api_lists_the_containers_prepared_claims(
    sim: kubesim.Cluster,
) -> None:
    from grpc import aio

    import kubeletapi
    from kubeletapi.podresources.v1 import api_pb2 as pr
    from kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc

    await sim.start_dra_manager(NODE)
    await sim.start_device_manager(NODE)
    fake = FakeDRADriver(sim, NODE, devices=("gpu-0",))
    await fake.start()
    try:
        await eventually(lambda: fake.statuses == [(True, "")], "driver registered")
        fake.publish_slice()
        for text in MANIFESTS.split("---"):
            sim.store.create(yaml.safe_load(text))
        sim.store.create(yaml.safe_load(pod_manifest("app")))

        def running() -> bool:
            found = sim.store.get("pods", "app", "default") or {}
            return (found.get("status") or {}).get("phase") == "Running"

        await eventually(running, "pod app Running")
        (claim,) = claims(sim)
        path = sim.node_root(NODE) / kubeletapi.POD_RESOURCES_SOCKET.lstrip("/")
        async with aio.insecure_channel(f"unix://{path}") as channel:
            lister = pr_grpc.PodResourcesListerStub(channel)
            listed = await lister.List(pr.ListPodResourcesRequest())
            got = await lister.Get(
                pr.GetPodResourcesRequest(pod_name="app", pod_namespace="default")
            )
    finally:
        await fake.stop()
    (listed_pod,) = [p for p in listed.pod_resources if p.name == "app"]
    for entry in (listed_pod, got.pod_resources):
        (container,) = entry.containers
        (dynamic,) = container.dynamic_resources
        assert (dynamic.claim_name, dynamic.claim_namespace) == (
            claim["metadata"]["name"],
            "default",
        )
        (resource,) = dynamic.claim_resources
        assert (resource.driver_name, resource.pool_name, resource.device_name) == (
            DRIVER,
            NODE,
            "gpu-0",
        )
        uid = claim["metadata"]["uid"]
        assert [d.name for d in resource.cdi_devices] == [f"example.com/gpu=claim-{uid}-gpu-0"]


@needs_kubectl
async def test_documentation_example_applied_with_kubectl_runs() -> None:
    """The documentation's DeviceClass, ResourceClaimTemplate and Deployment, applied as written
    from a YAML file: the Deployment's pod gets a claim for the one matching device and runs."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "dra" / "docs_example.yaml"
    config = KubeletConfig(instant=True, lease_interval=None, dra_plugin_watch_interval=0.02)
    async with kubesim.Cluster(images=("ubuntu:*",), nodes=1, kubelet=config) as sim:
        await sim.start_dra_manager(NODE)
        fake = FakeDRADriver(sim, NODE, name="driver.example.com", devices=("gpu-0", "gpu-1"))
        await fake.start()
        try:
            await eventually(lambda: fake.statuses == [(True, "")], "driver registered")
            # Published by hand: one device the template's selector wants, one it does not.
            sim.store.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{NODE}-driver.example.com"},
                    "spec": {
                        "driver": "driver.example.com",
                        "nodeName": NODE,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                        "devices": [
                            {
                                "name": name,
                                "attributes": {"type": {"string": "gpu"}},
                                "capacity": {"memory": {"value": memory}},
                            }
                            for name, memory in (("gpu-0", "80Gi"), ("gpu-1", "64Gi"))
                        ],
                    },
                }
            )
            out = await kubectl(sim, "apply", "-f", str(fixture))
            assert "deployment.apps/example-dra-deployment created" in out, out
            await kubectl(
                sim,
                "wait",
                "--for=condition=Ready",
                "pod",
                "-l",
                "app=example-dra-app",
                "--timeout=30s",
            )
            (claim,) = claims(sim)
            # generateName `<pod>-<claim entry>-`, the pod being the Deployment's.
            assert claim["metadata"]["name"].startswith("example-dra-deployment-")
            assert "-separate-gpu-claim-" in claim["metadata"]["name"]
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["request"], result["device"]) == ("gpu-claim", "gpu-1")
            assert fake.prepare_calls == [[claim["metadata"]["name"]]]
            listed = await kubectl(sim, "get", "resourceclaims")
            assert "allocated,reserved" in listed, listed
        finally:
            await fake.stop()
