"""NVIDIADriver upgrade-policy defaults (upstream GetUpgradePolicyWithDefaults)."""

from __future__ import annotations

from gpu_operator.api import NVIDIADriver, upgrade_policy


def test_missing_policy_means_auto_upgrade_one_node_at_a_time() -> None:
    policy = upgrade_policy.with_defaults(None)
    assert policy.autoUpgrade is True
    assert policy.maxParallelUpgrades == 1
    assert policy.maxUnavailable == "25%"
    assert policy.podDeletion is not None
    assert (policy.podDeletion.force, policy.podDeletion.timeoutSeconds) == (False, 300)
    assert policy.podDeletion.deleteEmptyDir is False
    assert policy.waitForCompletion is not None
    assert (policy.waitForCompletion.podSelector, policy.waitForCompletion.timeoutSeconds) == (
        None,
        0,
    )
    assert policy.drain is not None
    assert (policy.drain.enable, policy.drain.force, policy.drain.timeoutSeconds) == (
        False,
        False,
        300,
    )


def test_given_policy_keeps_its_values_and_fills_sub_specs() -> None:
    driver = NVIDIADriver.model_validate(
        {
            "metadata": {"name": "d"},
            "spec": {
                "version": "1",
                "upgradePolicy": {"autoUpgrade": False, "maxParallelUpgrades": 3},
            },
        }
    )
    policy = upgrade_policy.with_defaults(driver.spec.upgradePolicy)
    assert (policy.autoUpgrade, policy.maxParallelUpgrades) == (False, 3)
    assert policy.drain is not None
    assert policy.drain.timeoutSeconds == 300


def test_nvidiadriver_policy_defaults_to_auto_upgrade() -> None:
    driver = NVIDIADriver.model_validate(
        {"metadata": {"name": "d"}, "spec": {"version": "1", "upgradePolicy": {}}}
    )
    assert driver.spec.upgradePolicy is not None
    assert driver.spec.upgradePolicy.autoUpgrade is True
