"""MIG manager: the default ConfigMaps, their env and volume rules, and the entrypoint script.

The default config's contents are checked against upstream's facts in test_mig_configs.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from operand_helpers import ctr, env_of, find, make_facts, make_policy, volumes_of
from waiting import DEADLINE

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
            filters = spec.get("device-filter", [])
            for device_id in [filters] if isinstance(filters, str) else filters:
                assert isinstance(device_id, str)
                assert device_id.startswith("0x")


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
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"]
    assert names == ["nvidia-mig-manager-entrypoint"]  # the start script is not configurable
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


def test_the_manager_starts_through_upstreams_entrypoint_config_map() -> None:
    objects = render()
    script = find(objects, "ConfigMap", "nvidia-mig-manager-entrypoint")["data"]["entrypoint.sh"]
    ds = find(objects, "DaemonSet")
    main = ctr(ds, "nvidia-mig-manager")
    assert main["command"] == ["/bin/sh", "-c"]
    assert main["args"] == ["/bin/entrypoint.sh"]
    assert {
        "name": "nvidia-mig-manager-entrypoint",
        "mountPath": "/bin/entrypoint.sh",
        "readOnly": True,
        "subPath": "entrypoint.sh",
    } in main["volumeMounts"]
    assert volumes_of(ds)["nvidia-mig-manager-entrypoint"]["configMap"] == {
        "name": "nvidia-mig-manager-entrypoint",
        "defaultMode": 448,
    }
    assert "/run/nvidia/validations/driver-ready" in script
    assert script.rstrip().endswith("exec nvidia-mig-manager")


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n", "true"),
        ('IS_HOST_DRIVER="false"\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n', "false"),
        ("NVIDIA_DRIVER_ROOT=/run/nvidia/driver\n", "false"),
    ],
)
def test_entrypoint_stops_host_gpu_services_only_with_a_host_driver(
    tmp_path: Path, marker: str, expected: str
) -> None:
    ready = tmp_path / "driver-ready"
    ready.write_text(marker)
    # The script as shipped, with the marker path and the manager swapped for test doubles.
    script = mig_manager.ENTRYPOINT.replace(
        "/run/nvidia/validations/driver-ready", str(ready)
    ).replace("exec nvidia-mig-manager", "exec env")
    run = subprocess.run(
        ["/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={"PATH": os.environ["PATH"], "NVIDIA_DRIVER_ROOT": "/driver-root"},
        check=True,
    )
    env = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert env["WITH_SHUTDOWN_HOST_GPU_CLIENTS"] == expected
    assert env["NVIDIA_DRIVER_ROOT"] == "/driver-root"  # the container's own env is kept
