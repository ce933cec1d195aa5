"""The node-labelling state's message while nodes wait for their labels: GPU nodes are labelled,
nodes without a GPU are only checked (never said to be labelled)."""

from __future__ import annotations

from gpu_operator.nodes.labelling import pending_message


def test_gpu_nodes_are_labelled_and_cpu_nodes_only_checked() -> None:
    message = pending_message(["dgx-a100-80gb-1", "mig-mixed-1", "mig-single-1"], ["cpu-1"])
    assert message == (
        "labelling 3 GPU nodes (dgx-a100-80gb-1, mig-mixed-1, mig-single-1); "
        "checking 1 node without an NFD GPU label (cpu-1)"
    )
    assert "labelling cpu-1" not in message


def test_before_nfd_labelled_them_every_node_is_only_checked() -> None:
    assert pending_message([], ["a100-1", "a100-2", "cpu-1", "t4-1"]) == (
        "checking 4 nodes without an NFD GPU label (a100-1, a100-2, cpu-1 and 1 more)"
    )


def test_long_lists_are_cut_after_three_names() -> None:
    assert pending_message([f"gpu-{i}" for i in range(7)], []) == (
        "labelling 7 GPU nodes (gpu-0, gpu-1, gpu-2 and 4 more)"
    )
    assert pending_message(["gpu-0"], []) == "labelling 1 GPU node (gpu-0)"
