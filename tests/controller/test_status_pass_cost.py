"""What a ClusterPolicy status pass redoes on a settled cluster (issue 32): the operator's CPU grew
with nodes x passes because every pass walked the node chain for every GPU node and compared
every DaemonSet field by field with what we render. A pass now walks the chain only for the nodes
whose node object, pods or policy view changed, and compares only the DaemonSets that changed."""

from __future__ import annotations

from typing import Any

import pytest
from operator_harness import CPU_LABELS, Env, policy

from gpu_operator.controller import drift
from gpu_operator.status import explain


def passes(env: Env) -> float:
    return float(env.operator.metrics.total._value.get())


async def test_passes_over_a_settled_cluster_redo_no_chain_walk_nor_drift_comparison(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.sim.store.create(policy())
    env.start_operator()
    await env.wait_ready()
    await env.sim.settle(60)
    walked: list[str] = []
    compared: list[str] = []
    real_explain, real_differences = explain.explain, drift.differences

    def counting_explain(facts: explain.NodeFacts) -> explain.Verdict:
        walked.append(facts.name)
        return real_explain(facts)

    def counting_differences(desired: Any, live: Any) -> list[drift.Change]:
        compared.append("ds")
        return real_differences(desired, live)

    monkeypatch.setattr(explain, "explain", counting_explain)
    monkeypatch.setattr(drift, "differences", counting_differences)
    # CPU nodes joining change the cluster facts: each brings a status pass, and none of them
    # changes a GPU node, its pods or a DaemonSet.
    for index in range(3):
        before = passes(env)
        env.sim.add_node(f"cpu-extra-{index}", labels=CPU_LABELS)
        await env.wait(
            lambda seen=before: passes(env) > seen,
            f"a ClusterPolicy pass after cpu-extra-{index} joined",
        )
    await env.wait_ready()
    assert walked == [], walked
    assert compared == [], compared
