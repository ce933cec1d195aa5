"""The adoption planner, state in and plan out: objects NVIDIA's operator created, compared with
what ours renders for the same ClusterPolicy."""

from __future__ import annotations

import copy
from typing import Any

from operand_helpers import find, make_facts, make_policy

from gpu_operator.api import keys
from gpu_operator.operands import adoption, registry

POLICY = {"metadata": {"name": "cluster-policy", "uid": "cp-uid"}}
OWNER = adoption.owner_reference(POLICY)
Obj = dict[str, Any]


def rendered() -> list[Obj]:
    """What ours writes for a default policy on an Ubuntu GPU cluster: owner references and our
    hash annotation set."""
    policy = make_policy(
        driver={"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"}
    )
    facts = make_facts(gpu_node_count=2, has_nfd=True, os_id="ubuntu", os_version_id="22.04")
    objects = []
    for state in registry.render_all(policy, facts):
        assert state.error is None, state.error
        for obj in state.objects if state.enabled else []:
            meta = obj.setdefault("metadata", {})
            meta["ownerReferences"] = [OWNER]
            # As the writer stamps it (kube.writer.with_hash).
            meta.setdefault("annotations", {})[keys.LAST_APPLIED_HASH] = "ours"
            objects.append(obj)
    return objects


def as_upstream(obj: Obj) -> Obj:
    """The object as NVIDIA's operator leaves it: its own hash value, no state label of ours,
    and fields the API server defaults (which ours does not render)."""
    live = copy.deepcopy(obj)
    meta = live["metadata"]
    meta["uid"] = f"uid-{meta['name']}"
    meta.setdefault("annotations", {})[keys.LAST_APPLIED_HASH] = "2766103395"
    (meta.get("labels") or {}).pop(keys.OPERATOR_STATE_LABEL, None)
    if obj["kind"] == "DaemonSet":
        spec = live["spec"]["template"]["spec"]
        spec["dnsPolicy"] = "ClusterFirst"
        for container in spec["containers"]:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
    return live


def driver(objects: list[Obj]) -> Obj:
    return find(objects, "DaemonSet", "nvidia-driver-daemonset")


def test_objects_equal_in_substance_are_adopted_as_is() -> None:
    desired = rendered()
    result = adoption.plan(desired, [as_upstream(o) for o in desired], policy_uid="cp-uid")
    assert {o.verdict for o in result.objects} == {"adopt"}
    assert not result.rolling
    assert result.exit_code == adoption.EXIT_OK
    [plan] = [o for o in result.objects if o.name == "nvidia-driver-daemonset"]
    assert set(plan.changes) == {f"metadata.annotations[{keys.LAST_APPLIED_HASH}]",
                                 f"metadata.labels[{keys.OPERATOR_STATE_LABEL}]"}  # fmt: skip
    assert "bookkeeping" in plan.reason


def test_a_changed_env_var_patches_the_driver_template_without_a_restart_by_the_daemonset() -> None:
    desired = rendered()
    live = as_upstream(driver(desired))
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container.get("env") or [] if e["name"] != "NODE_IP"]
    plan = adoption.plan_object(driver(desired), live)
    assert plan.verdict == "patch"
    assert plan.changes == (f"spec.template.spec.containers[{container['name']}].env[NODE_IP]",)
    assert plan.rolls
    assert plan.pods_kept
    assert "OnDelete" in plan.reason


def test_a_rolling_update_operand_with_a_new_image_rolls_once() -> None:
    desired = rendered()
    plugin = find(desired, "DaemonSet", "nvidia-device-plugin-daemonset")
    live = as_upstream(plugin)
    live["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "nvcr.io/nvidia/k8s-device-plugin:old"
    )
    plan = adoption.plan_object(plugin, live)
    assert plan.verdict == "patch"
    assert plan.rolls
    assert not plan.pods_kept
    assert plan.reason == "pod template changes: pods roll once"


def test_a_change_outside_the_pod_template_does_not_roll() -> None:
    desired = rendered()
    plugin = find(desired, "DaemonSet", "nvidia-device-plugin-daemonset")
    live = as_upstream(plugin)
    live["spec"]["updateStrategy"] = {"type": "OnDelete"}
    plan = adoption.plan_object(plugin, live)
    assert plan.verdict == "patch"
    assert not plan.rolls
    assert plan.changes == ("spec.updateStrategy.type",)


def test_a_different_selector_must_be_replaced_and_says_whether_pods_are_kept() -> None:
    desired = rendered()
    validator = find(desired, "DaemonSet", "nvidia-operator-validator")
    live = as_upstream(validator)
    live["spec"]["selector"] = {"matchLabels": {"app": "nvidia-operator-validator"}}
    plan = adoption.plan_object(validator, live)
    assert plan.verdict == "replace"
    assert plan.pods_kept
    assert not plan.rolls
    assert "immutable" in plan.reason
    assert "pods are kept" in plan.reason
    live["spec"]["template"]["metadata"]["labels"].pop("app.kubernetes.io/part-of")
    plan = adoption.plan_object(validator, live)
    assert not plan.pods_kept
    assert "pods are replaced" in plan.reason


def test_an_object_controlled_by_someone_else_is_blocked() -> None:
    desired = rendered()
    live = as_upstream(driver(desired))
    live["metadata"]["ownerReferences"] = [{**OWNER, "name": "old-policy", "uid": "other"}]
    plan = adoption.plan_object(driver(desired), live)
    assert plan.verdict == "blocked"
    assert "ClusterPolicy/old-policy (uid other)" in plan.reason


def test_missing_objects_are_created_and_unrendered_owned_ones_deleted() -> None:
    desired = rendered()
    live = [as_upstream(o) for o in desired if o["metadata"]["name"] != "nvidia-driver-daemonset"]
    extra = as_upstream(driver(desired))
    extra["metadata"]["name"] = "nvidia-driver-daemonset-old"
    stranger = {**as_upstream(driver(desired)), "metadata": {"name": "someone-elses"}}
    live += [extra, stranger]
    result = adoption.plan(desired, live, policy_uid="cp-uid")
    verdicts = {o.name: o.verdict for o in result.objects}
    assert verdicts["nvidia-driver-daemonset"] == "create"
    assert verdicts["nvidia-driver-daemonset-old"] == "delete"
    assert "someone-elses" not in verdicts  # not controlled by the policy: not ours
    assert result.exit_code == adoption.EXIT_REPLACE


def test_blocked_wins_the_exit_code() -> None:
    plans = (
        adoption.ObjectPlan("DaemonSet", "a", "ns", "replace"),
        adoption.ObjectPlan("ConfigMap", "b", "ns", "blocked"),
    )
    assert adoption.AdoptionPlan(plans).exit_code == adoption.EXIT_BLOCKED


def test_keyed_lists_compare_by_key_and_atomic_lists_as_a_whole() -> None:
    desired = {"spec": {"containers": [{"name": "a", "args": ["x"]}]}}
    live = {"spec": {"containers": [{"name": "b"}, {"name": "a", "args": ["x"], "tty": True}]}}
    assert adoption.differences(desired, live) == []
    live["spec"]["containers"][1]["args"] = ["x", "y"]
    assert adoption.differences(desired, live) == ["spec.containers[a].args"]
    assert adoption.differences({"spec": {"containers": [{"name": "c"}]}}, live) == [
        "spec.containers[c]"
    ]


# ----- with the API server's answer to a dry run of each write ----------------------------------


def pod_of(ds: Obj, name: str) -> Obj:
    owner = {"kind": "DaemonSet", "name": ds["metadata"]["name"], "uid": ds["metadata"]["uid"]}
    return {"metadata": {"name": name, "ownerReferences": [owner]}}


def test_a_write_the_api_server_refuses_is_blocked_with_its_reason() -> None:
    desired = rendered()
    plugin = find(desired, "DaemonSet", "nvidia-device-plugin-daemonset")
    message = (
        'DaemonSet.apps "nvidia-device-plugin-daemonset" is invalid: spec.template.spec.'
        'containers[0].env[3].valueFrom: Invalid value: "": may not be specified when `value` '
        "is not empty"
    )
    key = ("DaemonSet", plugin["metadata"]["namespace"], plugin["metadata"]["name"])
    live = [as_upstream(o) for o in desired]
    result = adoption.plan(
        desired, live, policy_uid="cp-uid", trials={key: adoption.Trial(rejected=message)}
    )
    [plan] = [o for o in result.objects if o.name == "nvidia-device-plugin-daemonset"]
    assert plan.verdict == "blocked"
    assert message in plan.reason
    assert result.exit_code == adoption.EXIT_BLOCKED
    created = adoption.plan_object(plugin, None, adoption.Trial(rejected=message))
    assert created.verdict == "blocked"


def test_the_servers_result_says_which_pods_restart() -> None:
    desired = rendered()
    plugin = find(desired, "DaemonSet", "nvidia-device-plugin-daemonset")
    live = as_upstream(plugin)
    result = copy.deepcopy(live)
    container = result["spec"]["template"]["spec"]["containers"][0]
    container.setdefault("env", []).append({"name": "ADDED", "value": "1"})
    pods = [pod_of(live, "plugin-b"), pod_of(live, "plugin-a"), {"metadata": {"name": "other"}}]
    plan = adoption.plan_object(plugin, live, adoption.Trial(result=result), pods)
    assert plan.verdict == "patch"
    assert plan.rolls
    assert plan.restarts == ("plugin-a", "plugin-b")
    assert plan.changes == (f"spec.template.spec.containers[{container['name']}].env[ADDED]",)
    # What the server would store equals what runs: adopted, whatever the model thinks.
    same = adoption.plan_object(plugin, live, adoption.Trial(result=copy.deepcopy(live)), pods)
    assert same.verdict == "adopt"
    assert same.restarts == ()


def test_a_driver_template_change_restarts_drivers_only_with_auto_upgrade() -> None:
    desired = rendered()
    live = as_upstream(driver(desired))
    result = copy.deepcopy(live)
    result["spec"]["template"]["metadata"]["labels"]["new"] = "label"
    pods = [pod_of(live, "nvidia-driver-daemonset-x")]
    trial = adoption.Trial(result=result)
    on = adoption.plan_object(driver(desired), live, trial, pods, auto_upgrade=True)
    off = adoption.plan_object(driver(desired), live, trial, pods, auto_upgrade=False)
    assert on.restarts == ("nvidia-driver-daemonset-x",)
    assert "upgrade flow" in on.reason
    assert off.restarts == ()
    assert off.rolls
    assert off.pods_kept
    assert "kept" in off.reason
    plan = adoption.AdoptionPlan((on, off))
    assert plan.restarts == ("nvidia-driver-daemonset-x",)
