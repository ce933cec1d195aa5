"""The operand DaemonSets go out while the fleet is being labelled (issue 32).

A new ClusterPolicy relabels every node: one work key per node lands in the shared queue at
once. The ClusterPolicy pass that applies the DaemonSets (upstream renders none while no node
is a GPU node, and `nvidia.com/gpu.present` is ours to set) was queued behind all of them, so
no operand pod could start before the last node was labelled (~1.7 s at 5,000 nodes, ~7 s at
20,000). The ClusterPolicy key is now served ahead of the node keys, and the first GPU node
asks for its pass at once: the DaemonSets select labelled nodes, so pods start as nodes get
labelled. A pass right after the one that applied them does not apply them again."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from operator_harness import Env, gpu_node, policy
from waiting import DEADLINE

from gpu_operator.api import keys
from gpu_operator.controller.runtime import Runtime
from gpu_operator.kube.writer import Writer

NODES = 200
# Each node's label patch takes this long (a busy API server): labelling the fleet takes
# NODES / workers times this, long after the first node is labelled.
PATCH_TAKES = 0.025


async def test_daemonsets_are_applied_before_the_fleet_is_labelled(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(NODES):
        gpu_node(env.sim, f"fleet-{i:03d}")
    sent: list[str] = []  # "label <node>" when a label patch starts, "apply <name>" per DaemonSet
    label_node, write = Writer.label_node, Runtime.write

    async def slow_label(self: Writer, name: str, patch: dict[str, Any]) -> None:
        sent.append(f"label {name}")
        await asyncio.sleep(PATCH_TAKES)
        await label_node(self, name, patch)

    async def recorded_write(self: Runtime, obj: dict[str, Any]) -> None:
        if obj.get("kind") == "DaemonSet":
            sent.append(f"apply {obj['metadata']['name']}")
        await write(self, obj)

    monkeypatch.setattr(Writer, "label_node", slow_label)
    monkeypatch.setattr(Runtime, "write", recorded_write)
    env.sim.store.create(policy())
    env.start_operator()

    def labelled() -> bool:
        nodes = [env.node_labels(f"fleet-{i:03d}") for i in range(NODES)]
        return all(labels.get(keys.GPU_PRESENT) == "true" for labels in nodes)

    await env.wait(labelled, "every node labelled")
    await env.wait(lambda: len(env.daemonsets()) >= 6, "the operand DaemonSets applied")
    labels = [i for i, what in enumerate(sent) if what.startswith("label ")]
    applies = [i for i, what in enumerate(sent) if what.startswith("apply ")]
    assert applies, sent
    # It was applied after every node's label patch had been sent.
    assert applies[0] < labels[-1], (
        f"the first DaemonSet was applied after the last of {len(labels)} label patches"
    )
    # Once each: a pass before the watch brought an apply back does not send it again.
    await env.sim.settle(DEADLINE)
    twice = {name: n for name, n in Counter(sent[i] for i in applies).items() if n > 1}
    assert not twice, twice
