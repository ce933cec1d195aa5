"""The compute-domain planner (status/computedomain.py): clique choice, the workload template's
selector, status per node, the Ready rule, Events, cleanup and the failures a user must see."""

from __future__ import annotations

from typing import Any

from gpu_operator.api import computedomain as cdapi
from gpu_operator.status import computedomain as cd

RACK_A = "aaaa.32766"
RACK_B = "bbbb.32766"
NS = "nvidia-dra-driver-gpu"


def domain(
    num_nodes: int = 4, *, status: str | None = None, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "mpi", "namespace": "team", "uid": "u1"}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    obj: dict[str, Any] = {
        "apiVersion": cdapi.API_VERSION,
        "kind": cdapi.KIND,
        "metadata": meta,
        "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": "mpi-ch"}}},
    }
    if status:
        obj["status"] = {"status": status}
    return obj


def nodes(prefix: str, clique: str, count: int) -> dict[str, str]:
    return {f"{prefix}-{i}": clique for i in range(count)}


def daemon(node: str, *, ready: bool = True, problems: str = "", ip: str = "") -> cd.DaemonPod:
    return cd.DaemonPod(f"d-{node}", node, ip or f"10.0.0.{len(node)}", ready, problems)


def facts(dom: dict[str, Any], **kw: Any) -> cd.Facts:
    return cd.Facts(domain=dom, namespace=NS, image="img:1", **kw)


def kinds(plan: cd.Plan) -> list[str]:
    return [o["kind"] for o in plan.apply]


def reasons(plan: cd.Plan) -> list[str]:
    return [e.reason for e in plan.events]


# ----- clique choice ---------------------------------------------------------------------------


def test_the_largest_clique_is_chosen_ties_by_name() -> None:
    channel = {**nodes("a", RACK_A, 3), **nodes("b", RACK_B, 5), "cpu": ""}
    assert cd.choose_clique(4, channel) == (RACK_B, "")
    tie = {**nodes("a", RACK_A, 4), **nodes("b", RACK_B, 4)}
    assert cd.choose_clique(4, tie) == (RACK_A, "")


def test_no_clique_yet_means_no_template_and_says_why() -> None:
    plan = cd.plan(facts(domain(), channel_nodes={"cpu": ""}))
    assert "ResourceClaimTemplate" in kinds(plan)  # the daemons' template only
    assert all(o["metadata"]["name"] != "mpi-ch" for o in plan.apply)
    assert reasons(plan) == ["NoCliqueYet"]
    assert "mpi-ch" in plan.events[0].message
    assert plan.status == {"status": cdapi.NOT_READY}


def test_the_workload_template_selects_the_chosen_clique() -> None:
    plan = cd.plan(facts(domain(), channel_nodes=nodes("a", RACK_A, 4)))
    template = next(o for o in plan.apply if o["metadata"]["name"] == "mpi-ch")
    assert template["metadata"]["namespace"] == "team"
    assert template["metadata"]["labels"][cdapi.DOMAIN_LABEL] == "u1"
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == cdapi.DEFAULT_CHANNEL_CLASS
    assert request["selectors"][0]["cel"]["expression"] == (
        f"device.attributes['{cdapi.DRIVER}'].cliqueID == '{RACK_A}'"
    )
    params = template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {"apiVersion": cdapi.API_VERSION, "kind": cdapi.CHANNEL_CONFIG_KIND,
                      "domainID": "u1", "allocationMode": "Single"}  # fmt: skip
    assert plan.clique == RACK_A
    assert reasons(plan) == []


def test_a_domain_larger_than_every_clique_still_gets_a_template_and_a_warning() -> None:
    """numNodes 5 on racks of 4: the template selects the largest clique so the scheduler says
    why the fifth pod stays Pending, and the domain's Event names the sizes."""
    channel = {**nodes("a", RACK_A, 4), **nodes("b", RACK_B, 4)}
    plan = cd.plan(facts(domain(5), channel_nodes=channel))
    assert any(o["metadata"]["name"] == "mpi-ch" for o in plan.apply)
    assert plan.clique == RACK_A
    (event,) = plan.events
    assert (event.type, event.reason) == ("Warning", "NoCliqueFits")
    for text in ("numNodes 5", f"{RACK_A}: 4", f"{RACK_B}: 4", "cannot allocate all claims"):
        assert text in event.message, event.message


def test_an_existing_template_keeps_its_clique_and_warns_when_it_shrank() -> None:
    channel = {**nodes("a", RACK_A, 3), **nodes("b", RACK_B, 6)}
    plan = cd.plan(
        facts(domain(4), channel_nodes=channel, template_exists=True, template_clique=RACK_A)
    )
    assert all(o["metadata"]["name"] != "mpi-ch" for o in plan.apply)  # immutable: not remade
    assert plan.clique == RACK_A
    assert reasons(plan) == ["NoCliqueFits"]
    assert f"clique {RACK_A} with 3 node(s)" in plan.events[0].message


# ----- daemons, status, Ready --------------------------------------------------------------------


def test_the_daemonset_follows_the_domain_label_and_tolerates_everything() -> None:
    plan = cd.plan(facts(domain(), channel_nodes=nodes("a", RACK_A, 4)))
    ds = next(o for o in plan.apply if o["kind"] == "DaemonSet")
    assert ds["metadata"] == {"name": "computedomain-daemon-u1", "namespace": NS,
                              "labels": {cdapi.DOMAIN_LABEL: "u1"}}  # fmt: skip
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cdapi.DOMAIN_LABEL: "u1"}
    assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == "computedomain-daemon-u1"
    assert {t["effect"] for t in pod["tolerations"]} == {"NoSchedule", "NoExecute",
                                                        "PreferNoSchedule"}  # fmt: skip
    probe = pod["containers"][0]["readinessProbe"]["exec"]["command"]
    assert probe[-1] == "check"


def test_status_per_node_and_cliques_with_indexes() -> None:
    channel = nodes("a", RACK_A, 4)
    daemons = [daemon("a-2", ip="10.0.0.3"), daemon("a-0", ip="10.0.0.1", ready=False)]
    plan = cd.plan(facts(domain(2), channel_nodes=channel, daemons=daemons))
    assert plan.status["status"] == cdapi.NOT_READY
    assert plan.status["nodes"] == [
        {"name": "a-0", "ipAddress": "10.0.0.1", "cliqueID": RACK_A, "index": 0,
         "status": cdapi.NOT_READY},
        {"name": "a-2", "ipAddress": "10.0.0.3", "cliqueID": RACK_A, "index": 1,
         "status": cdapi.READY},
    ]  # fmt: skip
    clique = next(o for o in plan.apply if o["kind"] == cdapi.CLIQUE_KIND)
    assert clique["metadata"]["name"] == f"u1.{RACK_A}"
    assert [d["nodeName"] for d in clique["daemons"]] == ["a-0", "a-2"]


def test_ready_when_num_nodes_daemons_are_ready_with_one_normal_event() -> None:
    channel = nodes("a", RACK_A, 4)
    daemons = [daemon(f"a-{i}") for i in range(4)]
    plan = cd.plan(facts(domain(4), channel_nodes=channel, daemons=daemons))
    assert plan.status["status"] == cdapi.READY
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "Ready")]
    # Already Ready: no second Normal event.
    again = cd.plan(facts(domain(4, status=cdapi.READY), channel_nodes=channel, daemons=daemons))
    assert again.events == ()
    # Three of four is not Ready.
    short = cd.plan(facts(domain(4), channel_nodes=channel, daemons=daemons[:3]))
    assert short.status["status"] == cdapi.NOT_READY


def test_num_nodes_zero_is_ready_with_any_ready_daemon() -> None:
    channel = nodes("a", RACK_A, 2)
    assert cd.plan(facts(domain(0), channel_nodes=channel)).status["status"] == cdapi.NOT_READY
    plan = cd.plan(facts(domain(0), channel_nodes=channel, daemons=[daemon("a-0")]))
    assert plan.status["status"] == cdapi.READY


def test_deleting_daemons_and_daemons_without_an_address_are_not_listed() -> None:
    gone = cd.DaemonPod("d", "a-0", "10.0.0.1", True, deleting=True)
    fresh = cd.DaemonPod("e", "a-1", "", False)
    plan = cd.plan(facts(domain(1), channel_nodes=nodes("a", RACK_A, 2), daemons=[gone, fresh]))
    assert "nodes" not in plan.status


# ----- failures ---------------------------------------------------------------------------------


def test_a_degraded_fabric_on_the_daemons_own_node() -> None:
    channel = nodes("a", RACK_A, 2)
    problem = "node a-1 GPU 0: NVLink fabric degraded: route unhealthy"
    daemons = [daemon("a-0"), daemon("a-1", problems=problem)]
    plan = cd.plan(facts(domain(2), channel_nodes=channel, daemons=daemons))
    assert plan.status["status"] == cdapi.NOT_READY
    row = next(n for n in plan.status["nodes"] if n["name"] == "a-1")
    assert row["status"] == cdapi.NOT_READY  # its own fault, even with a passing probe
    (event,) = plan.events
    assert (event.reason, event.message) == ("NVLinkFabricDegraded", f"node a-1: {problem}")


def test_a_peer_that_cannot_be_reached_makes_the_domain_not_ready() -> None:
    channel = nodes("a", RACK_A, 2)
    problem = "peer a-1 (10.0.0.2) is unreachable: the node is down"
    daemons = [daemon("a-0", problems=problem), daemon("a-1", ready=False)]
    plan = cd.plan(facts(domain(1), channel_nodes=channel, daemons=daemons))
    # a-0 is ready itself (numNodes 1 is met) but its domain is not whole.
    assert plan.status["status"] == cdapi.NOT_READY
    assert next(n for n in plan.status["nodes"] if n["name"] == "a-0")["status"] == cdapi.READY
    assert [(e.reason, e.message) for e in plan.events] == [
        ("IMEXPeerUnreachable", f"node a-0: {problem}")
    ]


def test_an_own_fault_that_is_not_the_fabric() -> None:
    problem = "node a-0 GPU 1: NVLink fabric registration in progress"
    plan = cd.plan(
        facts(domain(1), channel_nodes=nodes("a", RACK_A, 1),
              daemons=[daemon("a-0", ready=False, problems=problem)])
    )  # fmt: skip
    assert reasons(plan) == ["IMEXDaemonNotReady"]


# ----- cleanup and explain ------------------------------------------------------------------------


def test_a_domain_being_deleted_is_finalized_and_nothing_applied() -> None:
    plan = cd.plan(facts(domain(deleting=True), channel_nodes=nodes("a", RACK_A, 4)))
    assert plan.finalize
    assert plan.apply == ()
    assert plan.events == ()


def test_explain_lists_nodes_and_the_latest_warnings() -> None:
    dom = domain(4)
    dom["status"] = {"status": cdapi.NOT_READY, "nodes": [
        {"name": "a-0", "ipAddress": "10.0.0.1", "cliqueID": RACK_A, "index": 0,
         "status": cdapi.READY},
    ]}  # fmt: skip
    events = [
        {"type": "Normal", "reason": "Ready", "message": "fine"},
        {"type": "Warning", "reason": "NoCliqueFits", "message": "numNodes 4 does not fit"},
    ]
    lines = cd.explain(dom, events)
    assert lines[0] == "ComputeDomain team/mpi: NotReady (1 of 4 node(s) with a ready IMEX daemon)"
    assert "node a-0 (10.0.0.1, clique aaaa.32766, index 0): Ready" in lines[1]
    assert lines[-1] == "  NoCliqueFits: numNodes 4 does not fit"
    assert all("fine" not in line for line in lines)
    empty = cd.explain(domain(2))
    assert "no workload pod's channel claim was prepared" in empty[1]
