"""MIG manager: the default mig-parted config from the GPU catalog, and ConfigMap env rules."""

from __future__ import annotations

from typing import Any

import yaml
from operand_helpers import ctr, env_of, find, make_facts, make_policy, volumes_of

from gpu_operator.nvml import catalog
from gpu_operator.operands import mig_manager


def render(**manager: Any) -> list[dict[str, Any]]:
    return mig_manager.render(make_policy(migManager=manager), make_facts())


def default_config() -> dict[str, Any]:
    data = find(render(), "ConfigMap", "default-mig-parted-config")["data"]["config.yaml"]
    parsed: dict[str, Any] = yaml.safe_load(data)
    return parsed


def test_default_config_is_valid_mig_parted_yaml() -> None:
    config = default_config()
    assert config["version"] == "v1"
    configs = config["mig-configs"]
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert configs["all-enabled"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]
    for name, specs in configs.items():
        for spec in specs:
            assert spec["devices"] == "all", name
            if spec["mig-enabled"]:
                assert isinstance(spec["mig-devices"], dict), name
            for device_id in spec.get("device-filter", []):
                assert isinstance(device_id, str)
                assert device_id.startswith("0x")


def test_every_catalog_profile_has_an_all_config_at_max_count() -> None:
    configs = default_config()["mig-configs"]
    for model in catalog.mig_capable_models():
        for profile in model.mig_profiles:
            specs = configs[f"all-{profile.resource_name}"]
            matching = [s for s in specs if model.pci_device_id_hex in s["device-filter"]]
            assert matching == [
                {
                    "device-filter": matching[0]["device-filter"],
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {profile.name: profile.instance_count},
                }
            ]


def test_reference_profiles() -> None:
    configs = default_config()["mig-configs"]
    assert {
        "device-filter": ["0x20B010DE"],
        "devices": "all",
        "mig-enabled": True,
        "mig-devices": {"1g.5gb": 7},
    } in configs["all-1g.5gb"]
    # Models with identical layouts share one spec (A100-80GB and H100 both have 3g.40gb x2).
    (shared,) = configs["all-3g.40gb"]
    assert set(shared["device-filter"]) == {"0x20B210DE", "0x233010DE"}
    assert shared["mig-devices"] == {"3g.40gb": 2}
    assert "all-1g.5gb.me" in configs


def test_all_balanced_per_reference() -> None:
    balanced = default_config()["mig-configs"]["all-balanced"]
    by_id = {i: s["mig-devices"] for s in balanced for i in s["device-filter"]}
    assert by_id["0x20B010DE"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert by_id["0x20B710DE"] == {"1g.6gb": 2, "2g.12gb": 1}
    assert by_id["0x233510DE"] == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert set(by_id) == {m.pci_device_id_hex for m in catalog.mig_capable_models()}


def test_default_config_env_and_volume() -> None:
    ds = find(render(), "DaemonSet")
    env = env_of(ctr(ds, "nvidia-mig-manager"))
    assert env["DEFAULT_CONFIG_FILE"] == "/mig-parted-config/config-default.yaml"
    assert "CONFIG_FILE" not in env
    assert volumes_of(ds)["mig-parted-config"]["configMap"] == {
        "name": "default-mig-parted-config",
        "items": [{"key": "config.yaml", "path": "config-default.yaml"}],
    }
    assert env["GPU_CLIENTS_FILE"] == "/gpu-clients/clients.yaml"
    assert env["CDI_ENABLED"] == "true"


def test_custom_config_maps_replace_the_defaults() -> None:
    objects = render(config={"name": "my-mig"}, gpuClientsConfig={"name": "my-clients"})
    assert [o for o in objects if o["kind"] == "ConfigMap"] == []
    ds = find(objects, "DaemonSet")
    assert env_of(ctr(ds, "nvidia-mig-manager"))["CONFIG_FILE"] == "/mig-parted-config/config.yaml"
    assert "DEFAULT_CONFIG_FILE" not in env_of(ctr(ds, "nvidia-mig-manager"))
    assert volumes_of(ds)["mig-parted-config"]["configMap"] == {"name": "my-mig"}
    assert volumes_of(ds)["gpu-clients"]["configMap"] == {"name": "my-clients"}


def test_naming_the_default_config_map_keeps_it() -> None:
    objects = render(config={"name": "default-mig-parted-config"})
    find(objects, "ConfigMap", "default-mig-parted-config")


def test_gpu_clients_default() -> None:
    data = find(render(), "ConfigMap", "default-gpu-clients")["data"]["clients.yaml"]
    parsed = yaml.safe_load(data)
    assert parsed["version"] == "v1"
    assert "nvidia-dcgm.service" in parsed["systemd-services"]


def test_user_env_wins() -> None:
    ds = find(render(env=[{"name": "WITH_REBOOT", "value": "true"}]), "DaemonSet")
    assert env_of(ctr(ds, "nvidia-mig-manager"))["WITH_REBOOT"] == "true"
