"""`gpu-operator validate` on mig-parted configs: the operator's default ConfigMap passes, a
filtered entry the named GPU cannot hold fails naming config, GPU and profile, a profile no GPU
offers fails, and configs no catalogued GPU can apply only warn (they may be for GPUs we do not
know)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from gpu_operator.agents.mig_manager import check
from gpu_operator.cli import app
from gpu_operator.operands import mig_manager

runner = CliRunner()

B300_ON_H100 = """
version: v1
mig-configs:
  b300-balanced:
    - device-filter: ["0x318210DE", "0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}
"""


def validate(tmp_path: Path, text: str) -> tuple[int, str, str]:
    path = tmp_path / "mig.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["validate", "-f", str(path)])
    return result.exit_code, result.stdout, result.stderr


def test_the_default_config_map_is_valid(tmp_path: Path) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "default-mig-parted-config"},
        "data": {"config.yaml": mig_manager.default_mig_config_yaml()},
    }
    code, out, err = validate(tmp_path, yaml.safe_dump(config_map))
    assert (code, out) == (0, "")
    assert "ConfigMap/default-mig-parted-config: data.config.yaml: valid MIG config" in err
    assert "warning" not in err


def test_an_entry_the_filtered_gpu_cannot_hold_is_an_error(tmp_path: Path) -> None:
    code, out, _ = validate(tmp_path, B300_ON_H100)
    assert code == 1
    (line,) = out.splitlines()
    assert line.startswith(
        f"{tmp_path / 'mig.yaml'}: mig-configs.b300-balanced[0]: GPU 0 (H100-SXM5-80GB): "
        "H100-SXM5-80GB has no MIG profile '1g.34gb'"
    )
    assert line.endswith("(device-filter 0x233010DE)")


def test_a_config_no_catalogued_gpu_can_apply_is_a_warning(tmp_path: Path) -> None:
    # Known profiles in a combination no catalogued GPU holds: maybe a GPU we do not know.
    text = "version: v1\nmig-configs:\n  odd:\n    - {devices: all, mig-enabled: true, "
    text += 'mig-devices: {"7g.80gb": 2}}\n'
    code, out, err = validate(tmp_path, text)
    assert (code, out) == (0, "")
    assert "warning: " in err
    assert "mig-configs.odd: no GPU in the catalog can apply it" in err


def test_a_profile_no_catalogued_gpu_offers_is_an_error(tmp_path: Path) -> None:
    text = "version: v1\nmig-configs:\n  odd:\n    - {devices: all, mig-enabled: true, "
    text += 'mig-devices: {"1g.99gb": 1, "1g.10gb": 1}}\n'
    code, out, _ = validate(tmp_path, text)
    assert code == 1
    assert out.splitlines() == [
        f"{tmp_path / 'mig.yaml'}: mig-configs.odd[0].mig-devices.1g.99gb: unknown MIG profile "
        "'1g.99gb': no GPU in the catalog offers it"
    ]


def test_format_errors_and_absurd_counts_are_reported_not_hung_on(tmp_path: Path) -> None:
    code, out, _ = validate(tmp_path, "version: v2\nmig-configs: {}\n")
    assert code == 1
    assert "version: unknown version 'v2'" in out
    huge = B300_ON_H100.replace('"1g.34gb": 2', '"1g.34gb": 70000000')
    report = check.check(yaml.safe_load(huge), "huge")
    assert any("70000002 MIG devices asked for; B300 holds at most 7" in e for e in report.errors)


def test_config_maps_without_mig_configs_are_left_to_the_other_checks() -> None:
    assert check.config_map_entries({"kind": "ConfigMap", "data": {"a": "b"}}) == []
    assert check.config_map_entries({"kind": "Secret", "data": {"a": "mig-configs: {}"}}) == []
    assert not check.is_mig_parted({"kind": "ConfigMap", "mig-configs": {}})


def test_an_index_no_node_can_have_is_a_warning_and_the_rest_is_still_checked(
    tmp_path: Path,
) -> None:
    # The MIG manager fails such a config on every node (NVIDIA's driver handles at most 32
    # GPUs); a node's own GPU count is only known there.
    text = (
        "version: v1\nmig-configs:\n  far:\n"
        '    - {devices: [0, 99, 40], mig-enabled: true, mig-devices: {"1g.5gb": 7}}\n'
    )
    code, out, err = validate(tmp_path, text)
    assert (code, out) == (0, "")
    assert err.splitlines()[0] == (
        f"warning: {tmp_path / 'mig.yaml'}: mig-configs.far[0].devices: GPU indices 40, 99 cannot "
        "exist (NVIDIA's driver handles at most 32 GPUs in one system): the MIG manager fails "
        "this config on every node"
    )
    assert "no GPU in the catalog can apply it" not in err


def test_entries_for_other_indices_are_checked_on_a_node_that_has_them(tmp_path: Path) -> None:
    # A filtered entry for GPU 3 is planned on a made-up node with GPUs 0-3, so the filtered
    # GPU's error is found, and no "does not exist" error comes from the made-up node's size.
    code, out, err = validate(tmp_path, B300_ON_H100.replace("devices: all", "devices: [3]"))
    assert code == 1
    (line,) = out.splitlines()
    assert "mig-configs.b300-balanced[0]: GPU 3 (H100-SXM5-80GB): H100-SXM5-80GB has no" in line
    assert "does not exist" not in out + err
    fine = "version: v1\nmig-configs:\n  two:\n"
    fine += '    - {devices: [1, 5], mig-enabled: true, mig-devices: {"1g.5gb": 7}}\n'
    assert validate(tmp_path, fine) == (0, "", f"{tmp_path / 'mig.yaml'}: valid MIG config\n")
