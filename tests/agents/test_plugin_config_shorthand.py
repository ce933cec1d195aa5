"""The shortened config form of widely copied guides: accepted, logged, never silently dropped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpu_operator.agents import plugin_config as pc

SEED = """version: v1
sharing:
  timeSlicing:
    replicas: 4
mig:
  strategy: mixed
"""


def test_the_seed_documents_config_means_four_replicas_and_mixed_mig(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(SEED)
    with caplog.at_level(logging.WARNING, logger="gpu_operator.agents.plugin_config"):
        cfg = pc.load(path)
    assert cfg.flags.mig_strategy is pc.MigStrategy.MIXED
    assert cfg.sharing.strategy() is pc.SharingStrategy.TIME_SLICING
    assert cfg.sharing.time_slicing is not None
    [resource] = cfg.sharing.time_slicing.resources
    assert (resource.name, resource.replicas) == ("nvidia.com/gpu", 4)
    [record] = caplog.records
    assert "which NVIDIA's plugin does not read" in record.getMessage()
    assert "sharing.timeSlicing.resources: [{name: nvidia.com/gpu, replicas: 4}]" in (
        record.getMessage()
    )
    assert "flags.migStrategy: mixed" in record.getMessage()


def test_the_upstream_form_is_not_reported_as_shorthand(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpu_operator.agents.plugin_config"):
        pc.parse({"flags": {"migStrategy": "single"}})
    assert caplog.records == []


def test_mps_replicas_shorthand_keeps_the_mps_defaults() -> None:
    cfg = pc.parse({"sharing": {"mps": {"replicas": 2}}})
    assert cfg.sharing.strategy() is pc.SharingStrategy.MPS
    assert cfg.sharing.mps is not None
    assert cfg.sharing.mps.fail_requests_greater_than_one is True


def test_shorthand_keeps_the_other_sharing_options() -> None:
    cfg = pc.parse({"sharing": {"timeSlicing": {"replicas": 3, "renameByDefault": True}}})
    assert cfg.sharing.time_slicing is not None
    assert cfg.sharing.time_slicing.resources[0].rename == "nvidia.com/gpu.shared"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"sharing": {"timeSlicing": {"replicas": 2, "resources": []}}},
            "sharing.timeSlicing: give either the shorthand `replicas` or `resources`, not both",
        ),
        (
            {"sharing": {"timeSlicing": {"replicas": 1}}},
            "sharing.timeSlicing.replicas: expected an integer of at least 2, got 1",
        ),
        (
            {"sharing": {"timeSlicing": {"replicas": "4"}}},
            "sharing.timeSlicing.replicas: expected an integer of at least 2, got '4'",
        ),
        (
            {"mig": {"strategy": "mixed", "devices": "all"}},
            "mig: the shorthand takes only `mig.strategy`",
        ),
        (
            {"mig": {"strategy": "mixed"}, "flags": {"migStrategy": "single"}},
            "mig.strategy ('mixed') contradicts flags.migStrategy ('single')",
        ),
        ({"mig": {"strategy": "sometimes"}}, "flags.migStrategy: Input should be"),
    ],
)
def test_ambiguous_or_invalid_shorthand_is_an_error(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(pc.ConfigError) as err:
        pc.parse(document, "cm")
    assert message in str(err.value)
    assert str(err.value).startswith("cm: ")


def test_agreeing_mig_spellings_are_accepted() -> None:
    cfg = pc.parse({"mig": {"strategy": "single"}, "flags": {"migStrategy": "single"}})
    assert cfg.flags.mig_strategy is pc.MigStrategy.SINGLE
