"""The validator DaemonSet: init order, per-step env, plugin step removal (reference §6)."""

from __future__ import annotations

from typing import Any

from operand_helpers import ctr, env_of, make_facts, make_policy, names, render_ds

from gpu_operator.operands import operator_validation

VALIDATOR = {
    "repository": "nvcr.io/nvidia",
    "image": "gpu-operator",
    "version": "v26.7.0",
    "imagePullSecrets": ["regcred"],
}
IMAGE = "nvcr.io/nvidia/gpu-operator:v26.7.0"


def render(**sections: Any) -> dict[str, Any]:
    sections.setdefault("validator", VALIDATOR)
    return render_ds(operator_validation, make_policy(**sections))


def test_init_order_and_components() -> None:
    ds = render(mig={"strategy": "mixed"})
    assert names(ds, "initContainers") == [
        "driver-validation",
        "toolkit-validation",
        "cuda-validation",
        "plugin-validation",
    ]
    expected = {"driver": "true", "toolkit": "false", "cuda": "false", "plugin": "false"}
    for component, wait in expected.items():
        env = env_of(ctr(ds, f"{component}-validation"))
        assert (env["COMPONENT"], env["WITH_WAIT"]) == (component, wait)
    plugin = env_of(ctr(ds, "plugin-validation"))
    assert (plugin["MIG_STRATEGY"], plugin["WITH_WORKLOAD"]) == ("mixed", "false")
    for step in ("cuda-validation", "plugin-validation"):
        env = env_of(ctr(ds, step))
        assert env["VALIDATOR_IMAGE"] == IMAGE
        assert env["VALIDATOR_IMAGE_PULL_SECRETS"] == "regcred"
        assert env["VALIDATOR_RUNTIME_CLASS"] == "nvidia"
        assert env["VALIDATOR_IMAGE_PULL_POLICY"] == "IfNotPresent"
    for container in [
        *ds["spec"]["template"]["spec"]["initContainers"],
        *ds["spec"]["template"]["spec"]["containers"],
    ]:
        assert container["image"] == IMAGE
    assert names(ds) == ["nvidia-operator-validator"]
    assert "sleep" in ctr(ds, "nvidia-operator-validator")["args"][0]


def test_plugin_step_removed_without_device_plugin() -> None:
    ds = render(devicePlugin={"enabled": False})
    assert "plugin-validation" not in names(ds, "initContainers")


def test_user_env_per_step() -> None:
    validator = {
        **VALIDATOR,
        "cuda": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]},
        "plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]},
        "driver": {"env": [{"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]},
    }
    ds = render(validator=validator)
    assert env_of(ctr(ds, "cuda-validation"))["WITH_WORKLOAD"] == "false"
    assert env_of(ctr(ds, "plugin-validation"))["WITH_WORKLOAD"] == "true"
    assert env_of(ctr(ds, "driver-validation"))["DISABLE_DEV_CHAR_SYMLINK_CREATION"] == "true"


def test_no_mig_strategy_means_none_and_no_runtime_class_with_nri() -> None:
    ds = render_ds(
        operator_validation,
        make_policy(validator=VALIDATOR, cdi={"nriPluginEnabled": True}),
        make_facts(),
    )
    plugin = env_of(ctr(ds, "plugin-validation"))
    assert plugin["MIG_STRATEGY"] == "none"
    assert "VALIDATOR_RUNTIME_CLASS" not in plugin
