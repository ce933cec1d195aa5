"""The kubelet's DRA manager over real unix sockets: plugin registration through the
plugins_registry directory, NodePrepareResources / NodeUnprepareResources on a fake DRA driver
(tests/kubesim/dra_fake_driver.py), CDI devices reaching the containers that claim them, the
checkpoint, and the kubelet's Events. Claims are allocated and reserved here by hand (what the
scheduler does), so these tests need neither the scheduler's DRA plugin nor a served cluster."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dra_fake_driver import FakeDRADriver, cdi_env
from kubesim_helpers import TEST_IMAGES
from waiting import eventually

import kubeletapi
import kubesim
from kubeletapi.dra.v1 import api_pb2 as dra
from kubeletapi.dra.v1beta1 import api_pb2 as dra_beta
from kubeletapi.pluginregistration.v1 import api_pb2 as reg
from kubesim import KubeletConfig

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-1"
DRIVER = "gpu.example.com"


class RecordingRuntime:
    """A CRI runtime that records what the kubelet creates each container with."""

    def __init__(self) -> None:
        self.created: dict[tuple[str, str], tuple[str, ...]] = {}

    def run_sandbox(self, sandbox: kubesim.PodSandbox) -> None:
        return None

    def create_container(self, view: kubesim.ContainerView) -> None:
        self.created[(view.pod["metadata"]["name"], view.container_name)] = view.cdi_devices


def config(**kw: Any) -> KubeletConfig:
    settings: dict[str, Any] = {"dra_plugin_watch_interval": 0.02, "dra_registration_retry": 0.05}
    settings.update(kw)
    return KubeletConfig(instant=True, lease_interval=None, **settings)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config()) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def driver(sim: kubesim.Cluster, **kw: Any) -> AsyncIterator[FakeDRADriver]:
    """A started fake driver, registered with the node's kubelet (stopped afterwards)."""
    manager = await sim.start_dra_manager(NODE)
    fake = FakeDRADriver(sim, NODE, **kw)
    await fake.start()
    try:
        await eventually(lambda: fake.statuses, "registration status sent to the plugin")
        if fake.statuses[-1][0]:
            assert fake.name in manager.plugins.plugins
        yield fake
    finally:
        await fake.stop()


def pod(name: str, claims: dict[str, str], containers: dict[str, list[str]]) -> dict[str, Any]:
    """A pod bound to the node; `claims` maps entry -> claim name, `containers` maps container
    name -> the entries it lists in resources.claims."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in claims.items()],
            "containers": [
                {
                    "name": c,
                    "image": "example/app:1",
                    **({"resources": {"claims": [{"name": e} for e in refs]}} if refs else {}),
                }
                for c, refs in containers.items()
            ],
        },
    }


def create_claim(
    sim: kubesim.Cluster,
    name: str,
    users: list[str],
    devices: tuple[str, ...] = ("gpu-0",),
    driver_name: str = DRIVER,
) -> dict[str, Any]:
    """A claim allocated on the node and reserved for the named pods (as the scheduler
    leaves it)."""
    obj = sim.store.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": "gpu.example.com"},
                        }
                    ]
                }
            },
        }
    )
    reserved = []
    for user in users:
        stored = sim.store.get("pods", user, "default")
        assert stored is not None
        reserved.append({"resource": "pods", "name": user, "uid": stored["metadata"]["uid"]})
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": driver_name, "pool": NODE, "device": d}
                    for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        },
        "reservedFor": reserved,
    }
    return sim.store.update(obj, status=True)


def phase(sim: kubesim.Cluster, name: str) -> str | None:
    return ((sim.store.get("pods", name, "default") or {}).get("status") or {}).get("phase")


async def wait_phase(sim: kubesim.Cluster, name: str, wanted: str) -> None:
    await eventually(
        lambda: phase(sim, name) == wanted,
        f"pod {name} {wanted}",
        state=lambda: (sim.store.get("pods", name, "default") or {}).get("status"),
    )


def events(sim: kubesim.Cluster, reason: str) -> list[str]:
    return [
        str(e.get("message"))
        for e in sim.store.list("events", "default")
        if e.get("reason") == reason
    ]


def checkpoint(sim: kubesim.Cluster) -> list[dict[str, Any]]:
    path = sim.node_root(NODE) / kubeletapi.DRA_CHECKPOINT_FILE.lstrip("/")
    outer = json.loads(path.read_text())
    entries: list[dict[str, Any]] = json.loads(outer["Data"])["ClaimInfoStateList"]
    return entries


# ----- generated code ---------------------------------------------------------------------------


def test_generated_kubelet_api_modules_match_their_protos() -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (a dev dependency) is not installed")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_kubelet_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dra_and_registration_method_paths_are_the_kubelets() -> None:
    v1 = dra.DESCRIPTOR.services_by_name["DRAPlugin"]
    beta = dra_beta.DESCRIPTOR.services_by_name["DRAPlugin"]
    registration = reg.DESCRIPTOR.services_by_name["Registration"]
    assert v1.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert beta.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    assert sorted(m.name for m in v1.methods) == ["NodePrepareResources", "NodeUnprepareResources"]
    assert registration.full_name == "pluginregistration.Registration"
    assert sorted(m.name for m in registration.methods) == [
        "GetInfo",
        "NotifyRegistrationStatus",
    ]
    fields = dra.Device.DESCRIPTOR.fields_by_name
    assert [fields[n].number for n in ("request_names", "pool_name", "device_name")] == [1, 2, 3]
    assert fields["cdi_device_ids"].number == 4
    assert reg.PluginInfo.DESCRIPTOR.fields_by_name["supported_versions"].number == 4


# ----- registration -----------------------------------------------------------------------------


async def test_plugin_registers_through_the_registry_directory(sim: kubesim.Cluster) -> None:
    async with driver(sim) as fake:
        manager = sim.dra_manager(NODE)
        assert manager is not None
        assert fake.statuses == [(True, "")]
        (plugin,) = manager.plugins.plugins[DRIVER]
        assert plugin.endpoint == f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
        assert plugin.service == "v1.DRAPlugin"
    # The registration socket went away: the plugin is unregistered.
    await eventually(lambda: DRIVER not in manager.plugins.plugins, "plugin unregistered")


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        (
            {"plugin_type": "CSIPlugin"},
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket "
            "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock",
        ),
        (
            {"services": ("v2.DRAPlugin",)},
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
            "versions of DRA driver plugin gpu.example.com at endpoint "
            "/var/lib/kubelet/plugins/gpu.example.com/dra.sock: none of services supported by "
            'the plugin (["v2.DRAPlugin"]) are supported by the kubelet (["v1.DRAPlugin" '
            '"v1beta1.DRAPlugin"])',
        ),
        (
            {"services": ()},
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
            "versions of DRA driver plugin gpu.example.com at endpoint "
            "/var/lib/kubelet/plugins/gpu.example.com/dra.sock: empty list of supported gRPC "
            "services (aka supported versions)",
        ),
    ],
)
async def test_registration_refusals_are_notified_with_the_kubelets_messages(
    sim: kubesim.Cluster, kw: dict[str, Any], error: str
) -> None:
    async with driver(sim, **kw) as fake:
        assert fake.statuses[0] == (False, error)
        manager = sim.dra_manager(NODE)
        assert manager is not None
        assert DRIVER not in manager.plugins.plugins


async def test_plugin_listing_v1beta1_first_is_called_through_v1beta1(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
    create_claim(sim, "c1", ["app"])
    async with driver(sim, services=("v1beta1.DRAPlugin", "v1.DRAPlugin")) as fake:
        await wait_phase(sim, "app", "Running")
        assert fake.beta_calls == 1
        assert fake.prepare_calls == [["c1"]]


# ----- prepare, CDI devices, unprepare ------------------------------------------------------------


async def test_claims_are_prepared_cdi_devices_reach_claiming_containers_and_unprepared(
    sim: kubesim.Cluster,
) -> None:
    runtime = RecordingRuntime()
    sim.register_container_runtime(runtime)
    async with driver(sim) as fake:
        fake.publish_slice()
        sim.store.create(
            pod("app", {"gpu": "c1", "other": "c2"}, {"main": ["gpu"], "side": [], "both": []})
        )
        create_claim(sim, "c1", ["app"], devices=("gpu-0",))
        create_claim(sim, "c2", ["app"], devices=("gpu-1",))
        await wait_phase(sim, "app", "Running")
        # One NodePrepareResources call for both claims of the driver.
        assert fake.prepare_calls == [["c1", "c2"]]
        c1 = sim.store.get("resourceclaims", "c1", "default")
        assert c1 is not None
        uid = c1["metadata"]["uid"]
        assert runtime.created[("app", "main")] == (f"example.com/gpu=claim-{uid}-gpu-0",)
        assert runtime.created[("app", "side")] == ()
        # What a CDI-enabled runtime makes of the id: the driver's spec edits.
        assert cdi_env(sim, NODE, runtime.created[("app", "main")]) == {
            "EXAMPLE_GPU_GPU-0": "present"
        }
        entries = {e["ClaimName"]: e for e in checkpoint(sim)}
        assert sorted(entries) == ["c1", "c2"]
        app_uid = (sim.store.get("pods", "app", "default") or {})["metadata"]["uid"]
        assert entries["c1"]["PodUIDs"] == [app_uid]
        (device,) = entries["c1"]["DriverState"][DRIVER]["Devices"]
        assert device["DeviceName"] == "gpu-0"
        assert device["RequestNames"] == ["gpu"]

        sim.store.delete("pods", "app", "default")
        await eventually(
            lambda: sim.store.get("pods", "app", "default") is None, "pod object removed"
        )
        assert fake.unprepare_calls == [["c1", "c2"]]
        assert checkpoint(sim) == []
        assert not fake.cdi_spec(uid).exists()


async def test_container_request_selects_only_that_requests_devices(
    sim: kubesim.Cluster,
) -> None:
    runtime = RecordingRuntime()
    sim.register_container_runtime(runtime)
    manifest = pod("app", {"gpu": "c1"}, {"main": []})
    manifest["spec"]["containers"][0]["resources"] = {
        "claims": [{"name": "gpu", "request": "other"}]
    }
    sim.store.create(manifest)
    create_claim(sim, "c1", ["app"], devices=("gpu-0",))
    async with driver(sim):
        await wait_phase(sim, "app", "Running")
        # The driver tied its device to request "gpu": a container asking for "other" gets none.
        assert runtime.created[("app", "main")] == ()


async def test_unregistered_driver_keeps_the_pod_creating_with_the_kubelets_event(
    sim: kubesim.Cluster,
) -> None:
    await sim.start_dra_manager(NODE)
    sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
    create_claim(sim, "c1", ["app"])
    message = (
        "Failed to prepare dynamic resources: prepare dynamic resources: DRA driver "
        f"{DRIVER} is not registered"
    )
    await eventually(lambda: message in events(sim, "FailedPrepareDynamicResources"), message)
    status = (sim.store.get("pods", "app", "default") or {}).get("status") or {}
    assert status.get("phase") == "Pending"
    (container,) = status["containerStatuses"]
    assert container["state"] == {"waiting": {"reason": "ContainerCreating"}}
    # The kubelet keeps trying: once the driver registers, the pod starts.
    async with driver(sim) as fake:
        await wait_phase(sim, "app", "Running")
        assert fake.prepare_calls == [["c1"]]


async def test_claim_problems_and_driver_errors_are_reported_and_retried(
    sim: kubesim.Cluster,
) -> None:
    async with driver(sim) as fake:
        sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
        prefix = "Failed to prepare dynamic resources: prepare dynamic resources: "
        missing = prefix + 'fetch ResourceClaim c1: resourceclaims.resource.k8s.io "c1" not found'
        await eventually(lambda: missing in events(sim, "FailedPrepareDynamicResources"), missing)
        fake.claim_error = "device gpu-0 is broken"
        create_claim(sim, "c1", ["app"])
        failed = prefix + "NodePrepareResources failed for ResourceClaim c1: device gpu-0 is broken"
        await eventually(lambda: failed in events(sim, "FailedPrepareDynamicResources"), failed)
        fake.claim_error = ""
        fake.call_error = "driver busy"
        call = prefix + "NodePrepareResources: rpc error: code = Unavailable desc = driver busy"
        await eventually(lambda: call in events(sim, "FailedPrepareDynamicResources"), call)
        assert phase(sim, "app") == "Pending"
        fake.call_error = ""
        await wait_phase(sim, "app", "Running")


async def test_claim_not_reserved_for_the_pod_is_refused(sim: kubesim.Cluster) -> None:
    async with driver(sim):
        sim.store.create(pod("other", {"gpu": "c1"}, {"main": ["gpu"]}))
        create_claim(sim, "c1", ["other"])
        await wait_phase(sim, "other", "Running")
        sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
        app = sim.store.get("pods", "app", "default") or {}
        claim = sim.store.get("resourceclaims", "c1", "default") or {}
        message = (
            "Failed to prepare dynamic resources: prepare dynamic resources: pod app "
            f"({app['metadata']['uid']}) is not allowed to use ResourceClaim c1 "
            f"({claim['metadata']['uid']})"
        )
        await eventually(lambda: message in events(sim, "FailedPrepareDynamicResources"), message)


async def test_shared_claim_is_unprepared_after_its_last_pod(sim: kubesim.Cluster) -> None:
    async with driver(sim) as fake:
        sim.store.create(pod("a", {"gpu": "shared"}, {"main": ["gpu"]}))
        sim.store.create(pod("b", {"gpu": "shared"}, {"main": ["gpu"]}))
        create_claim(sim, "shared", ["a", "b"])
        await wait_phase(sim, "a", "Running")
        await wait_phase(sim, "b", "Running")
        assert fake.prepare_calls == [["shared"]]
        sim.store.delete("pods", "a", "default")
        await eventually(lambda: sim.store.get("pods", "a", "default") is None, "a removed")
        assert fake.unprepare_calls == []
        sim.store.delete("pods", "b", "default")
        await eventually(lambda: sim.store.get("pods", "b", "default") is None, "b removed")
        assert fake.unprepare_calls == [["shared"]]


async def test_failing_unprepare_keeps_the_pod_object_until_it_works(
    sim: kubesim.Cluster,
) -> None:
    async with driver(sim) as fake:
        sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
        create_claim(sim, "c1", ["app"])
        await wait_phase(sim, "app", "Running")
        fake.call_error = "driver busy"
        sim.store.delete("pods", "app", "default")
        await eventually(lambda: len(fake.unprepare_calls) >= 2, "unprepare retried")
        assert sim.store.get("pods", "app", "default") is not None
        fake.call_error = ""
        await eventually(lambda: sim.store.get("pods", "app", "default") is None, "pod removed")


async def test_prepared_claims_survive_a_kubelet_restart(sim: kubesim.Cluster) -> None:
    async with driver(sim) as fake:
        sim.store.create(pod("app", {"gpu": "c1"}, {"main": ["gpu"]}))
        create_claim(sim, "c1", ["app"])
        await wait_phase(sim, "app", "Running")
        await sim.restart_kubelet(NODE)
        manager = sim.dra_manager(NODE)
        assert manager is not None
        # The claim comes back from the checkpoint; the plugin registers again by itself.
        assert ("default", "c1") in manager.claims
        await eventually(lambda: DRIVER in manager.plugins.plugins, "plugin registered again")
        sim.store.delete("pods", "app", "default")
        await eventually(lambda: fake.unprepare_calls == [["c1"]], "unprepared after restart")


async def test_slices_of_a_driver_without_plugin_are_deleted_after_the_wiping_delay() -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=config(dra_wiping_delay=0.2)
    ) as sim:
        async with driver(sim) as fake:
            fake.publish_slice()
        await eventually(
            lambda: not sim.store.list("resourceslices"), "ResourceSlices of the gone driver"
        )
        # A driver that comes back within the delay keeps its slices.
        async with driver(sim) as fake:
            fake.publish_slice()
        async with driver(sim):
            await asyncio.sleep(0.4)
            assert len(sim.store.list("resourceslices")) == 1


async def test_pods_without_claims_never_start_the_dra_manager(sim: kubesim.Cluster) -> None:
    manifest = pod("plain", {}, {"main": []})
    del manifest["spec"]["resourceClaims"]
    sim.store.create(manifest)
    await wait_phase(sim, "plain", "Running")
    assert sim.dra_manager(NODE) is None
