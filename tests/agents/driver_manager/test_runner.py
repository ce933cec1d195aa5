"""The driver manager against a simulated cluster (kubesim) and a simulated host: operands paused
and their pods waited for, GPU pods evicted through the Eviction API (a PodDisruptionBudget that
allows no disruption is retried and reported, then honoured once it allows one), our cordon and
only ours undone, the labels restored exactly after a failure or a stop, the config-digest skip,
a preinstalled host driver, and the whole flow under the driver's RBAC."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, daemonset, instant
from vm_hosts import host as make_host
from waiting import DEADLINE, eventually, within

import kubesim
from gpu_operator.agents.driver_manager import plan, runner
from gpu_operator.agents.driver_manager.settings import Settings
from gpu_operator.api import keys
from gpu_operator.kube import driver_node
from gpu_operator.operands import driver as driver_operand
from gpu_operator.operands.facts import ClusterFacts
from simhost import driver_host

NODE = "gpu-1"
NS = "gpu-operator"
DEPLOY = keys.DEPLOY_PREFIX
P = plan.PAUSED
LABELS = {
    "kubernetes.io/hostname": NODE,
    keys.GPU_PRESENT: "true",
    DEPLOY + "driver": "true",
    DEPLOY + "device-plugin": "true",
    DEPLOY + "gpu-feature-discovery": "true",
    DEPLOY + "dcgm-exporter": "custom",
    DEPLOY + "dcgm": "false",
}
OPERANDS = {
    "nvidia-device-plugin-daemonset": DEPLOY + "device-plugin",
    "gpu-feature-discovery": DEPLOY + "gpu-feature-discovery",
}
FAST = Settings(
    node_name=NODE,
    enable_auto_drain=False,  # as the driver DaemonSet renders it
    poll_interval=0.05,
    operand_wait_timeout=DEADLINE,
    preinstalled_exit_delay=0.01,
)


@dataclass
class Node:
    sim: kubesim.Cluster
    host: driver_host.NodeRootHost
    kubeconfig: Path

    @property
    def root(self) -> Path:
        return self.host.root

    def node(self) -> dict[str, Any]:
        return self.sim.store.get("nodes", NODE) or {}

    def labels(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("labels") or {})

    def annotations(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("annotations") or {})

    def cordoned(self) -> bool:
        return bool(self.node().get("spec", {}).get("unschedulable"))

    def pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return self.sim.store.list("pods", namespace, label_selector=selector)

    def events(self, reason: str) -> list[str]:
        return [
            str(e.get("message"))
            for e in self.sim.store.list("events", NS)
            if e.get("reason") == reason and e["involvedObject"].get("name") == NODE
        ]

    def summary(self) -> dict[str, Any]:
        """What a failed wait shows: the node's labels and cordon, the pods and their phases."""
        return {
            "labels": self.labels() if self.node() else None,
            "cordoned": self.cordoned(),
            "pods": {
                f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": (
                    p.get("status") or {}
                ).get("phase")
                for p in self.sim.store.list("pods")
            },
        }

    async def until(
        self, predicate: Callable[[], Any], what: str, timeout: float = DEADLINE
    ) -> None:
        await eventually(predicate, what, timeout=timeout, state=self.summary)

    async def run(
        self, settings: Settings = FAST, stop: asyncio.Event | None = None
    ) -> runner.Outcome:
        api = driver_node.DriverNodeApi(driver_node.connect(str(self.kubeconfig)), NODE, NS)
        try:
            return await runner.Runner(settings, self.host, api, stop).run()
        finally:
            await api.close()

    def load_driver(self) -> None:
        self.host.kernel.load_nvidia(version="570.195.03")
        for module in ("nvidia_uvm", "nvidia_modeset"):
            self.host.kernel.load(module)
        run = self.root / "run" / "nvidia"
        (run / "driver" / "usr" / "bin").mkdir(parents=True, exist_ok=True)
        (run / "driver" / "usr" / "bin" / "nvidia-smi").write_text("")
        (run / "nvidia-driver.pid").write_text("4242\n")
        (run / "nvidia-driver.state").write_text("old-digest")


def _gpu_deployment(name: str = "cuda") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubi9",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


def _pdb(min_available: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "cuda", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "cuda"}}},
    }


@contextlib.asynccontextmanager
async def cluster(
    *, gpu_pod: bool = True, authorization: str = "open", processes: bool = False
) -> AsyncIterator[Node]:
    """A GPU node with the device plugin and GFD DaemonSets running, a GPU Deployment (one pod)
    and its hardware on the node's root; `processes`: the GPU pod's process holds the driver."""
    async with kubesim.Cluster(
        kubelet=instant(), authorization=authorization, images=TEST_IMAGES
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        sim.add_node(NODE, labels=dict(LABELS), capacity={"nvidia.com/gpu": "4"})
        root = sim.node_root(NODE)
        make_host(root, "t4x4")

        def running() -> list[str]:
            return [
                f"pid 7 of {p['metadata']['name']}"
                for p in sim.store.list("pods", "default", label_selector="app=cuda")
                if p["spec"].get("nodeName") == NODE
            ]

        host = driver_host.NodeRootHost(root, running if processes else None)
        for app, label in OPERANDS.items():
            ds = daemonset(app, NS)
            ds["spec"]["template"]["spec"]["nodeSelector"] = {label: "true"}
            sim.store.create(ds)
        if gpu_pod:
            sim.store.create(_gpu_deployment())
        kubeconfig = Path(sim.kubeconfig_path)
        if authorization == "rbac":
            kubeconfig = _driver_account(sim)
        node = Node(sim, host, kubeconfig)

        def settled() -> bool:
            ready = [
                p
                for app in OPERANDS
                for p in node.pods(f"app={app}", NS)
                if (p.get("status") or {}).get("phase") == "Running"
            ]
            cuda = [
                p
                for p in node.pods("app=cuda")
                if (p.get("status") or {}).get("phase") == "Running"
            ]
            return len(ready) == len(OPERANDS) and len(cuda) == (1 if gpu_pod else 0)

        await node.until(settled, "operand and GPU pods running")
        yield node


def _driver_account(sim: kubesim.Cluster) -> Path:
    """The driver DaemonSet's ServiceAccount and RBAC as rendered, plus the Events rule the
    driver manager needs (not rendered yet); a kubeconfig authenticating as that account."""
    for obj in driver_operand.rbac(
        ClusterFacts(namespace=NS), driver_operand.SA_NAME, "state-driver"
    ):
        sim.store.create(obj)
    sim.store.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "driver-manager-events", "namespace": NS},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}],
        }
    )
    sim.store.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "driver-manager-events", "namespace": NS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "driver-manager-events",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": driver_operand.SA_NAME, "namespace": NS}
            ],
        }
    )
    token = sim.auth.token_for_service_account(NS, driver_operand.SA_NAME)
    path: Path = sim.auth.write_kubeconfig(
        token, Path(sim.kubeconfig_path).with_name("driver-kubeconfig"), NS
    )
    return path


def _restored(node: Node) -> bool:
    labels = node.labels()
    return all(labels.get(k) == v for k, v in LABELS.items())


async def test_a_pdb_refusal_is_retried_and_reported_until_the_budget_allows_the_eviction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpu_operator.agents.driver_manager")
    async with cluster() as c:
        c.load_driver()
        c.sim.store.create(_pdb(1))
        (original,) = c.pods("app=cuda")
        task = asyncio.create_task(c.run())
        await c.until(lambda: c.events("EvictionRefused"), "an EvictionRefused Event")
        # Meanwhile: the operands are paused and gone, the node is ours (cordoned), the pod runs.
        labels = c.labels()
        assert labels[DEPLOY + "device-plugin"] == P
        assert labels[DEPLOY + "dcgm-exporter"] == f"custom_{P}"
        assert labels[DEPLOY + "dcgm"] == "false"
        assert not c.pods("app=nvidia-device-plugin-daemonset", NS)
        assert c.cordoned()
        assert c.annotations()[plan.INITIAL_STATE_ANNOTATION] == "false"
        assert c.host.loaded("nvidia")
        (refused,) = c.events("EvictionRefused")
        assert f"eviction of default/{original['metadata']['name']} refused" in refused
        assert "The disruption budget cuda needs 1 healthy pods and has 1 currently" in refused
        await asyncio.sleep(0)
        assert not task.done()

        c.sim.store.patch(
            "poddisruptionbudgets.policy", "cuda", {"spec": {"minAvailable": 0}}, "default"
        )
        outcome = await within(task, "the driver manager to finish")

        assert outcome == runner.Outcome(runner.EXIT_OK, "uninstall")
        assert c.sim.store.get("pods", original["metadata"]["name"], "default") is None
        (evicted,) = c.events("GPUPodEvicted")
        assert "refusal(s)" in evicted
        assert not c.host.loaded("nvidia")
        assert not c.host.loaded("nvidia_uvm")
        assert not (c.root / "run/nvidia/nvidia-driver.pid").exists()
        assert not (c.root / "run/nvidia/driver/usr/bin/nvidia-smi").exists()
        assert c.labels() == {**c.labels(), **LABELS}  # restored exactly
        assert not c.cordoned()
        assert plan.INITIAL_STATE_ANNOTATION not in c.annotations()
        log = caplog.text
        for line in (
            "pausing GPU operands: dcgm-exporter custom -> custom_paused-for-driver-upgrade, "
            "device-plugin true -> paused-for-driver-upgrade",
            "the paused operands' pods are gone",
            "cordoned node gpu-1",
            "retrying every 0.05s (drain timeout: no limit)",
            "rmmod nvidia_uvm: done",
            "rmmod nvidia: done",
            "uncordoned node gpu-1",
            "restoring GPU operands: dcgm-exporter custom_paused-for-driver-upgrade -> custom",
            "done in",
        ):
            assert line in log, line


async def test_the_drain_timeout_ends_a_refused_eviction_and_the_labels_come_back() -> None:
    async with cluster() as c:
        c.load_driver()
        c.sim.store.create(_pdb(1))
        outcome = await c.run(Settings(**{**FAST.__dict__, "drain_timeout": 0.3}))
        assert outcome.code == runner.EXIT_FAILED
        assert "eviction of GPU pods still refused after 0.3s" in outcome.reason
        await c.until(lambda: _restored(c), "labels restored")
        assert not c.cordoned()
        assert c.host.loaded("nvidia")  # nothing was unloaded
        (failed,) = c.events("DriverManagerFailed")
        assert "disruption budget cuda" in failed


async def test_a_driver_in_use_fails_and_restores_the_labels_exactly() -> None:
    async with cluster(gpu_pod=False) as c:
        c.load_driver()
        c.host.kernel.hold("nvidia")  # e.g. a process on the host keeps a GPU open
        c.sim.store.patch("nodes", NODE, {"metadata": {"labels": {DEPLOY + "nvsm": f"x_{P}"}}})
        outcome = await c.run()
        assert outcome.code == runner.EXIT_FAILED
        assert (
            "the NVIDIA driver is in use: rmmod: ERROR: Module nvidia is in use" in outcome.reason
        )
        assert "stop the GPU workloads on gpu-1" in outcome.reason
        # Restored exactly, and the pause an earlier run left on nvsm goes too.
        assert c.labels() == {**c.labels(), **LABELS, DEPLOY + "nvsm": "x"}
        assert not c.cordoned()
        assert c.events("DriverInUse")
        await c.until(lambda: c.pods("app=nvidia-device-plugin-daemonset", NS), "plugin back")


async def test_a_node_cordoned_by_a_person_stays_cordoned() -> None:
    async with cluster(gpu_pod=False) as c:
        c.load_driver()
        c.sim.store.patch("nodes", NODE, {"spec": {"unschedulable": True}})
        outcome = await c.run()
        assert outcome.code == runner.EXIT_OK
        assert c.cordoned()
        assert plan.INITIAL_STATE_ANNOTATION not in c.annotations()
        assert not c.events("Uncordoned")


async def test_a_label_changed_while_paused_is_left_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpu_operator.agents.driver_manager")
    async with cluster() as c:
        c.load_driver()
        c.sim.store.create(_pdb(1))
        task = asyncio.create_task(c.run())
        await c.until(lambda: c.events("EvictionRefused"), "an EvictionRefused Event")
        c.sim.store.patch(
            "nodes", NODE, {"metadata": {"labels": {DEPLOY + "device-plugin": "false"}}}
        )
        c.sim.store.patch(
            "poddisruptionbudgets.policy", "cuda", {"spec": {"minAvailable": 0}}, "default"
        )
        assert (await within(task, "the driver manager to finish")).code == runner.EXIT_OK
        assert c.labels()[DEPLOY + "device-plugin"] == "false"
        assert c.labels()[DEPLOY + "gpu-feature-discovery"] == "true"
        assert f"left {DEPLOY}device-plugin=false as it is" in caplog.text


async def test_sigterm_while_waiting_restores_the_labels_and_our_cordon() -> None:
    async with cluster() as c:
        c.load_driver()
        c.sim.store.create(_pdb(1))
        stop = asyncio.Event()
        task = asyncio.create_task(c.run(stop=stop))
        await c.until(lambda: c.events("EvictionRefused"), "an EvictionRefused Event")
        assert c.cordoned()
        stop.set()
        outcome = await within(task, "the driver manager to stop")
        assert outcome.code == runner.EXIT_STOPPED
        assert _restored(c)
        assert not c.cordoned()
        assert plan.INITIAL_STATE_ANNOTATION not in c.annotations()


async def test_an_equal_config_digest_keeps_the_driver_and_the_gpu_pod() -> None:
    async with cluster() as c:
        c.load_driver()
        (gpu_pod,) = c.pods("app=cuda")
        settings = Settings(**{**FAST.__dict__, "driver_config_digest": "old-digest"})
        outcome = await c.run(settings)
        assert outcome == runner.Outcome(runner.EXIT_OK, "keep-driver")
        assert c.host.loaded("nvidia")
        assert c.sim.store.get("pods", gpu_pod["metadata"]["name"], "default") is not None
        assert not c.events("Cordoned")
        assert c.events("DriverKept")
        # The old root goes (the new driver container mounts its own).
        assert not (c.root / "run/nvidia/driver/usr/bin/nvidia-smi").exists()
        assert _restored(c)


async def test_a_preinstalled_host_driver_labels_the_node_and_exits_non_zero() -> None:
    async with cluster(gpu_pod=False) as c:
        smi = c.root / "usr" / "bin" / "nvidia-smi"
        smi.parent.mkdir(parents=True, exist_ok=True)
        smi.write_text("#!/bin/sh\n")
        c.host.kernel.load_nvidia(version="550.127.05")
        outcome = await c.run()
        assert outcome == runner.Outcome(
            runner.EXIT_FAILED, "preinstalled", "the NVIDIA driver is pre-installed on the host"
        )
        assert c.labels()[plan.DRIVER_DEPLOY_LABEL] == plan.PREINSTALLED
        (event,) = c.events("HostDriverDetected")
        assert "550.127.05 is pre-installed" in event
        assert "--gpu-driver none" in event
        # Nothing else was touched.
        assert c.labels()[DEPLOY + "device-plugin"] == "true"
        assert not c.cordoned()


async def test_a_node_without_a_driver_only_cleans_up() -> None:
    async with cluster() as c:
        run = c.root / "run" / "nvidia"
        (run / "driver" / "etc").mkdir(parents=True)
        (run / "driver" / "etc" / "os-release").write_text("ID=ubuntu\n")
        (run / "nvidia-driver.pid").write_text("1\n")
        outcome = await c.run()
        assert outcome == runner.Outcome(runner.EXIT_OK, "no-driver")
        assert not (run / "nvidia-driver.pid").exists()
        assert not (run / "driver" / "etc" / "os-release").exists()
        assert c.labels() == {**c.labels(), **LABELS}
        assert len(c.pods("app=cuda")) == 1
        assert not c.events("OperandsPaused")


async def test_operand_pods_that_do_not_leave_fail_the_run_in_bounded_time() -> None:
    async with cluster(gpu_pod=False) as c:
        c.load_driver()
        stray = daemonset("nvidia-dcgm", NS)["spec"]["template"]
        c.sim.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "dcgm-by-hand",
                    "namespace": NS,
                    "labels": {"app": "nvidia-dcgm"},
                },
                "spec": {**stray["spec"], "nodeName": NODE},
            }
        )
        outcome = await c.run(Settings(**{**FAST.__dict__, "operand_wait_timeout": 0.3}))
        assert outcome.code == runner.EXIT_FAILED
        assert outcome.reason == (
            "nvidia-dcgm: 1 pod(s) still on the node after 0.3s: dcgm-by-hand"
        )
        assert c.events("OperandsStillRunning")
        assert _restored(c)
        assert c.host.loaded("nvidia")


async def test_auto_drain_drains_when_the_driver_is_in_use_and_tries_again() -> None:
    async with cluster(processes=True) as c:
        c.load_driver()
        settings = Settings(
            **{**FAST.__dict__, "enable_gpu_pod_eviction": False, "enable_auto_drain": True}
        )
        outcome = await c.run(settings)
        assert outcome == runner.Outcome(runner.EXIT_OK, "uninstall")
        assert c.events("DriverInUse")
        assert not c.host.loaded("nvidia")
        assert not c.cordoned()
        # The drain evicted the GPU pod; the DaemonSet pods stayed.
        assert any("default/cuda-" in e for e in c.events("PodEvicted"))
        assert not c.events("GPUPodEvicted")


async def test_gpu_pods_without_a_controller_block_the_eviction_with_the_reason() -> None:
    async with cluster(gpu_pod=False) as c:
        c.load_driver()
        c.sim.store.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bare", "namespace": "default"},
                "spec": {
                    "nodeName": NODE,
                    "containers": [
                        {
                            "name": "c",
                            "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubi9",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
        )
        outcome = await c.run()
        assert outcome.code == runner.EXIT_FAILED
        assert (
            "default/bare: no controller would recreate it (set DRAIN_USE_FORCE=true"
            in outcome.reason
        )
        assert _restored(c)
        assert not c.cordoned()


async def test_the_flow_runs_under_the_driver_service_account() -> None:
    async with cluster(authorization="rbac") as c:
        c.load_driver()
        outcome = await c.run()
        assert outcome == runner.Outcome(runner.EXIT_OK, "uninstall")
        assert c.events("GPUPodEvicted")
        assert c.events("OperandsRestored")
        assert _restored(c)


class _RacingApi:
    """A node API whose first label patch loses a race: someone sets the device plugin's label
    to `false` between our read and our write (the server answers 409)."""

    def __init__(self) -> None:
        self.labels = {k: v for k, v in LABELS.items() if k.startswith(DEPLOY)}
        self.version = 1
        self.raced = False
        self.patches: list[dict[str, Any]] = []

    async def node(self) -> dict[str, Any]:
        meta = {"labels": dict(self.labels), "resourceVersion": str(self.version)}
        return {"metadata": meta, "spec": {}}

    async def patch(self, patch: dict[str, Any], *, resource_version: str | None = None) -> None:
        if not self.raced:
            self.raced = True
            self.labels[DEPLOY + "device-plugin"] = "false"
            self.version += 1
        if resource_version is not None and resource_version != str(self.version):
            raise driver_node.Conflict("the object has been modified")
        self.patches.append(patch)
        self.labels.update((patch.get("metadata") or {}).get("labels") or {})
        self.version += 1

    async def pods(self, **_: Any) -> list[dict[str, Any]]:
        return []

    async def event(self, *_: str) -> None:
        return None


async def test_a_label_patch_that_loses_a_race_is_recomputed_from_the_new_labels(
    tmp_path: Path,
) -> None:
    make_host(tmp_path, "t4x4")
    api = _RacingApi()
    settings = Settings(**{**FAST.__dict__, "enable_gpu_pod_eviction": False})
    run = runner.Runner(settings, driver_host.NodeRootHost(tmp_path), api)  # type: ignore[arg-type]
    run.plan = plan.make_plan(plan.NodeFacts(dict(api.labels)), plan.HostFacts(), settings)
    await run._pause({DEPLOY + "device-plugin": P, DEPLOY + "gpu-feature-discovery": P})
    assert api.patches == [{"metadata": {"labels": {DEPLOY + "gpu-feature-discovery": P}}}]
    await run._restore(plan.paused_values(LABELS, plan.OPERAND_LABELS) | run._repaused)
    assert api.labels[DEPLOY + "device-plugin"] == "false"  # the newer value stays
    assert api.labels[DEPLOY + "gpu-feature-discovery"] == "true"


async def test_a_patch_with_a_stale_resource_version_is_a_conflict() -> None:
    async with kubesim.Cluster(kubelet=instant(), images=TEST_IMAGES) as sim:
        sim.add_node(NODE, labels={"a": "1"})
        api = driver_node.DriverNodeApi(driver_node.connect(str(sim.kubeconfig_path)), NODE, NS)
        try:
            stale = (await api.node())["metadata"]["resourceVersion"]
            sim.store.patch("nodes", NODE, {"metadata": {"labels": {"a": "2"}}})
            with pytest.raises(driver_node.Conflict):
                await api.patch({"metadata": {"labels": {"a": "3"}}}, resource_version=stale)
            fresh = (await api.node())["metadata"]["resourceVersion"]
            await api.patch({"metadata": {"labels": {"a": "3"}}}, resource_version=fresh)
            assert (await api.node())["metadata"]["labels"]["a"] == "3"
        finally:
            await api.close()
