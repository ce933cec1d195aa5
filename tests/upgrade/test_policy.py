"""The effective upgrade policy: upstream's defaults per kind, our canary annotations, selectors,
and clear errors for values that cannot be used."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_operator.upgrade import policy as policy_mod
from gpu_operator.upgrade import selectors, states
from gpu_operator.upgrade.snapshot import owner_from

CLUSTER_POLICY: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy", "uid": "u1"},
    "spec": {
        "operator": {},
        "daemonsets": {},
        "toolkit": {},
        "devicePlugin": {},
        "dcgmExporter": {},
        "dcgm": {},
        "nodeStatusExporter": {},
        "gfd": {},
        "driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"},
    },
}


def test_a_cluster_policy_without_upgrade_policy_does_not_auto_upgrade() -> None:
    assert owner_from(CLUSTER_POLICY).policy.auto_upgrade is False


def test_an_nvidiadriver_without_upgrade_policy_auto_upgrades_one_node_at_a_time() -> None:
    driver = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "a100", "uid": "u2"},
        "spec": {"version": "580.95.05"},
    }
    owner = owner_from(driver)
    assert owner.key == "NVIDIADriver/a100"
    assert (owner.policy.auto_upgrade, owner.policy.max_parallel) == (True, 1)
    assert owner.policy.max_unavailable == "25%"


def test_an_invalid_policy_object_plans_nothing_and_says_why() -> None:
    bad = {**CLUSTER_POLICY, "spec": {**CLUSTER_POLICY["spec"], "driver": {"version": 5}}}
    owner = owner_from(bad)
    assert owner.policy.auto_upgrade is False
    assert owner.policy.error is not None
    assert "ClusterPolicy is invalid" in owner.policy.error


def test_the_canary_annotations_are_read_and_checked() -> None:
    canary, problems = policy_mod.canary_from(
        {
            states.CANARY_NODES: "10%",
            states.MAX_FAILED_NODES: "2",
            states.ROLLBACK: "true",
            states.VALIDATION_TIMEOUT: "120",
        }
    )
    assert problems == []
    assert canary == policy_mod.Canary(
        nodes="10%", max_failed=2, rollback=True, validation_timeout=120
    )
    _, problems = policy_mod.canary_from(
        {states.CANARY_NODES: "120%", states.MAX_FAILED_NODES: "-1", states.ROLLBACK: "yes"}
    )
    assert problems == [
        f"annotation {states.CANARY_NODES}: expected a percentage between 0% and 100%, got '120%'",
        f"annotation {states.MAX_FAILED_NODES}: expected a non-negative integer, got '-1'",
        f'annotation {states.ROLLBACK}: expected "true" or "false", got \'yes\'',
    ]


@pytest.mark.parametrize(
    ("nodes", "pool", "expected"),
    [(0, 10, 0), (1, 10, 1), ("10%", 10, 1), ("25%", 10, 3), ("1%", 3, 1), (5, 3, 3)],
)
def test_canary_counts_round_up_and_stay_within_the_pool(
    nodes: int | str, pool: int, expected: int
) -> None:
    policy = policy_mod.Policy(canary=policy_mod.Canary(nodes=nodes))
    assert policy.canary_count(pool) == expected


def test_an_unparsable_pod_selector_makes_the_policy_unusable() -> None:
    spec = CLUSTER_POLICY["spec"]["driver"] | {
        "upgradePolicy": {"autoUpgrade": True, "drain": {"podSelector": "app in (a"}}
    }
    owner = owner_from({**CLUSTER_POLICY, "spec": {**CLUSTER_POLICY["spec"], "driver": spec}})
    assert owner.policy.error is not None
    assert owner.policy.error.startswith("drain.podSelector: unbalanced parentheses")


@pytest.mark.parametrize(
    ("text", "labels", "matches"),
    [
        ("", {"a": "b"}, True),
        ("app=train", {"app": "train"}, True),
        ("app==train,tier!=web", {"app": "train", "tier": "db"}, True),
        ("app!=train", {}, True),
        ("app in (a, b),!gpu", {"app": "b"}, True),
        ("app in (a, b),!gpu", {"app": "b", "gpu": "1"}, False),
        ("app notin (a),job", {"app": "c", "job": "x"}, True),
        ("app notin (a),job", {"app": "c"}, False),
    ],
)
def test_label_selector_strings_match_like_kubectl(
    text: str, labels: dict[str, str], matches: bool
) -> None:
    assert selectors.parse(text).matches(labels) is matches


def test_label_selector_objects_match_expressions_and_none_selects_nothing() -> None:
    selector = selectors.from_object(
        {"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    )
    assert selector.matches({"app": "x", "tier": "a"})
    assert not selector.matches({"app": "x"})
    assert str(selector) == "app=x,tier"
    assert not selectors.from_object(None).matches({})
    assert selectors.from_object({}).matches({"any": "thing"})


def test_a_bad_selector_string_names_the_bad_part() -> None:
    with pytest.raises(selectors.SelectorError, match="cannot parse 'a b' in selector"):
        selectors.parse("app=x,a b")
