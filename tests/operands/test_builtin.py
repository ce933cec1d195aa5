"""Operands running our image (operands/builtin.py) and the runtime-config guard next to NVIDIA's
toolkit (operands/container_toolkit.py): what the pod templates gain, and when."""

from __future__ import annotations

from typing import Any

from operand_helpers import FULL_ENV, ctr, env_of, find, make_facts, make_policy, names

from gpu_operator.operands import (
    container_toolkit,
    dcgm_exporter,
    device_plugin,
    gpu_feature_discovery,
    mig_manager,
    operator_validation,
)

OURS = "ghcr.io/gpu-operator-py/gpu-operator"
ENV = {**FULL_ENV, "OPERATOR_IMAGE": f"{OURS}:0.1.0"}
SECTION = {"repository": "ghcr.io/gpu-operator-py", "image": "gpu-operator", "version": "0.2.0"}
Obj = dict[str, Any]


def rendered(module: Any, ds_name: str, facts_env: dict[str, str] = ENV, **sections: Any) -> Obj:
    policy = make_policy(**sections)
    objects = module.render(policy, make_facts(operator_env=facts_env))
    found: Obj = find(objects, "DaemonSet", ds_name)
    return found


def test_our_agents_run_as_root_keeping_the_templates_privileges() -> None:
    ds = rendered(device_plugin, "nvidia-device-plugin-daemonset", devicePlugin=SECTION)
    plugin = ctr(ds, "nvidia-device-plugin")
    assert plugin["image"] == f"{OURS}:0.2.0"  # another tag of our image counts as ours
    assert plugin["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsGroup": 0}
    assert plugin["command"] == ["/bin/sh", "-c"]  # NVIDIA's template, unchanged


def test_the_config_manager_is_root_without_capabilities() -> None:
    ds = rendered(
        device_plugin,
        "nvidia-device-plugin-daemonset",
        devicePlugin={**SECTION, "config": {"name": "plugin-config", "default": "any"}},
    )
    for name in ("config-manager", "config-manager-init"):
        assert ctr(ds, name)["securityContext"] == {
            "runAsUser": 0,
            "runAsGroup": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_nvml_readers_get_the_nvidia_runtimes_variables_and_the_exporter_a_command() -> None:
    exporter = ctr(
        rendered(dcgm_exporter, "nvidia-dcgm-exporter", dcgmExporter=SECTION),
        "nvidia-dcgm-exporter",
    )
    assert exporter["command"] == ["dcgm-exporter"]
    gfd = ctr(rendered(gpu_feature_discovery, "gpu-feature-discovery", gfd=SECTION),
              "gpu-feature-discovery")  # fmt: skip
    mig = ctr(rendered(mig_manager, "nvidia-mig-manager", migManager=SECTION),
              "nvidia-mig-manager")  # fmt: skip
    for container in (exporter, gfd, mig):
        env = env_of(container)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_a_users_own_value_of_those_variables_is_kept() -> None:
    section = {**SECTION, "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}
    gfd = ctr(rendered(gpu_feature_discovery, "gpu-feature-discovery", gfd=section),
              "gpu-feature-discovery")  # fmt: skip
    assert env_of(gfd)["NVIDIA_DRIVER_CAPABILITIES"] == "all"


def test_the_validator_of_our_image_gets_root_in_every_container() -> None:
    ds = rendered(operator_validation, "nvidia-operator-validator", validator=SECTION)
    for name in (*names(ds, "initContainers"), *names(ds)):
        assert ctr(ds, name)["securityContext"]["runAsUser"] == 0, name
        assert ctr(ds, name)["securityContext"]["runAsGroup"] == 0, name


def test_nvidias_images_and_an_unknown_operator_image_leave_nvidias_template() -> None:
    nvidia = rendered(device_plugin, "nvidia-device-plugin-daemonset")
    assert ctr(nvidia, "nvidia-device-plugin")["securityContext"] == {"privileged": True}
    unknown = rendered(
        device_plugin, "nvidia-device-plugin-daemonset", facts_env=FULL_ENV, devicePlugin=SECTION
    )
    assert ctr(unknown, "nvidia-device-plugin")["securityContext"] == {"privileged": True}


# --- the runtime-config guard --------------------------------------------------------------


GUARDED = {**ENV, "RUNTIME_CONFIG_GUARD": "true"}


def toolkit(facts_env: dict[str, str] = GUARDED, version: str = "1.35.0", **sections: Any) -> Obj:
    policy = make_policy(**sections)
    objects = container_toolkit.render(
        policy, make_facts(operator_env=facts_env, kubernetes_version=version)
    )
    found: Obj = find(objects, "DaemonSet", "nvidia-container-toolkit-daemonset")
    return found


def test_the_guard_saves_before_nvidias_toolkit_and_restores_as_a_native_sidecar() -> None:
    ds = toolkit()
    assert names(ds, "initContainers") == [
        "driver-validation",
        container_toolkit.GUARD_SAVE,
        container_toolkit.GUARD,
    ]
    save, guard = ctr(ds, container_toolkit.GUARD_SAVE), ctr(ds, container_toolkit.GUARD)
    main = ctr(ds, "nvidia-container-toolkit-ctr")
    assert save["command"] == ["gpu-operator", "agent", "runtime-config-guard", "save"]
    assert guard["command"] == ["gpu-operator", "agent", "runtime-config-guard", "watch"]
    assert guard["restartPolicy"] == "Always"
    assert "restartPolicy" not in save
    for container in (save, guard):
        assert container["image"] == ENV["OPERATOR_IMAGE"]
        env = env_of(container)
        # The toolkit's runtime settings, so both read the same files the toolkit writes.
        for name in ("RUNTIME", "RUNTIME_CONFIG", "RUNTIME_DROP_IN_CONFIG", "RUNTIME_SOCKET"):
            assert env[name] == env_of(main)[name], name
        assert env["RUNTIME_CONFIG_BACKUP_DIR"] == "/usr/local/nvidia/runtime-config-guard"
        mounts = {m["name"] for m in container["volumeMounts"]}
        assert {"containerd-config", "containerd-drop-in-config", "toolkit-install-dir"} <= mounts
        assert "nvidia-container-toolkit-entrypoint" not in mounts
        assert container["securityContext"] == {
            "seLinuxOptions": {"level": "s0"},
            "runAsUser": 0,
            "runAsGroup": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_CHROOT"]},
        }


def test_no_guard_when_off_with_our_toolkit_with_nri_or_before_native_sidecars() -> None:
    def has_guard(ds: Obj) -> bool:
        return container_toolkit.GUARD in names(ds, "initContainers")

    assert has_guard(toolkit())
    assert not has_guard(toolkit({**GUARDED, "RUNTIME_CONFIG_GUARD": "false"}))
    assert not has_guard(toolkit(ENV))  # not asked for (NVIDIA's operator env, a swap-in)
    assert not has_guard(toolkit(toolkit=SECTION))  # our toolkit restores by itself
    assert not has_guard(toolkit(version="1.28.4"))
    assert not has_guard(
        toolkit(cdi={"enabled": True, "nriPluginEnabled": True})
    )  # NRI: the runtime config is not edited


def test_offline_render_knows_the_charts_operator_image_and_guard() -> None:
    from gpu_operator.cli import render

    facts = render.cluster_facts(render.parse_facts({}))
    assert facts.operator_env["OPERATOR_IMAGE"].startswith(f"{OURS}:")
    policy = make_policy(devicePlugin=SECTION)
    ds = find(device_plugin.render(policy, facts), "DaemonSet", "nvidia-device-plugin-daemonset")
    assert ctr(ds, "nvidia-device-plugin")["securityContext"]["runAsUser"] == 0
    toolkit_ds = find(
        container_toolkit.render(make_policy(), facts),
        "DaemonSet",
        "nvidia-container-toolkit-daemonset",
    )
    assert container_toolkit.GUARD in names(toolkit_ds, "initContainers")
