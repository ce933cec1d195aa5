"""The device-plugin config file model (upstream api/config/v1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agents import plugin_config as pc


def test_defaults_match_upstream() -> None:
    cfg = pc.PluginConfig()
    assert cfg.version == "v1"
    assert cfg.flags.mig_strategy is pc.MigStrategy.NONE
    assert cfg.flags.fail_on_init_error is True
    assert cfg.flags.use_node_feature_api is True
    assert cfg.flags.plugin.device_list_strategy == ["envvar"]
    assert cfg.flags.gfd.sleep_seconds == 60.0
    assert cfg.flags.gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert cfg.sharing.strategy() is pc.SharingStrategy.NONE


def test_full_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        """
version: v1
flags:
  migStrategy: single
  failOnInitError: false
  plugin:
    deviceListStrategy: volume-mounts
    deviceIDStrategy: index
  gfd:
    oneshot: true
    sleepInterval: 1m30s
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
      - name: nvidia.com/gpu
        replicas: 10
"""
    )
    cfg = pc.load(path)
    assert cfg.flags.mig_strategy is pc.MigStrategy.SINGLE
    assert cfg.flags.plugin.device_list_strategy == ["volume-mounts"]
    assert cfg.flags.gfd.sleep_seconds == 90.0
    assert cfg.sharing.strategy() is pc.SharingStrategy.TIME_SLICING
    assert cfg.sharing.time_slicing is not None
    assert cfg.sharing.time_slicing.resources[0].replicas == 10


def test_json_files_and_empty_version(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"version": "", "flags": {"migStrategy": "mixed"}}')
    assert pc.load(path).flags.mig_strategy is pc.MigStrategy.MIXED


def test_short_resource_names_get_the_nvidia_prefix() -> None:
    cfg = pc.parse({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}})
    assert cfg.sharing.time_slicing is not None
    assert cfg.sharing.time_slicing.resources[0].name == "nvidia.com/gpu"


def test_renames_and_device_selections_are_reset_like_upstream() -> None:
    cfg = pc.parse(
        {
            "sharing": {
                "timeSlicing": {
                    "resources": [
                        {"name": "gpu", "rename": "gpu.custom", "devices": [0, 1], "replicas": 2},
                    ]
                }
            }
        }
    )
    ts = cfg.sharing.time_slicing
    assert ts is not None
    assert (ts.resources[0].rename, ts.resources[0].devices) == (None, "all")
    by_default = pc.parse(
        {"sharing": {"timeSlicing": {"renameByDefault": True,
                                     "resources": [{"name": "gpu", "replicas": 2}]}}}
    )  # fmt: skip
    assert by_default.sharing.time_slicing is not None
    assert by_default.sharing.time_slicing.resources[0].rename == "nvidia.com/gpu.shared"


def test_mps_forces_fail_requests_greater_than_one() -> None:
    cfg = pc.parse({"sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 4}]}}})
    assert cfg.sharing.mps is not None
    assert cfg.sharing.mps.fail_requests_greater_than_one is True
    assert cfg.sharing.strategy() is pc.SharingStrategy.MPS


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version": "v2"}, "version: unknown version 'v2'"),
        ({"flags": {"migStrategy": "some"}}, "flags.migStrategy"),
        ({"sharing": {"timeSlicing": {"resources": []}}}, "sharing.timeSlicing.resources"),
        (
            {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 1}]}}},
            "sharing.timeSlicing.resources.0.replicas",
        ),
        (
            {"sharing": {"timeSlicing": {"resources": [{"replicas": 2}]}}},
            "sharing.timeSlicing.resources.0.name",
        ),
        (
            {"sharing": {"mps": {"resources": [{"name": "Bad Name!", "replicas": 2}]}}},
            "invalid resource name",
        ),
        ({"sharing": {"timeslicing": {}}}, "sharing.timeslicing"),
        ({"flags": {"gfd": {"sleepInterval": "soon"}}}, "flags.gfd.sleepInterval"),
        ({"flags": {"plugin": {"deviceIDStrategy": "serial"}}}, "flags.plugin.deviceIDStrategy"),
        ({"imex": {"channelIDs": [3]}}, "imex.channelIDs"),
        (
            {
                "flags": {"migStrategy": "mixed"},
                "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}},
            },
            "mixed cannot be combined with sharing.mps",
        ),
        (["a"], "expected a mapping"),
    ],
)
def test_bad_config_names_the_field(data: object, message: str) -> None:
    with pytest.raises(pc.ConfigError, match=message.replace(".", r"\.")):
        pc.parse(data)


def _sharing(strategy: str, replicas: int, *, shorthand: bool) -> dict[str, object]:
    section = (
        {"replicas": replicas}
        if shorthand
        else {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}
    )
    return {"sharing": {strategy: section}}


@pytest.mark.parametrize("shorthand", [False, True])
@pytest.mark.parametrize(
    ("strategy", "replicas", "limit"),
    [
        ("timeSlicing", 1_000_000, "1,024"),  # the report: 8 GPUs, a million each
        ("timeSlicing", 1_025, "1,024"),
        ("timeSlicing", 10**30, "1,024"),
        ("mps", 101, "100"),
        ("mps", 1_000, "100"),
    ],
)
def test_replicas_past_the_limit_are_refused_naming_it(
    strategy: str, replicas: int, limit: str, shorthand: bool
) -> None:
    # Before: any count of 2 or more was taken, and the plugin built every replica.
    with pytest.raises(pc.ConfigError) as err:
        pc.parse(_sharing(strategy, replicas, shorthand=shorthand), "config.yaml")
    message = str(err.value)
    assert message.startswith(f"config.yaml: sharing.{strategy}"), message
    assert f"{replicas:,} replicas per GPU is more than the {limit} allowed" in message
    assert len(message) < 300


@pytest.mark.parametrize("shorthand", [False, True])
@pytest.mark.parametrize(("strategy", "replicas"), [("timeSlicing", 1_024), ("mps", 100)])
def test_replicas_at_the_limit_are_taken(strategy: str, replicas: int, shorthand: bool) -> None:
    cfg = pc.parse(_sharing(strategy, replicas, shorthand=shorthand))
    shared = cfg.sharing.replicated()
    assert shared is not None
    assert shared.resources[0].replicas == replicas


@pytest.mark.parametrize(
    "text",
    [
        "sharing:\n  timeSlicing:\n    replicas: " + "1" * 5000 + "\n",
        '{"sharing": {"timeSlicing": {"replicas": ' + "1" * 5000 + "}}}",
        "sharing:\n  timeSlicing:\n    replicas: .inf\n",
        "sharing: !!map [1, 2]\n",
    ],
)
def test_config_files_with_numbers_or_tags_json_cannot_hold_are_config_errors(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(pc.ConfigError, match=r"config\.yaml: not valid (YAML|JSON) at line"):
        pc.load(path)


def test_unknown_flags_are_ignored_for_forward_compatibility() -> None:
    cfg = pc.parse({"flags": {"someFutureFlag": True, "gfd": {"anotherOne": 1}}})
    assert cfg.flags.mig_strategy is pc.MigStrategy.NONE


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(pc.ConfigError, match=r"missing\.yaml: no such file"):
        pc.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("flags: [unclosed")
    with pytest.raises(pc.ConfigError, match="not valid YAML"):
        pc.load(bad)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("infinite", None)],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert pc.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "60", "1x", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        pc.parse_duration(text)


def test_bad_device_selection_is_reported_once() -> None:
    data = {
        "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "devices": 0, "replicas": 2}]}}
    }
    with pytest.raises(pc.ConfigError, match="devices: expected 'all', a positive count"):
        pc.parse(data)
