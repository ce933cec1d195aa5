"""The `gate` link of the node chain: a node still carrying the readiness gate's startup taint is
not usable yet, and the verdict says what it waits for whichever link failed first."""

from __future__ import annotations

import dataclasses

from test_explain import healthy, replace_pod

from gpu_operator.nodes.gate import StartupTaint
from gpu_operator.status import explain as ex
from gpu_operator.status.explain import PodView

TAINT = StartupTaint.parse("nvidia.com/gpu-not-ready=true:NoSchedule")
OURS = {"key": "nvidia.com/gpu-not-ready", "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def gated(**changes: object) -> ex.NodeFacts:
    fields: dict[str, object] = {"taints": [OTHER, OURS], "startup_taint": TAINT, **changes}
    return dataclasses.replace(healthy(), **fields)  # type: ignore[arg-type]


def test_a_validated_node_still_tainted_fails_at_the_gate_and_says_how_to_open_it() -> None:
    verdict = ex.explain(gated())
    assert verdict.failed is not None
    assert verdict.failed.id == "gate"
    assert [link.id for link in verdict.links][-2:] == ["validator", "gate"]
    assert "although it validated" in verdict.failed.summary
    assert "kubectl taint node a100-1 nvidia.com/gpu-not-ready:NoSchedule-" in verdict.failed.fix
    assert verdict.failed.evidence[0].text == "nvidia.com/gpu-not-ready=true:NoSchedule"
    shown = verdict.to_dict()
    assert shown["failedLink"] == "gate"
    assert "is still on the node" in shown["startupGate"]


def test_without_the_taint_or_without_a_gate_the_link_holds() -> None:
    opened = ex.explain(gated(taints=[OTHER]))
    assert opened.usable
    assert {link.id: link.status for link in opened.links}["gate"] == "ok"
    assert opened.to_dict()["startupGate"] is None
    off = ex.explain(dataclasses.replace(healthy(), taints=[OURS]))
    assert off.usable
    assert {link.id: link.status for link in off.links}["gate"] == "skipped"


def test_an_earlier_failing_link_comes_first_and_the_verdict_still_names_the_gate() -> None:
    broken = PodView("nvidia-operator-validator-z", ex.VALIDATOR_APP,
                     problem="init container plugin-validation in CrashLoopBackOff")  # fmt: skip
    facts = replace_pod(gated(allocatable={"nvidia.com/gpu": "8"}), ex.VALIDATOR_APP, broken)
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "validator"
    assert verdict.startup_gate.endswith("until it has a Ready nvidia-operator-validator pod")


def test_with_the_validator_disabled_the_gate_never_opens_and_the_fix_says_so() -> None:
    facts = replace_pod(gated(policy=ex.PolicyView(validator=False)), ex.VALIDATOR_APP, None)
    verdict = ex.explain(facts)
    assert verdict.failed is not None
    assert verdict.failed.id == "gate"
    assert "enable the validator" in verdict.failed.fix


def test_nodes_at_the_gate_are_information_in_the_status_not_a_reason_to_be_not_ready() -> None:
    from gpu_operator.status import summary

    waiting = "1 node(s) wait at the startup gate: a100-1 (validator not Ready)"
    status = summary.build(
        [summary.StateReport("state-driver", "ready")],
        summary.ClusterView(gpu_nodes=1, startup_gate=waiting),
        namespace="gpu-operator", now="2026-11-21T10:00:00Z", generation=1,
    )  # fmt: skip
    assert status["state"] == "ready"
    [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["message"] == f"all operand states ready on 1 GPU node(s); {waiting}"
