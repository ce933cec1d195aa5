"""The NVIDIA driver on the demo's simulated hosts, seen through the real kubectl: the driver
container's install log, the host files it leaves, NVML and nvidia-smi following the loaded
driver, its failures (Secure Boot, a precompiled image for another kernel, a host that already
runs a driver) in `kubectl logs` and `kubectl describe pod`, and the AKS node pools whose image
brings its own driver (seed documents 000/001) reported by the operator, never fought."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubesim_helpers import KUBECTL, needs_kubectl
from rich.console import Console
from waiting import DEADLINE, eventually

import kubesim
from gpu_operator.api import upstream_release
from gpu_operator.nodes.coexist import CoexistPolicy
from gpu_operator.nvml import driver_branches
from gpudemo import fleet, programs, session
from simhost import pci as simulated

pytestmark = needs_kubectl

NS = session.NAMESPACE
DRIVER_APP = "nvidia-driver-daemonset"
DRIVER_CTR = "nvidia-driver-ctr"
CUDA = "nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04"
# The driver the chart installs by default (NVIDIA's release we follow).
DEFAULT_DRIVER = upstream_release.current().images["driver"].version


@dataclass
class Demo:
    sim: kubesim.Cluster
    nodes: programs.Programs
    kubeconfig: Path

    async def kubectl(self, *args: str, stdin: str | None = None) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
        return proc.returncode or 0, out.decode()

    async def ok(self, *args: str, stdin: str | None = None) -> str:
        code, out = await self.kubectl(*args, stdin=stdin)
        assert code == 0, out
        return out

    def root(self, node: str) -> Path:
        return self.sim.node_root(node)

    def driver_pod(self, node: str) -> dict[str, Any] | None:
        for pod in self.sim.store.list("pods", NS):
            labels = pod["metadata"].get("labels") or {}
            if labels.get("app", "").startswith(DRIVER_APP) and pod["spec"].get("nodeName") == node:
                return pod
        return None

    def driver_status(self, node: str) -> dict[str, Any]:
        pod = self.driver_pod(node) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == DRIVER_CTR:
                return dict(status)
        return {}

    def summary(self) -> dict[str, Any]:
        """What a failed wait shows: the driver pods' container states."""
        return {
            f"{pod['spec'].get('nodeName')}/{pod['metadata']['name']}": {
                s.get("name"): s.get("state")
                for s in (pod.get("status") or {}).get("containerStatuses") or []
            }
            for pod in self.sim.store.list("pods", NS)
            if (pod["metadata"].get("labels") or {}).get("app", "").startswith(DRIVER_APP)
        }

    async def wait(self, what: str, check: Any, timeout: float = DEADLINE) -> None:
        await eventually(check, what, timeout=timeout, state=self.summary)

    async def crash_looping(self, node: str) -> str:
        """The driver pod of a node once its driver container failed and waits to restart."""

        def failed() -> bool:
            status = self.driver_status(node)
            waiting = (status.get("state") or {}).get("waiting") or {}
            last = (status.get("lastState") or {}).get("terminated") or {}
            return waiting.get("reason") == "CrashLoopBackOff" and bool(last.get("message"))

        await self.wait(f"driver container on {node} in CrashLoopBackOff", failed)
        pod = self.driver_pod(node)
        assert pod is not None
        return str(pod["metadata"]["name"])


def _policy(**driver: Any) -> dict[str, Any]:
    policy = copy.deepcopy(session.DEFAULT_POLICY)
    policy["spec"]["driver"] = {"enabled": True, **driver}
    return policy


@asynccontextmanager
async def served(
    pools: list[dict[str, Any]] | str, tmp_path: Path, *, timeout: float = DEADLINE, **extra: Any
) -> AsyncIterator[Demo]:
    """The demo on these pools (or a named fleet), serving kubectl once it converged or
    `timeout` passed (a failing driver never converges)."""
    ready: asyncio.Future[tuple[kubesim.Cluster, programs.Programs]] = (
        asyncio.get_running_loop().create_future()
    )
    chosen = fleet.NAMED[pools] if isinstance(pools, str) else fleet.parse({"pools": pools})
    options = session.Options(
        fleet=chosen,
        serve=True,
        kubeconfig_out=tmp_path / "kubeconfig",
        timing=extra.pop("timing", programs.Timing(scale=0.0)),
        timeout=timeout,
        live=False,
        on_serving=lambda sim, nodes: ready.set_result((sim, nodes)),
        **extra,
    )
    buffer = io.StringIO()
    task = asyncio.ensure_future(session.run(options, Console(file=buffer, width=200)))
    try:
        done, _ = await asyncio.wait(
            {task, ready}, timeout=timeout + DEADLINE, return_when="FIRST_COMPLETED"
        )
        assert ready in done, buffer.getvalue()
        sim, nodes = ready.result()
        yield Demo(sim, nodes, tmp_path / "kubeconfig")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _smi_pod(name: str, node: str) -> str:
    """A pod on `node` that the NVIDIA runtime would give every GPU and nvidia-smi."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "smi", "image": CUDA, "command": ["nvidia-smi"],
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            }],
        },
    })  # fmt: skip


async def test_the_driver_container_installs_like_nvidias_and_nvml_then_answers(
    tmp_path: Path,
) -> None:
    async with served([{"name": "t4", "machine": "t4x4"}], tmp_path) as demo:
        pod = demo.driver_pod("t4-1")
        assert pod is not None
        name = pod["metadata"]["name"]
        log = await demo.ok("-n", NS, "logs", name, "-c", DRIVER_CTR)
        steps = [
            f"Uncompressing NVIDIA Accelerated Graphics Driver for Linux-x86_64 {DEFAULT_DRIVER}",
            "========== NVIDIA Software Installer ==========",
            f"Starting installation of NVIDIA driver version {DEFAULT_DRIVER} for Linux kernel "
            "version 6.8.0-52-generic",
            "Unloading NVIDIA driver kernel modules...",
            "Compiling NVIDIA driver kernel modules...",
            "Loading NVIDIA driver kernel modules...",
            "+ modprobe nvidia",
            "+ modprobe nvidia-uvm",
            "+ modprobe nvidia-modeset",
            "Mounting NVIDIA driver rootfs...",
            "Done, now waiting for signal",
        ]
        at = [log.find(step) for step in steps]
        assert -1 not in at, log
        assert at == sorted(at), log

        root = demo.root("t4-1")
        assert simulated.nvidia_version(root) == DEFAULT_DRIVER
        for module in ("nvidia", "nvidia_uvm", "nvidia_modeset"):
            assert (root / "sys" / "module" / module / "refcnt").exists(), module
        assert (root / "sys" / "module" / "nvidia" / "refcnt").read_text() == "2\n"
        assert (root / "run/nvidia/driver/usr/bin/nvidia-smi").is_file()
        libcuda = f"run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{DEFAULT_DRIVER}"
        assert (root / libcuda).is_file()
        assert (root / "run/nvidia/validations/.driver-ctr-ready").exists()
        assert (root / "run/nvidia/nvidia-driver.pid").read_text().strip().isdigit()
        digest = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert (root / "run/nvidia/nvidia-driver.state").read_text() == digest[
            "DRIVER_CONFIG_DIGEST"
        ]

        # NVML follows the loaded driver: version from the image, CUDA from the branch.
        table = await demo.ok("-n", NS, "exec", name, "-c", DRIVER_CTR, "--", "nvidia-smi")
        assert f"Driver Version: {DEFAULT_DRIVER}" in table, table
        cuda = driver_branches.cuda_driver_version(DEFAULT_DRIVER)
        assert f"CUDA Version: {cuda // 1000}.{cuda % 1000 // 10}" in table, table

        # Take the driver away from the node (a human's label): the pod goes, and the driver
        # unloads (nothing runs on the GPUs) with its root and readiness marker.
        await demo.ok("label", "node", "t4-1", "nvidia.com/gpu.deploy.driver=false", "--overwrite")
        await demo.wait("driver unloaded", lambda: simulated.nvidia_version(root) is None)
        assert not (root / "sys/module/nvidia").exists()
        assert not (root / "run/nvidia/validations/.driver-ctr-ready").exists()
        assert not any((root / "run/nvidia/driver").iterdir())
        assert not (root / "run/nvidia/nvidia-driver.pid").exists()


async def test_nvidia_smi_fails_as_nvidias_does_until_the_driver_is_loaded(tmp_path: Path) -> None:
    # Real time (a build takes seconds): nvidia-smi in the driver container while it builds.
    slow = programs.Timing(scale=10.0)
    async with served(
        [{"name": "t4", "machine": "t4x4"}], tmp_path, timeout=1.0, timing=slow
    ) as demo:
        root = demo.root("t4-1")
        await demo.wait(
            "the driver container started installing",
            lambda: (root / "run/nvidia/nvidia-driver.pid").exists(),
        )
        pod = demo.driver_pod("t4-1")
        assert pod is not None
        assert simulated.nvidia_version(root) is None
        code, out = await demo.kubectl(
            "-n", NS, "exec", pod["metadata"]["name"], "-c", DRIVER_CTR, "--", "nvidia-smi"
        )
        assert (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." in out
        )
        assert "command terminated with exit code 9" in out
        assert code == 9


async def test_an_unsigned_driver_on_a_secure_boot_node_crash_loops_with_the_kernels_refusal(
    tmp_path: Path,
) -> None:
    pools = [{"name": "sb", "machine": "t4x4", "secureBoot": True}]
    async with served(pools, tmp_path, timeout=3.0) as demo:
        name = await demo.crash_looping("sb-1")
        refusal = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
        _, log = await demo.kubectl("-n", NS, "logs", name, "-c", DRIVER_CTR, "--previous")
        if refusal not in log:  # the restarted container may have failed again already
            log = await demo.ok("-n", NS, "logs", name, "-c", DRIVER_CTR)
        assert refusal in log, log
        assert "+ modprobe nvidia" in log, log
        described = await demo.ok("-n", NS, "describe", "pod", name)
        assert "CrashLoopBackOff" in described
        assert refusal in described, described
        assert simulated.nvidia_version(demo.root("sb-1")) is None
        status = demo.driver_status("sb-1")
        assert status["lastState"]["terminated"]["exitCode"] == 1
        # The ClusterPolicy status names the node and the kernel's refusal.
        await demo.sim.wait_for(
            lambda: refusal in _state_message(demo, "state-driver"),
            DEADLINE,
            "state-driver names it",
        )
        jsonpath = '{.status.states[?(@.name=="state-driver")].message}'
        shown = await demo.ok(
            "get", "clusterpolicy", session.POLICY_NAME, "-o", f"jsonpath={jsonpath}"
        )
        assert "sb-1: container nvidia-driver-ctr in CrashLoopBackOff" in shown, shown
        assert refusal in shown, shown


def _state_message(demo: Demo, name: str) -> str:
    policy = demo.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
    for state in (policy.get("status") or {}).get("states") or []:
        if state.get("name") == name:
            return str(state.get("message") or "")
    return ""


async def test_precompiled_drivers_are_signed_and_fail_on_a_kernel_they_were_not_built_for(
    tmp_path: Path,
) -> None:
    pools = [{"name": "sb", "machine": "t4x4", "secureBoot": True}]
    policy = _policy(
        usePrecompiled=True, repository="nvcr.io/nvidia", image="driver", version="580"
    )
    async with served(pools, tmp_path, policy=policy) as demo:
        root = demo.root("sb-1")
        pod = demo.driver_pod("sb-1")
        assert pod is not None
        image = pod["spec"]["containers"][0]["image"]
        assert image == "nvcr.io/nvidia/driver:580-6.8.0-52-generic-ubuntu22.04"
        # Signed modules load under Secure Boot.
        assert simulated.nvidia_version(root) == "580.95.05"
        log = await demo.ok("-n", NS, "logs", pod["metadata"]["name"], "-c", DRIVER_CTR)
        assert "Starting installation of NVIDIA driver branch 580 for Linux kernel" in log
        assert "Compiling" not in log

        # The node boots a newer kernel before NFD relabels it: the DaemonSet of the old kernel
        # runs the image built for that kernel, which has no modules for this one.
        (root / "proc/sys/kernel/osrelease").write_text("6.8.0-60-generic\n")
        await demo.ok("-n", NS, "delete", "pod", pod["metadata"]["name"], "--wait=false")
        name = await demo.crash_looping("sb-1")
        missing = "E: Unable to locate package linux-objects-nvidia-580-server-6.8.0-60-generic"
        _, log = await demo.kubectl("-n", NS, "logs", name, "-c", DRIVER_CTR, "--previous")
        if missing not in log:
            log = await demo.ok("-n", NS, "logs", name, "-c", DRIVER_CTR)
        assert missing in log, log
        described = await demo.ok("-n", NS, "describe", "pod", name)
        assert missing in described, described
        assert demo.driver_status("sb-1")["lastState"]["terminated"]["exitCode"] == 100
        assert simulated.nvidia_version(root) is None


async def test_aks_preinstalled_drivers_are_found_by_nfd_before_any_driver_pod_starts(
    tmp_path: Path,
) -> None:
    async with served("aks-preinstalled", tmp_path) as demo:
        gpu_nodes = ["t4-1", "t4-2"]
        # NFD's NodeFeature of each node lists the nvidia module the node image loaded; the
        # operator read it and labelled the nodes itself, before deploying anything there.
        labels = await demo.ok(
            "get", "nodes", *gpu_nodes, "-L", "nvidia.com/gpu.deploy.driver", "--no-headers"
        )
        assert labels.count("pre-installed") == 2, labels
        modules = await demo.ok(
            "-n", NS, "get", "nodefeatures", "t4-1", "-o",
            "jsonpath={.spec.features.flags.kernel\\.loadedmodule.elements}",
        )  # fmt: skip
        assert '"nvidia"' in modules, modules
        # No driver pod was ever created, on any node: the DaemonSet controller records every
        # pod it creates as an Event, and the driver DaemonSet schedules nowhere.
        created = await demo.ok(
            "-n", NS, "get", "events", "--field-selector",
            f"involvedObject.name={DRIVER_APP},reason=SuccessfulCreate", "-o", "name",
        )  # fmt: skip
        assert created.strip() == "", created
        desired = await demo.ok(
            "-n", NS, "get", "daemonset", DRIVER_APP, "-o",
            "jsonpath={.status.desiredNumberScheduled}",
        )  # fmt: skip
        assert desired == "0", desired
        pods = await demo.ok("-n", NS, "get", "pods", "-o", "wide")
        assert DRIVER_APP not in pods, pods

        # One Warning per node names the module and the NodeFeature it was seen in.
        events = await demo.ok(
            "get", "events", "-A", "--field-selector", "reason=CoexistenceConflict", "-o",
            "jsonpath={range .items[*]}{.type} {.involvedObject.name}: {.message}{\"\\n\"}{end}",
        )  # fmt: skip
        lines = sorted(events.strip().splitlines())
        assert [line.split(":")[0] for line in lines] == ["Warning t4-1", "Warning t4-2"], events
        for node, line in zip(gpu_nodes, lines, strict=True):
            assert (
                f"managed-driver: NFD saw the kernel module nvidia loaded (NodeFeature {NS}/{node}"
                in line
            ), line
            assert "the operator treats the driver as pre-installed here" in line
        described = await demo.ok("describe", "node", "t4-1")
        assert "CoexistenceConflict" in described, described
        policy = await demo.ok("describe", "clusterpolicy", session.POLICY_NAME)
        assert "coexistence: managed-driver on 2 node(s) (t4-1, t4-2): adapt" in policy, policy
        assert "PreinstalledDriver" not in await demo.ok("get", "events", "-A")

        # The host's driver serves the chain: GPUs are allocatable through it.
        for node in gpu_nodes:
            allocatable = await demo.ok(
                "get", "node", node, "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}"
            )
            assert allocatable == "4", (node, allocatable)
        assert simulated.nvidia_version(demo.root("t4-1")) == "570.195.03"


async def test_aks_nodes_with_a_preinstalled_driver_are_reported_and_left_alone(
    tmp_path: Path,
) -> None:
    # With the detector told to ignore managed drivers, the driver pods start and
    # k8s-driver-manager finds the host's driver (the path of a module loaded after NFD looked).
    ignore = {"coexist": CoexistPolicy(managed_driver="ignore")}
    async with served("aks-preinstalled", tmp_path, operator_settings=ignore) as demo:
        gpu_nodes = ["t4-1", "t4-2"]
        # k8s-driver-manager (the driver pod's init container) found the host's driver and
        # labelled the node; the driver DaemonSet left it.
        labels = await demo.ok(
            "get", "nodes", *gpu_nodes, "-L", "nvidia.com/gpu.deploy.driver", "--no-headers"
        )
        assert labels.count("pre-installed") == 2, labels

        def left() -> bool:
            return all(demo.driver_pod(n) is None for n in gpu_nodes)

        await demo.wait("driver pods gone", left)

        def reported() -> bool:
            policy = demo.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
            conditions = (policy.get("status") or {}).get("conditions") or []
            return any("preinstalled NVIDIA driver" in c.get("message", "") for c in conditions)

        await demo.wait("status names the preinstalled drivers", reported)
        status = await demo.ok(
            "get", "clusterpolicy", session.POLICY_NAME, "-o",
            'jsonpath={.status.conditions[?(@.type=="Ready")].message}',
        )  # fmt: skip
        assert "2 GPU node(s) already run a preinstalled NVIDIA driver (t4-1, t4-2)" in status
        assert "create the node pool with --gpu-driver none, or set driver.enabled=false" in status
        events = await demo.ok(
            "get", "events", "-A", "--field-selector", "reason=PreinstalledDriver", "-o",
            "jsonpath={range .items[*]}{.involvedObject.name} {.count}{\"\\n\"}{end}",
        )  # fmt: skip
        assert sorted(events.split()) == ["1", "1", "t4-1", "t4-2"], events

        # The host's driver serves the node: NVML answers with its version and CUDA 12.8.
        machine = demo.nodes.node("t4-1").machine
        assert machine is not None
        lib = machine.nvml()
        lib.init()
        assert (lib.driver_version(), lib.cuda_driver_version()) == ("570.195.03", 12080)

        # The operator relabels the node (it puts back a deploy label someone removed) and
        # leaves the driver's label as it is: no fight, and no second Event.
        gfd = "nvidia.com/gpu.deploy.gpu-feature-discovery"
        await demo.ok("label", "node", "t4-1", f"{gfd}-")

        def relabelled() -> bool:
            return gfd in (demo.sim.store.get("nodes", "t4-1") or {})["metadata"]["labels"]

        await demo.wait("the operator relabelled t4-1", relabelled)
        labels_now = demo.sim.store.get("nodes", "t4-1")["metadata"]["labels"]
        assert labels_now["nvidia.com/gpu.deploy.driver"] == "pre-installed"
        again = await demo.ok(
            "get", "events", "-A", "--field-selector", "reason=PreinstalledDriver", "-o",
            "jsonpath={range .items[*]}{.count}{\"\\n\"}{end}",
        )  # fmt: skip
        assert again.split() == ["1", "1"], again

        # NVIDIA's driver container started on such a host without the driver manager (an
        # older chart, a hand-made pod) finds the driver in use and says so.
        await demo.ok("create", "-f", "-", stdin=_driver_pod_without_manager("t4-1"))
        status_now: dict[str, Any] = {}

        def crashed() -> bool:
            nonlocal status_now
            pod = demo.sim.store.get("pods", "bare-driver", NS) or {}
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            status_now = statuses[0]
            last = (status_now.get("lastState") or {}).get("terminated") or {}
            return bool(last.get("message"))

        await demo.wait("bare driver container failed", crashed)
        in_use = "Could not unload NVIDIA driver kernel modules, driver is in use"
        log = await demo.ok("-n", NS, "logs", "bare-driver", "--previous")
        assert in_use in log, log
        described = await demo.ok("-n", NS, "describe", "pod", "bare-driver")
        assert in_use in described, described
        assert simulated.nvidia_version(demo.root("t4-1")) == "570.195.03"  # still the host's


def _driver_pod_without_manager(node: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bare-driver", "namespace": NS, "labels": {
            "app": DRIVER_APP, "app.kubernetes.io/component": "nvidia-driver",
            "nvidia.com/gpu-operator.state": "state-driver",
        }},
        "spec": {
            "nodeName": node, "hostPID": True,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": DRIVER_CTR, "image": "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
                "command": ["nvidia-driver"], "args": ["init"],
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "run-nvidia", "mountPath": "/run/nvidia"}],
            }],
            "volumes": [{"name": "run-nvidia", "hostPath": {
                "path": "/run/nvidia", "type": "DirectoryOrCreate"}}],
        },
    })  # fmt: skip


@pytest.mark.parametrize(
    ("image", "version", "kernel", "signed"),
    [
        ("nvcr.io/nvidia/driver:580.95.05-ubuntu22.04", "580.95.05", None, False),
        ("nvcr.io/nvidia/driver:580-6.8.0-52-generic-ubuntu22.04", "580.95.05",
         "6.8.0-52-generic", True),
        ("nvcr.io/nvidia/driver:570.195.03-rhel9.4", "570.195.03", None, False),
        ("nvcr.io/nvidia/driver:535-signed-ubuntu22.04", "535.183.01", None, True),
    ],
)  # fmt: skip
def test_the_driver_image_tag_says_version_kernel_and_whether_modules_are_signed(
    image: str, version: str, kernel: str | None, signed: bool
) -> None:
    from simhost import driver

    parsed = driver.parse_image(image)
    assert (parsed.version, parsed.kernel, parsed.signed) == (version, kernel, signed)


def test_a_driver_image_without_a_driver_in_its_tag_is_refused_with_the_expected_forms() -> None:
    from simhost import driver

    with pytest.raises(driver.ImageError, match="expected <version>-<os>"):
        driver.parse_image("nvcr.io/nvidia/driver:latest")
    with pytest.raises(driver.ImageError, match="tagged by driver branch"):
        driver.parse_image("nvcr.io/nvidia/driver:580.95.05-6.8.0-52-generic-ubuntu22.04")
    pinned = driver.parse_image("nvcr.io/nvidia/driver@sha256:ab", {"DRIVER_VERSION": "550.54.15"})
    assert pinned.version == "550.54.15"
