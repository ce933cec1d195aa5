"""The node protocol: pause/restore decisions as pure functions, and whole reconfigurations on a
mock machine against an in-memory node whose DaemonSet pods leave when their label is paused."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from waiting import DEADLINE, eventually, within

from gpu_operator import nvml
from gpu_operator.agents.mig_manager import config as cfg
from gpu_operator.agents.mig_manager import gpus as gpus_mod
from gpu_operator.agents.mig_manager import host as host_mod
from gpu_operator.agents.mig_manager import protocol as proto
from gpu_operator.agents.mig_manager import reconfigure, runner
from gpu_operator.api import keys
from gpu_operator.nvml import mock
from gpu_operator.operands import mig_manager as mig_operand

NS = "gpu-operator"
DP = "nvidia.com/gpu.deploy.device-plugin"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
DCGM = "nvidia.com/gpu.deploy.dcgm"
CLIENT = "nvidia.com/gpu.deploy.client"
CONFIG = cfg.loads(mig_operand.default_mig_config_yaml(), "default")


# -- pure decisions ---------------------------------------------------------------------------


def test_only_clients_that_are_true_are_paused() -> None:
    labels = {
        DP: "true",
        GFD: "true",
        EXPORTER: "false",  # a human turned it off
        "nvidia.com/gpu.deploy.driver": "true",  # not a GPU client
        CLIENT: "paused-for-driver-upgrade",  # someone else's pause
    }
    assert proto.pause_patch(labels) == {DP: proto.PAUSED, GFD: proto.PAUSED}


def test_restore_touches_only_labels_still_holding_our_pause() -> None:
    labels = {
        DP: proto.PAUSED,
        GFD: "false",  # a human set false while we were paused: it stays false
        EXPORTER: proto.PAUSED,
        CLIENT: "paused-for-driver-upgrade",
        keys.DEPLOY_OPERANDS: "true",
    }
    assert proto.restore_patch(labels) == {DP: "true", EXPORTER: "true"}


def test_gpu_client_pods_are_the_operands_and_client_daemonsets() -> None:
    pods = [
        proto.PodRef(NS, "plugin", {"app": "nvidia-device-plugin-daemonset"}),
        proto.PodRef("other", "plugin-lookalike", {"app": "nvidia-device-plugin-daemonset"}),
        proto.PodRef("ml", "agent", {}, {CLIENT: "true"}, daemonset=True),
        proto.PodRef("ml", "job", {}, {CLIENT: "true"}, daemonset=False),
        proto.PodRef(NS, "validator", {"app": "nvidia-cuda-validator"}),
    ]
    assert [p.name for p in proto.waiting_for(pods, NS)] == ["plugin", "agent"]
    assert [p.name for p in proto.validators(pods, NS, proto.VALIDATOR_APPS_BEFORE)] == [
        "validator"
    ]


def test_state_patch_sets_and_clears_the_message() -> None:
    assert proto.state_patch("failed", "why") == {
        "metadata": {
            "labels": {keys.MIG_CONFIG_STATE: "failed"},
            "annotations": {proto.STATE_MESSAGE_ANNOTATION: "why"},
        }
    }
    patch = proto.state_patch("success")
    assert patch["metadata"]["annotations"] == {proto.STATE_MESSAGE_ANNOTATION: None}  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "wanted"), [(None, None), ("", None), (" all-1g.5gb ", "all-1g.5gb")]
)
def test_empty_label_values_ask_for_nothing(value: str | None, wanted: str | None) -> None:
    assert proto.wanted_config(value) == wanted


# -- an in-memory node ------------------------------------------------------------------------


def _pod(
    namespace: str, name: str, app: str | None, selector: str | None, ds: bool = True
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "labels": {"app": app} if app else {},
            "ownerReferences": [{"kind": "DaemonSet", "name": name}] if ds else [],
        },
        "spec": {"nodeSelector": {selector: "true"} if selector else {}},
    }


class FakeNode:
    """A Node plus the pods on it; a DaemonSet pod leaves `linger` polls after its selector stops
    matching (never when `stuck`), as the DaemonSet controller and kubelet would remove it."""

    def __init__(self, labels: dict[str, str], *, linger: int = 2, stuck: bool = False) -> None:
        self.labels = dict(labels)
        self.annotations: dict[str, str] = {}
        self.history: list[dict[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.linger = linger
        self.stuck = stuck
        self._unmatched: dict[str, int] = {}
        self.pod_list = [
            _pod(NS, "plugin", "nvidia-device-plugin-daemonset", DP),
            _pod(NS, "gfd", "gpu-feature-discovery", GFD),
            _pod(NS, "exporter", "nvidia-dcgm-exporter", EXPORTER),
            _pod(NS, "cuda-validator", "nvidia-cuda-validator", None, ds=False),
            _pod(NS, "operator-validator", "nvidia-operator-validator", None),
            _pod("ml", "client-agent", None, CLIENT),
            _pod("default", "unrelated", "web", None, ds=False),
        ]

    async def metadata(self) -> tuple[dict[str, str], dict[str, str]]:
        return dict(self.labels), dict(self.annotations)

    async def patch(self, patch: Any) -> None:
        meta = patch.get("metadata") or {}
        for target, changes in (
            (self.labels, meta.get("labels")),
            (self.annotations, meta.get("annotations")),
        ):
            for key, value in (changes or {}).items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        self.history.append(dict(self.labels))

    async def pods(self) -> list[dict[str, Any]]:
        kept = []
        for pod in self.pod_list:
            selector = pod["spec"]["nodeSelector"]
            name = pod["metadata"]["name"]
            if selector and any(self.labels.get(k) != v for k, v in selector.items()):
                self._unmatched[name] = self._unmatched.get(name, 0) + 1
                if not self.stuck and self._unmatched[name] > self.linger:
                    continue
            kept.append(pod)
        self.pod_list = kept
        return copy.deepcopy(kept)

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted.append(f"{namespace}/{name}")

    async def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def states(self) -> list[str | None]:
        return [h.get(keys.MIG_CONFIG_STATE) for h in self.history]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def labels_for(config: str, **extra: str) -> dict[str, str]:
    return {
        keys.MIG_CONFIG: config,
        DP: "true",
        GFD: "true",
        EXPORTER: "true",
        CLIENT: "true",
        **extra,
    }


def manager(
    machine: mock.MockMachine,
    node: FakeNode,
    *,
    config: cfg.MigConfigFile = CONFIG,
    host: host_mod.MockHost | None = None,
    **settings: Any,
) -> reconfigure.Reconfigurer:
    options = {"clients_namespace": NS, "poll_interval": 0.0, "clients_timeout": 30.0, **settings}
    gpus = gpus_mod.Gpus(machine.nvml, host or host_mod.MockHost(machine))
    return reconfigure.Reconfigurer(
        node, gpus, lambda: config, reconfigure.Settings(**options), clock=Clock()
    )


def layout_of(machine: mock.MockMachine) -> list[dict[str, int]]:
    return [g.devices for g in gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine)).read()]


def modes(machine: mock.MockMachine) -> list[tuple[bool, bool]]:
    return [
        (g.mig_enabled, g.mig_pending)
        for g in gpus_mod.Gpus(machine.nvml, host_mod.MockHost(machine)).read()
    ]


# -- whole reconfigurations -------------------------------------------------------------------


async def test_an_applied_config_is_reported_without_pausing_anything() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-single")
    node = FakeNode(labels_for("all-1g.5gb"))
    outcome = await manager(machine, node).run("all-1g.5gb")
    assert outcome.state == "success"
    assert node.states() == ["success"]
    assert node.labels[DP] == "true"
    assert node.events == []
    assert node.deleted == []


async def test_a_change_pauses_true_clients_applies_and_restores_exactly() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    node = FakeNode(labels_for("all-1g.5gb", **{EXPORTER: "false"}))
    del node.labels[CLIENT]  # absent stays absent
    outcome = await manager(machine, node).run("all-1g.5gb")

    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{"1g.5gb": 7}] * 8
    assert node.states()[0] == "pending"
    paused = node.history[1]
    assert (paused[DP], paused[GFD], paused[EXPORTER]) == (proto.PAUSED, proto.PAUSED, "false")
    assert CLIENT not in paused
    assert (node.labels[DP], node.labels[GFD], node.labels[EXPORTER]) == ("true", "true", "false")
    assert CLIENT not in node.labels
    assert node.labels[keys.MIG_CONFIG_STATE] == "success"
    assert proto.STATE_MESSAGE_ANNOTATION not in node.annotations
    assert node.deleted == [f"{NS}/cuda-validator", f"{NS}/operator-validator"]
    ((kind, reason, message),) = node.events
    assert (kind, reason) == ("Normal", "MigConfigApplied")
    assert message == (
        "MIG config 'all-1g.5gb': GPUs 0-7 (A100-SXM4-40GB): "
        "MIG on, 3g.20gb x1, 2g.10gb x1, 1g.5gb x2 -> MIG on, 1g.5gb x7"
    )


async def test_the_change_waits_for_every_client_pod_including_client_daemonsets() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("all-1g.5gb"), linger=3)
    outcome = await manager(machine, node).run("all-1g.5gb")
    assert outcome.state == "success"
    names = [p["metadata"]["name"] for p in node.pod_list]
    assert "client-agent" not in names  # it had to leave before the GPUs changed
    assert "unrelated" in names


async def test_only_gpus_that_differ_are_touched_so_their_pods_keep_running() -> None:
    text = """
version: v1
mig-configs:
  half:
    - {devices: [0, 1, 2, 3], mig-enabled: false}
    - {devices: [4, 5, 6, 7], mig-enabled: true, mig-devices: {"3g.20gb": 2}}
"""
    machine = mock.MockMachine.from_preset("dgx-a100")
    # A full-GPU workload on GPU 0, which the config leaves as it is: upstream's per-node reset
    # would fail on it; here GPU 0 is never reset.
    machine.start_process(0, 4242, used_memory_mib=1024)
    node = FakeNode(labels_for("half"))
    outcome = await manager(machine, node, config=cfg.loads(text)).run("half")
    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{}] * 4 + [{"3g.20gb": 2}] * 4
    lib = machine.nvml()
    lib.init()
    assert [p.pid for p in lib.device_by_index(0).running_processes()] == [4242]


async def test_an_unknown_config_fails_without_pausing_and_says_why() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("all-9g.99gb"))
    outcome = await manager(machine, node).run("all-9g.99gb")
    assert outcome.state == "failed"
    assert node.states() == ["failed"]
    message = node.annotations[proto.STATE_MESSAGE_ANNOTATION]
    assert message.startswith("default: no MIG config named 'all-9g.99gb'; the file defines: ")
    assert node.events == [("Warning", "MigConfigFailed", message)]
    assert node.labels[DP] == "true"


async def test_a_config_the_gpus_cannot_hold_fails_naming_entry_and_gpu() -> None:
    text = (
        "version: v1\nmig-configs:\n"
        '  big: [{devices: all, mig-enabled: true, mig-devices: {"7g.40gb": 2}}]\n'
    )
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("big"))
    outcome = await manager(machine, node, config=cfg.loads(text)).run("big")
    assert outcome.state == "failed"
    assert outcome.message == (
        "mig-configs.big[0]: GPU 0 (A100-SXM4-40GB): A100-SXM4-40GB holds at most 1 7g.40gb "
        "GPU instance(s); 7g.40gb x2 needs 2"
    )
    assert modes(machine) == [(False, False)] * 8


async def test_clients_that_never_leave_fail_the_change_and_are_restored() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("all-1g.5gb"), stuck=True)
    outcome = await manager(machine, node, clients_timeout=5).run("all-1g.5gb")
    assert outcome.state == "failed"
    assert outcome.message.startswith("GPU client pods did not leave the node within 5s: ")
    assert f"{NS}/plugin" in outcome.message
    assert modes(machine) == [(False, False)] * 8
    assert (node.labels[DP], node.labels[GFD], node.labels[CLIENT]) == ("true", "true", "true")


async def test_a_failed_apply_restores_the_previous_layout() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    before = layout_of(machine)
    machine.fail_next("create_gpu_instance", nvml.InsufficientResources, gpu=2)
    node = FakeNode(labels_for("all-3g.20gb"))
    outcome = await manager(machine, node).run("all-3g.20gb")
    assert outcome.state == "failed"
    assert "GPU 2: creating 3g.20gb at slices 0-3 failed" in outcome.message
    assert outcome.message.endswith("the previous layout was restored")
    assert layout_of(machine) == before
    assert node.labels[DP] == "true"
    assert node.events[-1][:2] == ("Warning", "MigConfigFailed")


async def test_a_blocked_mode_change_rolls_back_every_gpu_and_is_retried() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.start_process(3, 77, used_memory_mib=512)
    node = FakeNode(labels_for("all-1g.5gb"))
    mgr = manager(machine, node)
    outcome = await mgr.run("all-1g.5gb")
    # A GPU a process holds is busy for now (NVML: in use): retried, not given up.
    assert (outcome.state, outcome.transient, outcome.retry_in) == ("pending", True, 5.0)
    assert "resetting GPU 3" in outcome.message
    assert "the previous layout was restored; retrying in 5s (1 try so far)" in outcome.message
    assert modes(machine) == [(False, False)] * 8
    assert node.labels[DP] == "true"
    assert [e[1] for e in node.events] == ["MigConfigRetrying"]
    # The process ends: the next try applies the config.
    machine.stop_process(3, 77)
    outcome = await mgr.run("all-1g.5gb", attempt=2)
    assert outcome.state == "success", outcome.message
    assert layout_of(machine) == [{"1g.5gb": 7}] * 8


async def test_with_reboot_a_blocked_mode_change_reboots_and_finishes_after_it() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.start_process(3, 77, used_memory_mib=512)
    host = host_mod.MockHost(machine)
    node = FakeNode(labels_for("all-1g.5gb"))
    mgr = manager(machine, node, host=host, with_reboot=True)
    outcome = await mgr.run("all-1g.5gb")
    assert outcome.state == "rebooting"
    assert host.reboots == 1
    assert node.labels[DP] == proto.PAUSED  # still paused across the reboot
    # The manager starts again after the reboot and finishes the change.
    outcome = await mgr.run("all-1g.5gb")
    assert outcome.state == "success", outcome.message
    seen = [s for i, s in enumerate(node.states()) if i == 0 or s != node.states()[i - 1]]
    assert seen == ["pending", "rebooting", "pending", "success"]
    assert layout_of(machine) == [{"1g.5gb": 7}] * 8
    assert node.labels[DP] == "true"


async def test_a_missing_driver_leaves_the_config_pending_and_the_next_try_applies_it() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    loaded: list[str | None] = [None]
    machine.driver_probe = lambda: loaded[0]  # the driver pod is being replaced
    node = FakeNode(labels_for("all-1g.5gb"))
    mgr = manager(machine, node)
    outcome = await mgr.run("all-1g.5gb")
    assert (outcome.state, outcome.transient, outcome.retry_in) == ("pending", True, 5.0)
    assert outcome.message.startswith("reading the GPUs failed: Driver Not Loaded")
    assert outcome.message.endswith("; retrying in 5s (1 try so far)")
    assert node.states() == ["pending"]
    assert node.annotations[proto.STATE_MESSAGE_ANNOTATION] == outcome.message
    assert node.labels[DP] == "true"  # nothing was paused
    assert node.events == [("Warning", "MigConfigRetrying", outcome.message)]
    outcome = await mgr.run("all-1g.5gb", attempt=2)
    assert (outcome.state, outcome.retry_in) == ("pending", 10.0)
    assert len(node.events) == 1  # one Event per transient cause, not one per try

    loaded[0] = "580.95.05"  # the new driver is loaded
    outcome = await mgr.run("all-1g.5gb", attempt=3)
    assert outcome.state == "success", outcome.message
    assert (outcome.transient, outcome.retry_in) == (False, None)
    assert layout_of(machine) == [{"1g.5gb": 7}] * 8
    assert proto.STATE_MESSAGE_ANNOTATION not in node.annotations
    assert node.events[-1][1] == "MigConfigApplied"


@pytest.mark.parametrize(
    ("extra", "marker", "why"),
    [
        (
            {"nvidia.com/gpu.deploy.driver": "true"},
            False,
            "the driver container is not ready (.driver-ctr-ready is missing",
        ),
        (
            {CLIENT: "paused-for-driver-upgrade"},
            True,
            "the driver manager paused the GPU operands: "
            "nvidia.com/gpu.deploy.client=paused-for-driver-upgrade",
        ),
        (
            {keys.UPGRADE_STATE: "pod-restart-required"},
            True,
            "the driver pod is being replaced",
        ),
    ],
)
async def test_the_gpus_are_not_touched_while_the_driver_restarts(
    extra: dict[str, str], marker: bool, why: str
) -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-mixed")
    machine.fail_next("init", nvml.Unknown, times=None)  # NVML must not even be opened
    node = FakeNode(labels_for("all-1g.5gb", **extra))
    mgr = manager(machine, node)
    mgr.driver_marker = lambda: marker
    outcome = await mgr.run("all-1g.5gb")
    assert (outcome.state, outcome.retry_in) == ("pending", 5.0)
    assert outcome.message.startswith("waiting for the NVIDIA driver: ")
    assert why in outcome.message
    assert node.labels[DP] == "true"


async def test_a_driver_lost_in_the_middle_of_a_change_is_retried_not_rebooted() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    host = host_mod.MockHost(machine)
    machine.fail_next("set_mig_mode", nvml.DriverNotLoaded, gpu=4)
    node = FakeNode(labels_for("all-1g.5gb"))
    outcome = await manager(machine, node, host=host, with_reboot=True).run("all-1g.5gb")
    assert (outcome.state, outcome.transient) == ("pending", True)
    assert "GPU 4: setting MIG mode on failed: " in outcome.message
    assert host.reboots == 0  # a reboot would not bring a missing driver back
    assert modes(machine) == [(False, False)] * 8
    assert node.labels[DP] == "true"


async def test_a_transient_cause_that_stays_shows_failed_while_retrying() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.driver_probe = lambda: None
    node = FakeNode(labels_for("all-1g.5gb"))
    mgr = manager(machine, node)
    outcome = await mgr.run("all-1g.5gb", attempt=7)  # 5 s, 10 s, ... reached the cap
    assert (outcome.state, outcome.retry_in) == ("failed", 300.0)
    assert outcome.message.endswith("; still retrying every 5m (7 tries so far)")
    assert node.events == [("Warning", "MigConfigFailed", outcome.message)]


async def test_a_permanent_failure_is_not_retried() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("all-9g.99gb"))
    outcome = await manager(machine, node).run("all-9g.99gb", attempt=3)
    assert (outcome.state, outcome.transient, outcome.retry_in) == ("failed", False, None)
    assert "retrying" not in outcome.message


class NoReboot(host_mod.MockHost):
    def reboot(self) -> None:
        raise host_mod.HostError("the node did not reboot within 600s")


async def test_a_reboot_that_does_not_happen_fails_and_restores_the_clients() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    machine.start_process(3, 77, used_memory_mib=512)
    node = FakeNode(labels_for("all-1g.5gb"))
    mgr = manager(machine, node, host=NoReboot(machine), with_reboot=True)
    outcome = await mgr.run("all-1g.5gb")
    assert outcome.state == "failed"
    assert outcome.message.endswith("rebooting failed: the node did not reboot within 600s")
    assert node.labels[DP] == "true"


async def test_a_mode_change_still_missing_after_a_reboot_fails() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    node = FakeNode(labels_for("all-1g.5gb", **{keys.MIG_CONFIG_STATE: "rebooting"}))
    outcome = await manager(machine, node).run("all-1g.5gb")
    assert outcome.state == "failed"
    assert outcome.message == "MIG mode change for 'all-1g.5gb' did not take effect after rebooting"


async def test_a_pause_left_by_an_interrupted_run_is_restored_by_the_next() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100-mig-single")
    node = FakeNode(labels_for("all-1g.5gb", **{DP: proto.PAUSED}))
    outcome = await manager(machine, node).run("all-1g.5gb")
    assert outcome.state == "success"
    assert node.labels[DP] == "true"


async def test_host_clients_are_stopped_and_started_around_a_change() -> None:
    machine = mock.MockMachine.from_preset("dgx-a100")
    host = host_mod.MockHost(machine)
    node = FakeNode(labels_for("all-1g.5gb"))
    services = ("nvsm.service", "nvidia-dcgm.service")
    mgr = manager(
        machine,
        node,
        host=host,
        with_shutdown_host_gpu_clients=True,
        host_gpu_client_services=services,
    )
    assert (await mgr.run("all-1g.5gb")).state == "success"
    # A mode change also stops the kubelet, as upstream does.
    assert host.stopped == [*services, "kubelet.service"]
    assert host.started == host.stopped


async def test_the_selection_is_persisted_for_the_hosts_own_service(tmp_path: Path) -> None:
    state_file = "etc/systemd/system/nvidia-mig-manager.service.d/override.conf"
    (tmp_path / state_file).parent.mkdir(parents=True)
    (tmp_path / state_file).write_text("")
    machine = mock.MockMachine.from_preset("dgx-a100")
    host = host_mod.MockHost(machine, root=tmp_path, state_file="/" + state_file)
    assert (
        await manager(machine, FakeNode(labels_for("all-1g.5gb")), host=host).run("all-1g.5gb")
    ).state == "success"
    assert (tmp_path / state_file).read_text() == (
        '[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-1g.5gb"\n'
    )


def test_a_simulated_reboot_ends_processes_applies_modes_and_drops_instances() -> None:
    partitioned = mock.MockMachine.from_preset("dgx-a100-mig-single")
    partitioned.start_process(0, 1, used_memory_mib=10)
    plain = mock.MockMachine.from_preset("dgx-a100")
    lib = plain.nvml()
    lib.init()
    lib.device_by_index(1).set_mig_mode(True)
    for machine in (partitioned, plain):
        machine.reboot()
    assert modes(partitioned) == [(True, True)] * 8  # MIG mode survives a reboot ...
    assert layout_of(partitioned) == [{}] * 8  # ... its instances do not
    assert modes(plain)[:2] == [(False, False), (True, True)]
    check = partitioned.nvml()
    check.init()
    assert check.device_by_index(0).running_processes() == []


# -- the loop ---------------------------------------------------------------------------------


class Recorder:
    """Stands in for the Reconfigurer: records what the loop asks for (and which try it is);
    each config answers with its queued outcomes (a state, or a whole Outcome), then success."""

    def __init__(self, states: dict[str, list[str | reconfigure.Outcome]] | None = None) -> None:
        self.calls: list[str] = []
        self.attempts: list[tuple[str, int]] = []
        self.states = states or {}
        self.gate = asyncio.Event()
        self.gate.set()

    async def run(self, name: str, *, attempt: int = 1) -> reconfigure.Outcome:
        self.calls.append(name)
        self.attempts.append((name, attempt))
        await self.gate.wait()
        queue = self.states.get(name)
        answer = queue.pop(0) if queue else "success"
        return answer if isinstance(answer, reconfigure.Outcome) else reconfigure.Outcome(answer)


class Loop:
    """The manager's loop over a label whose values the test sends one by one (and, with
    `driver`, the driver's readiness as the test reports it)."""

    def __init__(self, rec: Recorder, *, driver: bool = False) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.driver: asyncio.Queue[bool | None] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.idle = asyncio.Event()
        self.task = asyncio.create_task(
            runner.run(
                rec,  # type: ignore[arg-type]
                self._values(),
                stop=self.stop,
                on_idle=self.idle.set,
                driver_ready=self._driver() if driver else None,
            )
        )

    async def _values(self) -> AsyncIterator[str | None]:
        while True:
            yield await self.queue.get()

    async def _driver(self) -> AsyncIterator[bool | None]:
        while True:
            yield await self.driver.get()

    def push(self, value: str | None) -> None:
        self.idle.clear()
        self.queue.put_nowait(value)

    async def caught_up(self) -> None:
        await within(self.idle.wait(), "the loop to be idle (all values handled)")

    async def send(self, value: str | None) -> None:
        self.push(value)
        await self.caught_up()

    async def close(self) -> None:
        self.stop.set()
        await within(self.task, "the loop to stop")


async def test_the_loop_applies_the_value_at_start_and_ignores_empty_ones() -> None:
    rec = Recorder()
    loop = Loop(rec)
    await loop.send(None)
    await loop.send("")
    assert rec.calls == []
    await loop.send("all-balanced")
    assert rec.calls == ["all-balanced"]
    await loop.close()


async def test_values_that_arrive_during_a_change_collapse_to_the_newest() -> None:
    rec = Recorder()
    rec.gate.clear()
    loop = Loop(rec)
    loop.push("a")
    await _until(lambda: rec.calls == ["a"], rec)
    loop.push("b")
    loop.push("c")
    rec.gate.set()
    await _until(lambda: len(rec.calls) == 2, rec)
    await loop.caught_up()
    assert rec.calls == ["a", "c"]
    await loop.close()


async def test_a_value_changed_back_during_a_change_is_not_applied_twice() -> None:
    rec = Recorder()
    rec.gate.clear()
    loop = Loop(rec)
    loop.push("a")
    await _until(lambda: rec.calls == ["a"], rec)
    loop.push("b")
    loop.push("a")
    rec.gate.set()
    await loop.caught_up()
    await loop.send("a")
    assert rec.calls == ["a"]
    await loop.close()


async def test_a_simulated_reboot_runs_the_change_again() -> None:
    rec = Recorder({"all-1g.5gb": ["rebooting", "success"]})
    loop = Loop(rec)
    await loop.send("all-1g.5gb")
    assert rec.calls == ["all-1g.5gb", "all-1g.5gb"]
    await loop.close()


def _transient(retry_in: float) -> reconfigure.Outcome:
    return reconfigure.Outcome("pending", "driver missing", transient=True, retry_in=retry_in)


async def test_a_transient_outcome_is_tried_again_after_its_delay() -> None:
    rec = Recorder({"a": [_transient(0.01), _transient(0.01), "success"]})
    loop = Loop(rec)
    loop.push("a")
    await _until(lambda: len(rec.calls) == 3, rec)
    await loop.caught_up()
    assert rec.attempts == [("a", 1), ("a", 2), ("a", 3)]
    await loop.close()


async def test_a_permanent_failure_waits_for_the_label() -> None:
    rec = Recorder({"a": ["failed"]})
    loop = Loop(rec)
    await loop.send("a")
    await asyncio.sleep(0.05)
    assert rec.calls == ["a"]
    await loop.close()


async def test_a_new_value_runs_at_once_even_while_a_retry_is_due() -> None:
    rec = Recorder({"a": [_transient(3600)]})
    loop = Loop(rec)
    await loop.send("a")
    await loop.send("b")
    assert rec.attempts == [("a", 1), ("b", 1)]
    await loop.send("a")  # a fresh start for `a`, not its second try
    assert rec.attempts[-1] == ("a", 1)
    await loop.close()


async def test_the_driver_coming_back_retries_at_once_and_rechecks_a_success() -> None:
    rec = Recorder({"a": [_transient(3600)]})
    loop = Loop(rec, driver=True)
    loop.driver.put_nowait(False)
    await loop.send("a")
    assert rec.attempts == [("a", 1)]
    loop.idle.clear()
    loop.driver.put_nowait(True)  # the driver container is ready again
    await _until(lambda: len(rec.calls) == 2, rec)
    await loop.caught_up()
    assert rec.attempts == [("a", 1), ("a", 1)]
    # Gone and back once more after a success: the applied config is checked again (a reload
    # does not keep GPU instances).
    loop.idle.clear()
    loop.driver.put_nowait(False)
    loop.driver.put_nowait(True)
    await _until(lambda: len(rec.calls) == 3, rec)
    await loop.close()


async def test_a_driver_coming_back_asks_for_nothing_without_a_value() -> None:
    rec = Recorder()
    loop = Loop(rec, driver=True)
    loop.driver.put_nowait(False)
    await loop.send(None)
    loop.driver.put_nowait(True)
    await asyncio.sleep(0.05)
    assert rec.calls == []
    await loop.close()


async def _until(predicate: Any, rec: Recorder, timeout: float = DEADLINE) -> None:
    """Yield to the loop until `predicate()` holds (failing after `timeout` with the calls seen)."""
    # interval 0: a yield, not a delay
    await eventually(
        predicate,
        "the loop to make the expected calls",
        timeout=timeout,
        interval=0,
        state=lambda: rec.calls,
    )
