"""The recorder correlates Events as client-go's EventCorrelator does, one correlator per source
(component and host): similar Events past the ninth within ten minutes become one combined Event,
exact repeats count on the Event they repeat, and a token bucket per source, object and type
(25 Events, one more every 300 s) drops the rest."""

from __future__ import annotations

from typing import Any

from kubesim_helpers import TEST_IMAGES, daemonset, instant, kubectl, needs_kubectl
from waiting import DEADLINE

import kubesim
from kubesim.controllers.events import (
    AGGREGATION_WINDOW,
    COMBINED_PREFIX,
    SPAM_BURST,
    EventRecorder,
)
from kubesim.store import Store

EVENTS = ("", "events")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def setup() -> tuple[Store, EventRecorder, FakeClock]:
    store = Store()
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
    clock = FakeClock()
    return store, EventRecorder(store, clock=clock), clock


def a_daemonset(name: str = "plugin") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
    }


def pod(name: str = "web") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
    }


def events(store: Store) -> list[dict[str, Any]]:
    return sorted(store.list("events"), key=lambda e: int(e["metadata"]["resourceVersion"]))


def test_the_tenth_similar_event_is_combined_and_later_ones_count_on_it() -> None:
    store, recorder, clock = setup()
    subject = a_daemonset()
    for index in range(12):
        recorder.record(
            subject,
            "Normal",
            "SuccessfulCreate",
            f"Created pod: plugin-{index}",
            component="daemonset-controller",
        )
        clock.now += 1
    stored = events(store)
    assert [e["message"] for e in stored[:9]] == [f"Created pod: plugin-{i}" for i in range(9)]
    assert all(e["count"] == 1 for e in stored[:9])
    assert len(stored) == 10
    combined = stored[9]
    assert combined["message"] == COMBINED_PREFIX + "Created pod: plugin-11"
    assert combined["count"] == 3  # the 10th, 11th and 12th
    assert combined["firstTimestamp"] <= combined["lastTimestamp"]
    assert combined["reason"] == "SuccessfulCreate"
    assert combined["source"] == {"component": "daemonset-controller"}
    assert combined["involvedObject"]["name"] == "plugin"
    # client-go builds the combined Event without the reporting fields.
    assert (combined["reportingComponent"], combined["reportingInstance"]) == ("", "")
    assert stored[0]["reportingComponent"] == "daemonset-controller"


def test_similar_events_further_apart_than_the_window_are_not_combined() -> None:
    store, recorder, clock = setup()
    subject = a_daemonset()
    for index in range(9):
        recorder.record(
            subject, "Normal", "SuccessfulCreate", f"Created pod: p-{index}", component="dsc"
        )
    clock.now += AGGREGATION_WINDOW + 1
    recorder.record(subject, "Normal", "SuccessfulCreate", "Created pod: p-9", component="dsc")
    assert [e["message"] for e in events(store)][-1] == "Created pod: p-9"
    assert not any(e["message"].startswith(COMBINED_PREFIX) for e in events(store))


def test_an_exact_repeat_counts_even_past_the_aggregation_limit() -> None:
    store, recorder, clock = setup()
    subject = pod()
    for _ in range(12):
        recorder.record(
            subject,
            "Warning",
            "BackOff",
            "Back-off restarting failed container",
            component="kubelet",
            host="node-1",
            field_path="spec.containers{c}",
        )
        clock.now += 30
    (only,) = events(store)
    assert only["count"] == 12
    assert only["message"] == "Back-off restarting failed container"


def test_the_26th_event_about_one_object_from_one_source_is_dropped() -> None:
    store, recorder, _ = setup()
    subject = pod()
    for index in range(SPAM_BURST + 5):
        # Different reasons: nothing is combined or counted, each Event takes a token.
        recorder.record(subject, "Normal", f"Reason{index}", "m", component="kubelet", host="n1")
    assert len(events(store)) == SPAM_BURST
    assert {e["reason"] for e in events(store)} == {f"Reason{i}" for i in range(SPAM_BURST)}
    # Another host (another kubelet, its own correlator), another object and another type
    # each have their own bucket.
    recorder.record(subject, "Normal", "Other", "m", component="kubelet", host="n2")
    recorder.record(pod("db"), "Normal", "Other", "m", component="kubelet", host="n1")
    recorder.record(subject, "Warning", "Other", "m", component="kubelet", host="n1")
    assert len(events(store)) == SPAM_BURST + 3


def test_the_spam_filter_refills_one_event_every_300_seconds() -> None:
    store, recorder, clock = setup()
    subject = pod()
    for index in range(SPAM_BURST):
        recorder.record(subject, "Normal", f"R{index}", "m", component="kubelet", host="n1")
    clock.now += 299
    recorder.record(subject, "Normal", "Late", "m", component="kubelet", host="n1")
    assert len(events(store)) == SPAM_BURST
    clock.now += 1
    recorder.record(subject, "Normal", "Refilled", "m", component="kubelet", host="n1")
    recorder.record(subject, "Normal", "TooSoon", "m", component="kubelet", host="n1")
    reasons = {e["reason"] for e in events(store)}
    assert "Refilled" in reasons
    assert {"Late", "TooSoon"}.isdisjoint(reasons)
    clock.now += 3 * 300
    for index in range(4):
        recorder.record(subject, "Normal", f"After{index}", "m", component="kubelet", host="n1")
    assert {e["reason"] for e in events(store)} >= {"After0", "After1", "After2"}
    assert "After3" not in {e["reason"] for e in events(store)}


def test_repeats_dropped_as_spam_still_count() -> None:
    """client-go observes (counts) an Event before the spam filter decides: the next repeat
    that passes carries the whole count."""
    store, recorder, clock = setup()
    subject = pod()
    for _ in range(SPAM_BURST + 5):
        recorder.record(subject, "Warning", "BackOff", "Back-off", component="kubelet", host="n1")
    (only,) = events(store)
    assert only["count"] == SPAM_BURST
    clock.now += 300
    recorder.record(subject, "Warning", "BackOff", "Back-off", component="kubelet", host="n1")
    (only,) = events(store)
    assert only["count"] == SPAM_BURST + 6


def test_a_daemonset_rollout_records_nine_events_and_one_combined_about_it() -> None:
    """A fleet's worth of pods from one DaemonSet: nine SuccessfulCreate Events, then one
    combined Event counting up to the burst, then nothing (as kube-controller-manager)."""
    store, recorder, clock = setup()
    subject = a_daemonset()
    for index in range(200):
        recorder.record(
            subject,
            "Normal",
            "SuccessfulCreate",
            f"Created pod: plugin-{index:03}",
            component="daemonset-controller",
        )
        clock.now += 0.01
    stored = events(store)
    assert len(stored) == 10
    assert stored[-1]["message"].startswith(COMBINED_PREFIX)
    assert stored[-1]["count"] == SPAM_BURST - 9


def test_a_repeat_of_a_deleted_event_creates_it_again_with_its_count() -> None:
    store, recorder, clock = setup()
    subject = pod()
    for _ in range(2):
        recorder.record(subject, "Normal", "Pulled", "pulled", component="kubelet", host="n1")
    (first,) = events(store)
    store.delete("events", first["metadata"]["name"], "default")
    clock.now += 5
    recorder.record(subject, "Normal", "Pulled", "pulled", component="kubelet", host="n1")
    (again,) = events(store)
    assert again["metadata"]["name"] == first["metadata"]["name"]
    assert again["count"] == 3
    assert again["firstTimestamp"] == first["firstTimestamp"]


def test_each_source_has_its_own_correlator() -> None:
    _, recorder, _ = setup()
    subject = pod()
    recorder.record(subject, "Normal", "A", "m", component="kubelet", host="n1")
    recorder.record(subject, "Normal", "A", "m", component="kubelet", host="n2")
    recorder.record(subject, "Normal", "A", "m", component="default-scheduler")
    assert recorder.correlator("kubelet", "n1") is not recorder.correlator("kubelet", "n2")
    assert len(recorder._correlators) == 3


@needs_kubectl
async def test_kubectl_describes_a_rollouts_events_as_a_real_cluster_shows_them() -> None:
    """The DaemonSet controller's Events on 14 nodes, as `kubectl describe` shows them: nine
    SuccessfulCreate, then the combined one counting the other five."""
    async with kubesim.Cluster(nodes=14, kubelet=instant(), images=TEST_IMAGES) as sim:
        sim.store.create(daemonset("agent"))
        await sim.wait_for(
            lambda: (
                (sim.store.get("daemonsets", "agent", "default") or {})
                .get("status", {})
                .get("numberReady")
                == 14
            ),
            DEADLINE,
        )
        described = await kubectl(sim, "describe", "daemonset", "agent")
        events = described[described.index("Events:") :].splitlines()
        created = [line for line in events if "SuccessfulCreate" in line]
        assert len(created) == 10, described
        assert sum("(combined from similar events): Created pod: agent-" in x for x in created) == 1
        (combined,) = [line for line in created if "combined" in line]
        assert "(x5 over" in combined, combined
        listed = await kubectl(
            sim, "get", "events", "--field-selector", "involvedObject.kind=DaemonSet", "-o", "name"
        )
        assert len(listed.split()) == 10, listed
