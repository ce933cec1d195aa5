"""`gpu-operator upgrade plan` offline (-f policy --facts pools): batches, evictions, PDB blocks,
precompiled images with their source, the estimate, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpu_operator.cli import app
from gpu_operator.upgrade import states

runner = CliRunner()
POLICY: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "operator": {},
        "daemonsets": {},
        "toolkit": {},
        "devicePlugin": {},
        "dcgmExporter": {},
        "dcgm": {},
        "nodeStatusExporter": {},
        "gfd": {},
        "driver": {
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": "580.105.08",
            "upgradePolicy": {
                "autoUpgrade": True,
                "maxParallelUpgrades": 2,
                "maxUnavailable": "50%",
                "podDeletion": {"timeoutSeconds": 300},
            },
        },
    },
}
FACTS: dict[str, Any] = {
    "pools": [
        {"name": "a100", "nodes": 4, "gpu": "A100-SXM4-40GB"},
        {"name": "l4", "nodes": 2, "gpu": "L4", "kernel": "6.8.0-1015-gke"},
    ],
    "upgrade": {
        "workloads": {
            "a100": {"gpuPods": 2},
            "l4": {"gpuPods": 1, "pdb": {"name": "serving", "disruptionsAllowed": 0}},
        },
    },
}


def plan(tmp_path: Path, policy: dict[str, Any], facts: dict[str, Any], *extra: str) -> Any:
    policy_file = tmp_path / "policy.yaml"
    facts_file = tmp_path / "pools.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    facts_file.write_text(yaml.safe_dump(facts))
    return runner.invoke(
        app, ["upgrade", "plan", "-f", str(policy_file), "--facts", str(facts_file), *extra]
    )


def as_json(tmp_path: Path, policy: dict[str, Any] = POLICY, facts: dict[str, Any] = FACTS) -> Any:
    result = plan(
        tmp_path,
        policy,
        facts,
        "-o",
        "json",
        "--driver-start-seconds",
        "100",
        "--eviction-seconds",
        "10",
        "--validation-seconds",
        "20",
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_plan_batches_nodes_by_the_policy_limits(tmp_path: Path) -> None:
    data = as_json(tmp_path)
    assert [b["nodes"] for b in data["batches"]][:2] == [["a100-1", "a100-2"], ["a100-3", "a100-4"]]
    assert data["estimate"]["peakInProgress"] <= 2
    assert data["estimate"]["peakUnavailable"] <= 3  # 50% of 6, rounded up


def test_the_plan_lists_evictions_and_the_pdb_that_blocks_them(tmp_path: Path) -> None:
    nodes = {n["name"]: n for n in as_json(tmp_path)["nodes"]}
    assert nodes["a100-1"]["evicts"] == ["workloads/a100-gpu-1-0", "workloads/a100-gpu-1-1"]
    l4 = nodes["l4-1"]
    assert l4["blockedBy"] == ["workloads/serving"]
    assert l4["state"] == states.UPGRADE_FAILED
    assert "PodDisruptionBudget workloads/serving" in l4["message"]


def test_the_estimate_comes_with_the_ideal_and_its_assumptions(tmp_path: Path) -> None:
    data = as_json(tmp_path)
    # Six nodes two at a time: three batches of 10 + 100 + 20 seconds (evict, driver, validator).
    assert data["estimate"]["idealSeconds"] == 3 * 130
    assert data["timing"]["driverStartSeconds"] == 100
    assert "not measurements" in data["timing"]["source"]


def test_precompiled_availability_says_where_the_answer_comes_from(tmp_path: Path) -> None:
    policy = json.loads(json.dumps(POLICY))
    policy["spec"]["driver"]["usePrecompiled"] = True
    nodes = {n["name"]: n for n in as_json(tmp_path, policy)["nodes"]}
    assert nodes["a100-1"]["precompiled"]["verdict"] == "likely"
    assert nodes["l4-1"]["precompiled"]["verdict"] == "unlikely"
    assert "registry was not checked" in nodes["l4-1"]["precompiled"]["source"]
    facts = json.loads(json.dumps(FACTS))
    facts["upgrade"]["precompiledKernels"] = ["6.8.0-1015-gke"]
    nodes = {n["name"]: n for n in as_json(tmp_path, policy, facts)["nodes"]}
    assert nodes["l4-1"]["precompiled"] == {
        "available": True,
        "verdict": "yes",
        "source": "facts file upgrade.precompiledKernels",
    }
    assert nodes["a100-1"]["precompiled"]["verdict"] == "no"
    without = {n["name"]: n for n in as_json(tmp_path)["nodes"]}
    assert without["a100-1"]["precompiled"]["verdict"] == "n/a"


def test_a_canary_annotation_makes_the_first_batch_one_node_per_pool(tmp_path: Path) -> None:
    policy = json.loads(json.dumps(POLICY))
    policy["metadata"]["annotations"] = {states.CANARY_NODES: "1"}
    facts = {"pools": FACTS["pools"]}
    data = as_json(tmp_path, policy, facts)
    # One driver DaemonSet serves every node: one pool, one canary.
    assert data["batches"][0]["nodes"] == ["a100-1"]
    assert data["batches"][0]["canary"] is True
    assert data["policies"][0]["canaryNodes"] == 1
    # Precompiled drivers have a DaemonSet (a pool) per kernel: a canary in each.
    policy["spec"]["driver"]["usePrecompiled"] = True
    data = as_json(tmp_path, policy, facts)
    assert data["batches"][0]["nodes"] == ["a100-1", "l4-1"]


def test_the_table_shows_batches_blocked_nodes_and_the_estimate(tmp_path: Path) -> None:
    result = plan(tmp_path, POLICY, FACTS)
    assert result.exit_code == 0, result.output
    assert "Batches" in result.output
    assert "workloads/serving" in result.output
    assert "Estimated duration" in result.output
    assert "upgrade-failed" in result.output


def test_bad_upgrade_facts_name_the_file_and_field(tmp_path: Path) -> None:
    facts = {"pools": FACTS["pools"], "upgrade": {"workloads": {"a100": {"gpuPods": -1}}}}
    result = plan(tmp_path, POLICY, facts)
    assert result.exit_code == 2
    assert "pools.yaml: upgrade.workloads.a100.gpuPods" in result.output
    facts = {"pools": FACTS["pools"], "upgrade": {"workloads": {"v100": {"gpuPods": 1}}}}
    result = plan(tmp_path, POLICY, facts)
    assert result.exit_code == 2
    assert "no pool named v100" in result.output


def test_offline_plans_need_a_policy_file(tmp_path: Path) -> None:
    facts_file = tmp_path / "pools.yaml"
    facts_file.write_text(yaml.safe_dump(FACTS))
    result = runner.invoke(app, ["upgrade", "plan", "--facts", str(facts_file)])
    assert result.exit_code == 2
    assert "--facts needs -f" in result.output
