"""The driver manager's plan, state in and steps out: the four paths, the label rules, the GPU pod
selection, and the undo steps of every failure path."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from gpu_operator.agents.driver_manager import plan
from gpu_operator.agents.driver_manager.settings import Settings
from gpu_operator.api import keys

P = plan.PAUSED
DEPLOY = keys.DEPLOY_PREFIX
# A container node as the operator labels it.
LABELS = {
    DEPLOY + "driver": "true",
    DEPLOY + "operator-validator": "true",
    DEPLOY + "container-toolkit": "true",
    DEPLOY + "device-plugin": "true",
    DEPLOY + "gpu-feature-discovery": "true",
    DEPLOY + "dcgm-exporter": "true",
    DEPLOY + "dcgm": "true",
    DEPLOY + "mig-manager": "true",
    DEPLOY + "node-status-exporter": "true",
}
LOADED = plan.HostFacts(loaded_modules=frozenset({"nvidia", "nvidia_uvm", "nvidia_modeset"}))
# The env the driver DaemonSet renders (eviction on, auto-drain off).
RENDERED = Settings(node_name="gpu-1", enable_auto_drain=False, driver_config_digest="d2")


def node(labels: dict[str, str] | None = None, **annotations: str) -> plan.NodeFacts:
    return plan.NodeFacts(
        labels=dict(LABELS if labels is None else labels),
        annotations={k.replace("_", "/", 1): v for k, v in annotations.items()},
    )


def upgrade_node(labels: dict[str, str] | None = None) -> plan.NodeFacts:
    base = node(labels)
    return plan.NodeFacts(base.labels, {keys.UPGRADE_ENABLED: "true"})


def kinds(steps: tuple[plan.Step, ...]) -> list[str]:
    return [type(s).__name__ for s in steps]


def only(steps: tuple[plan.Step, ...], kind: type[Any]) -> Any:
    (found,) = [s for s in steps if isinstance(s, kind)]
    return found


# ----- label rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "paused"),
    [
        (None, None),
        ("", ""),
        ("false", "false"),
        ("true", P),
        ("foo", f"foo_{P}"),
        (P, P),
        (f"foo_{P}", f"foo_{P}"),
        ("paused-for-mig-change", f"paused-for-mig-change_{P}"),
    ],
)
def test_pause_value_follows_upstreams_rewrite_rules(value: str | None, paused: str | None) -> None:
    assert plan.pause_value(value) == paused


@pytest.mark.parametrize("value", ["true", "foo", "paused-for-mig-change", "false", ""])
def test_unpausing_a_paused_value_gives_the_original_back(value: str) -> None:
    paused = plan.pause_value(value)
    assert paused is not None
    assert plan.unpause_value(paused) == value


def test_a_pause_left_by_an_interrupted_run_unpauses_to_true() -> None:
    assert plan.unpause_value(P) == "true"
    assert plan.unpause_value(f"custom_{P}") == "custom"


def test_pause_patch_changes_only_labels_that_need_it() -> None:
    labels = {
        DEPLOY + "device-plugin": "true",
        DEPLOY + "dcgm": "false",
        DEPLOY + "gpu-feature-discovery": "",
        DEPLOY + "dcgm-exporter": P,
        DEPLOY + "nvsm": "custom",
    }
    patch = plan.pause_patch(labels, plan.OPERAND_LABELS)
    assert patch == {DEPLOY + "device-plugin": P, DEPLOY + "nvsm": f"custom_{P}"}
    # Absent labels stay absent.
    assert DEPLOY + "operator-validator" not in patch


def test_restore_sets_back_exactly_what_was_paused() -> None:
    before = {DEPLOY + "device-plugin": "true", DEPLOY + "nvsm": "custom", DEPLOY + "dcgm": "false"}
    paused = plan.paused_values(before, plan.OPERAND_LABELS)
    now = {**before, **plan.pause_patch(before, plan.OPERAND_LABELS)}
    restore = plan.restore_patch(paused, now)
    assert {**now, **restore.patch} == before
    assert restore.changed_meanwhile == {}


def test_restore_leaves_a_label_someone_changed_while_paused() -> None:
    paused = {
        DEPLOY + "device-plugin": P,
        DEPLOY + "dcgm-exporter": P,
        DEPLOY + "gpu-feature-discovery": P,
    }
    now = {DEPLOY + "device-plugin": "false", DEPLOY + "dcgm-exporter": P}  # GFD's label removed
    restore = plan.restore_patch(paused, now)
    assert restore.patch == {DEPLOY + "dcgm-exporter": "true"}
    assert restore.changed_meanwhile == {
        DEPLOY + "device-plugin": "false",
        DEPLOY + "gpu-feature-discovery": None,
    }


def test_restore_does_not_report_labels_that_were_never_paused() -> None:
    # A failure before the pause patch: the labels still hold their original values.
    paused = {DEPLOY + "device-plugin": P, DEPLOY + "dcgm": "false"}
    restore = plan.restore_patch(
        paused, {DEPLOY + "device-plugin": "true", DEPLOY + "dcgm": "false"}
    )
    assert restore.patch == {}
    assert restore.changed_meanwhile == {}


def test_describe_changes_reads_like_a_diff() -> None:
    text = plan.describe_changes({DEPLOY + "dcgm": "true"}, {DEPLOY + "dcgm": P})
    assert text == f"dcgm true -> {P}"


# ----- the four paths ---------------------------------------------------------------------


def test_a_preinstalled_host_driver_labels_the_node_and_fails_without_touching_operands() -> None:
    facts = plan.HostFacts(host_driver_version="550.127.05", loaded_modules=frozenset({"nvidia"}))
    result = plan.make_plan(node(), facts, RENDERED)
    assert result.route == "preinstalled"
    assert result.steps == (
        plan.MarkPreinstalled("550.127.05"),
        plan.ExitAfter(60.0, "the NVIDIA driver is pre-installed on the host"),
    )
    assert result.on_failure == ()


def test_no_loaded_driver_skips_pause_and_eviction() -> None:
    result = plan.make_plan(node(), plan.HostFacts(), RENDERED)
    assert result.route == "no-driver"
    assert kinds(result.steps) == [
        "CleanupDriverRoot", "UnbindVfio", "Uncordon", "RestoreLabels",
    ]  # fmt: skip


def test_no_loaded_driver_restores_a_pause_left_by_an_interrupted_run() -> None:
    labels = {**LABELS, DEPLOY + "device-plugin": P}
    result = plan.make_plan(node(labels), plan.HostFacts(), RENDERED)
    restore = only(result.steps, plan.RestoreLabels)
    assert plan.restore_patch(restore.paused, labels).patch == {DEPLOY + "device-plugin": "true"}


def test_no_loaded_driver_unloads_nouveau_and_waits_for_mofed_with_rdma() -> None:
    facts = plan.HostFacts(loaded_modules=frozenset({"nouveau"}), mellanox_present=True)
    settings = Settings(node_name="n", gpu_direct_rdma_enabled=True, use_host_mofed=True)
    result = plan.make_plan(node(), facts, settings)
    assert kinds(result.steps) == [
        "CleanupDriverRoot", "UnloadNouveau", "UnbindVfio", "WaitForMofed", "Uncordon",
        "RestoreLabels",
    ]  # fmt: skip
    assert only(result.steps, plan.WaitForMofed) == plan.WaitForMofed(True, 0.0)


def test_rdma_without_a_mellanox_device_does_not_wait_for_mofed() -> None:
    settings = Settings(node_name="n", gpu_direct_rdma_enabled=True)
    for facts in (plan.HostFacts(), LOADED):
        assert "WaitForMofed" not in kinds(plan.make_plan(node(), facts, settings).steps)


def test_uninstall_with_upstreams_defaults() -> None:
    result = plan.make_plan(node(), LOADED, Settings(node_name="gpu-1"))
    assert result.route == "uninstall"
    assert kinds(result.steps) == [
        "PauseOperands", "WaitForPods", "Cordon", "EvictGpuPods", "UnloadDriver", "UnbindVfio",
        "Uncordon", "RestoreLabels",
    ]  # fmt: skip
    assert only(result.steps, plan.EvictGpuPods) == plan.EvictGpuPods(fallback_drain=True)
    assert only(result.steps, plan.UnloadDriver).drain_and_retry
    assert result.notes == ("DRIVER_CONFIG_DIGEST is not set: the driver is reinstalled",)


def test_uninstall_pauses_every_deployed_gpu_operand_and_waits_for_their_pods() -> None:
    result = plan.make_plan(node(), LOADED, RENDERED)
    pause = only(result.steps, plan.PauseOperands)
    assert pause.patch == {
        DEPLOY + name: P
        for name in ("operator-validator", "container-toolkit", "device-plugin",
                     "gpu-feature-discovery", "dcgm-exporter", "dcgm", "mig-manager")
    }  # fmt: skip
    # The driver's own label and operands that hold no GPU are not paused.
    assert DEPLOY + "driver" not in pause.patch
    assert DEPLOY + "node-status-exporter" not in pause.patch
    wait = only(result.steps, plan.WaitForPods)
    assert wait.timeout == 300.0
    assert wait.apps[:3] == (
        "nvidia-operator-validator", "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset",
    )  # fmt: skip
    assert "nvidia-mig-manager" in wait.apps  # its label is set
    assert "nvidia-vgpu-device-manager" not in wait.apps  # its label is not


def test_the_rendered_env_evicts_gpu_pods_but_never_drains() -> None:
    result = plan.make_plan(node(), LOADED, RENDERED)
    assert only(result.steps, plan.EvictGpuPods) == plan.EvictGpuPods(fallback_drain=False)
    assert not only(result.steps, plan.UnloadDriver).drain_and_retry
    assert result.on_failure[0] == plan.Uncordon()


def test_the_upgrade_policy_annotation_disables_cordon_eviction_and_drain() -> None:
    result = plan.make_plan(upgrade_node(), LOADED, Settings(node_name="gpu-1"))
    assert kinds(result.steps) == [
        "PauseOperands", "WaitForPods", "UnloadDriver", "UnbindVfio", "RestoreLabels",
    ]  # fmt: skip
    assert not only(result.steps, plan.UnloadDriver).drain_and_retry
    assert kinds(result.on_failure) == ["RestoreLabels"]
    assert any("upgrade controller" in note for note in result.notes)
    assert f"{keys.UPGRADE_STATE}=upgrade-required" in result.in_use_hint


def test_an_upgrade_enabled_annotation_other_than_true_changes_nothing() -> None:
    facts = plan.NodeFacts(dict(LABELS), {keys.UPGRADE_ENABLED: "false"})
    assert "EvictGpuPods" in kinds(plan.make_plan(facts, LOADED, RENDERED).steps)


def test_auto_drain_without_eviction_drains_only_when_the_driver_is_in_use() -> None:
    settings = Settings(node_name="n", enable_gpu_pod_eviction=False, enable_auto_drain=True)
    result = plan.make_plan(node(), LOADED, settings)
    assert "EvictGpuPods" not in kinds(result.steps)
    assert "Cordon" not in kinds(result.steps)
    assert only(result.steps, plan.UnloadDriver).drain_and_retry
    assert "Uncordon" in kinds(result.steps)


def test_with_eviction_and_drain_off_nothing_is_cordoned_and_the_hint_says_why() -> None:
    # The VFIO and vGPU managers' init containers.
    settings = Settings(node_name="n", enable_gpu_pod_eviction=False, enable_auto_drain=False)
    result = plan.make_plan(node(), LOADED, settings)
    assert not {"Cordon", "EvictGpuPods", "Uncordon"} & set(kinds(result.steps))
    assert kinds(result.on_failure) == ["RestoreLabels"]
    assert "ENABLE_GPU_POD_EVICTION=true" in result.in_use_hint


def test_an_equal_config_digest_keeps_the_driver_and_the_gpu_pods() -> None:
    facts = plan.HostFacts(loaded_modules=LOADED.loaded_modules, stored_digest="d2")
    result = plan.make_plan(node(), facts, RENDERED)
    assert result.route == "keep-driver"
    assert kinds(result.steps) == [
        "PauseOperands", "WaitForPods", "KeepDriver", "CleanupDriverRoot", "RestoreLabels",
    ]  # fmt: skip
    assert only(result.steps, plan.KeepDriver) == plan.KeepDriver("d2")


@pytest.mark.parametrize(
    ("facts", "host", "route"),
    [
        (node(), LOADED, "uninstall"),
        (upgrade_node(), LOADED, "uninstall"),  # the upgrade controller's upgrades
        (
            node(),
            plan.HostFacts(loaded_modules=LOADED.loaded_modules, stored_digest="d2"),
            "keep-driver",  # a restart in place
        ),
    ],
)
def test_the_mig_manager_is_paused_while_a_loaded_driver_is_replaced_and_restored_after(
    facts: plan.NodeFacts, host: plan.HostFacts, route: str
) -> None:
    # As k8s-driver-manager: the MIG manager must not partition GPUs under a driver that goes
    # away, and its new pod applies the node's config again on the new driver.
    result = plan.make_plan(facts, host, RENDERED)
    assert result.route == route
    key = DEPLOY + "mig-manager"
    assert only(result.steps, plan.PauseOperands).patch[key] == P
    assert "nvidia-mig-manager" in only(result.steps, plan.WaitForPods).apps
    restore = only(result.steps, plan.RestoreLabels)
    assert plan.restore_patch(restore.paused, {key: P}).patch == {key: "true"}
    assert only(result.on_failure, plan.RestoreLabels).paused[key] == P


def test_force_reinstall_uninstalls_even_with_an_equal_digest() -> None:
    facts = plan.HostFacts(loaded_modules=LOADED.loaded_modules, stored_digest="d2")
    settings = Settings(node_name="n", driver_config_digest="d2", force_reinstall=True)
    result = plan.make_plan(node(), facts, settings)
    assert result.route == "uninstall"
    assert any("FORCE_REINSTALL" in note for note in result.notes)


@pytest.mark.parametrize("stored", [None, "d1", ""])
def test_a_different_or_missing_stored_digest_uninstalls(stored: str | None) -> None:
    facts = plan.HostFacts(loaded_modules=LOADED.loaded_modules, stored_digest=stored)
    assert plan.make_plan(node(), facts, RENDERED).route == "uninstall"


def test_the_vgpu_host_driver_releases_vgpus_before_unloading() -> None:
    facts = plan.HostFacts(loaded_modules=frozenset({"nvidia", "nvidia_vgpu_vfio"}))
    steps = kinds(plan.make_plan(node(), facts, RENDERED).steps)
    assert steps.index("ReleaseVgpus") == steps.index("UnloadDriver") - 1


def test_modules_unload_users_first_and_nvidia_last() -> None:
    order = only(plan.make_plan(node(), LOADED, RENDERED).steps, plan.UnloadDriver).modules
    assert order[-1] == "nvidia"
    assert order.index("nvidia_drm") < order.index("nvidia_modeset") < order.index("nvidia")
    assert {"nvidia_uvm", "nvidia_peermem", "nvidia_fs", "nvidia_vgpu_vfio", "gdrdrv"} <= set(order)


def test_a_nouveau_module_is_unloaded_last_on_uninstall() -> None:
    facts = plan.HostFacts(loaded_modules=LOADED.loaded_modules | {"nouveau"})
    assert kinds(plan.make_plan(node(), facts, RENDERED).steps)[-1] == "UnloadNouveau"


def test_client_and_custom_labels_are_paused_and_their_daemonset_pods_waited_for() -> None:
    labels = {**LABELS, DEPLOY + "client": "true", "example.com/gpu-app": "on"}
    settings = Settings(node_name="n", node_label_for_gpu_pod_eviction="example.com/gpu-app")
    result = plan.make_plan(node(labels), LOADED, settings)
    pause = only(result.steps, plan.PauseOperands)
    assert pause.patch[DEPLOY + "client"] == P
    assert pause.patch["example.com/gpu-app"] == f"on_{P}"
    waits = [s for s in result.steps if isinstance(s, plan.WaitForSelectorPods)]
    assert [w.key for w in waits] == [DEPLOY + "client", "example.com/gpu-app"]


def test_an_unset_client_label_is_not_waited_for() -> None:
    result = plan.make_plan(node(), LOADED, RENDERED)
    assert not [s for s in result.steps if isinstance(s, plan.WaitForSelectorPods)]


def test_the_dra_kubelet_plugin_is_paused_after_the_gpu_pods_are_gone() -> None:
    labels = {**LABELS, plan.DRA_DRIVER_LABEL: "true"}
    result = plan.make_plan(node(labels), LOADED, RENDERED)
    steps = list(result.steps)
    first_pause = only(result.steps[:1], plan.PauseOperands)
    assert plan.DRA_DRIVER_LABEL not in first_pause.patch
    evict = kinds(result.steps).index("EvictGpuPods")
    assert steps[evict + 1] == plan.PauseOperands({plan.DRA_DRIVER_LABEL: P})
    assert steps[evict + 2] == plan.WaitForPods((plan.DRA_PLUGIN_APP,), 300.0)
    # Restored with the others.
    assert only(result.steps, plan.RestoreLabels).paused[plan.DRA_DRIVER_LABEL] == P


def test_dra_with_auto_drain_evicts_even_with_gpu_pod_eviction_off() -> None:
    labels = {**LABELS, plan.DRA_DRIVER_LABEL: "true"}
    settings = Settings(node_name="n", enable_gpu_pod_eviction=False, enable_auto_drain=True)
    assert "EvictGpuPods" in kinds(plan.make_plan(node(labels), LOADED, settings).steps)


@pytest.mark.parametrize(
    ("facts", "settings", "annotated"),
    [
        (LOADED, RENDERED, False),
        (plan.HostFacts(), RENDERED, False),
        (plan.HostFacts(loaded_modules=LOADED.loaded_modules, stored_digest="d2"), RENDERED, False),
        (LOADED, RENDERED, True),
        (LOADED, Settings(node_name="n", enable_gpu_pod_eviction=False, enable_auto_drain=False),
         False),
    ],
)  # fmt: skip
def test_every_failure_path_restores_the_labels_it_paused(
    facts: plan.HostFacts, settings: Settings, annotated: bool
) -> None:
    facts_node = upgrade_node() if annotated else node()
    result = plan.make_plan(facts_node, facts, settings)
    restore = only(result.on_failure, plan.RestoreLabels)
    pause = [s for s in result.steps if isinstance(s, plan.PauseOperands)]
    paused_now = {**LABELS, **{k: v for s in pause for k, v in s.patch.items()}}
    assert {**paused_now, **plan.restore_patch(restore.paused, paused_now).patch} == LABELS
    # The success path ends with the same restore.
    assert only(result.steps, plan.RestoreLabels) == restore


def test_every_step_has_a_title() -> None:
    facts = plan.HostFacts(loaded_modules=frozenset({"nvidia", "nvidia_vgpu_vfio", "nouveau"}),
                           mellanox_present=True)  # fmt: skip
    labels = {**LABELS, DEPLOY + "client": "true", plan.DRA_DRIVER_LABEL: "true"}
    settings = Settings(node_name="n", gpu_direct_rdma_enabled=True)
    steps = [
        *plan.make_plan(node(labels), facts, settings).steps,
        *plan.make_plan(node(), plan.HostFacts(host_driver_version="1"), settings).steps,
        plan.KeepDriver("d"),
        plan.CleanupDriverRoot(),
    ]
    titles = [plan.title(s) for s in steps]
    assert all(titles)
    assert {type(s) for s in steps} == set(typing.get_args(plan.Step))


# ----- GPU pods ---------------------------------------------------------------------------


def pod(name: str, *, resources: dict[str, Any] | None = None, owner: str | None = "ReplicaSet",
        **extra: Any) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    meta.update(extra.pop("metadata", {}))
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources or {}}]}
    spec.update(extra.pop("spec", {}))
    return {"metadata": meta, "spec": spec, "status": extra.pop("status", {"phase": "Running"})}


GPU = {"limits": {"nvidia.com/gpu": "1"}}


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"nvidia.com/gpu": "1"}},
        {"requests": {"nvidia.com/gpu.shared": "1"}},
        {"limits": {"nvidia.com/mig-1g.5gb": "1"}},
    ],
)
def test_gpu_pods_are_those_requesting_or_limiting_nvidia_gpu_resources(
    resources: dict[str, Any],
) -> None:
    pods = [pod("gpu", resources=resources), pod("cpu", resources={"limits": {"cpu": "1"}})]
    selection = plan.select_gpu_pods(pods, force=False, delete_emptydir=False)
    assert [str(r) for r in selection.evict] == ["default/gpu"]


def test_vgpu_and_passthrough_resources_are_not_gpu_pods() -> None:
    pods = [pod("vm", resources={"limits": {"nvidia.com/GRID_T4-4Q": "1"}})]
    assert plan.select_gpu_pods(pods, force=False, delete_emptydir=False) == plan.Selection()


def test_gpu_pods_that_cannot_be_evicted_say_why() -> None:
    pods = [
        pod("ds", resources=GPU, owner="DaemonSet"),
        pod("static", resources=GPU, owner=None,
            metadata={"annotations": {plan.MIRROR_ANNOTATION: "x"}}),
        pod("scratch", resources=GPU, spec={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        pod("bare", resources=GPU, owner=None),
    ]  # fmt: skip
    selection = plan.select_gpu_pods(pods, force=False, delete_emptydir=False)
    assert selection.evict == ()
    reasons = {ref.name: why for ref, why in selection.blocked}
    assert f"add {plan.CLIENT_LABEL}=true" in reasons["ds"]
    assert "static pod" in reasons["static"]
    assert "DRAIN_DELETE_EMPTYDIR_DATA=true" in reasons["scratch"]
    assert "DRAIN_USE_FORCE=true" in reasons["bare"]


def test_force_and_emptydir_settings_allow_those_gpu_pods() -> None:
    pods = [
        pod("scratch", resources=GPU, spec={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        pod("bare", resources=GPU, owner=None),
    ]
    selection = plan.select_gpu_pods(pods, force=True, delete_emptydir=True)
    assert [r.name for r in selection.evict] == ["scratch", "bare"]
    assert selection.blocked == ()


def test_finished_gpu_pods_are_deleted_whatever_their_owner() -> None:
    done = pod("job", resources=GPU, owner=None, status={"phase": "Succeeded"})
    selection = plan.select_gpu_pods([done], force=False, delete_emptydir=False)
    assert [r.name for r in selection.evict] == ["job"]


def test_terminating_gpu_pods_are_only_waited_for() -> None:
    going = pod("going", resources=GPU, metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"})
    selection = plan.select_gpu_pods([going], force=False, delete_emptydir=False)
    assert [r.name for r in selection.leaving] == ["going"]
    assert selection.evict == ()
    assert [r.name for r in selection.pods] == ["going"]


def test_a_drain_leaves_daemonset_and_static_pods_and_honours_the_selector() -> None:
    pods = [
        pod("ds", owner="DaemonSet"),
        pod("static", owner=None, metadata={"annotations": {plan.MIRROR_ANNOTATION: "x"}}),
        pod("web", metadata={"labels": {"tier": "web"}}),
        pod("db", metadata={"labels": {"tier": "db"}}),
    ]
    everything = plan.select_drain_pods(pods, selector="", force=False, delete_emptydir=False)
    assert [r.name for r in everything.evict] == ["web", "db"]
    assert [r.name for r, _ in everything.ignored] == ["ds", "static"]
    web = plan.select_drain_pods(pods, selector="tier=web", force=False, delete_emptydir=False)
    assert [r.name for r in web.evict] == ["web"]


def test_a_drain_refuses_pods_without_a_controller_unless_forced() -> None:
    pods = [pod("bare", owner=None)]
    assert plan.select_drain_pods(pods, selector="", force=False, delete_emptydir=False).blocked
    forced = plan.select_drain_pods(pods, selector="", force=True, delete_emptydir=False)
    assert [r.name for r in forced.evict] == ["bare"]
