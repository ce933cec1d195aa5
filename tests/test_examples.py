"""Every example manifest validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.api import check_document, manifests

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"clusterpolicy-default", "time-slicing", "mig-mixed", "kubevirt-passthrough",
            "gpudirect-rdma", "nvidiadriver-per-pool"} <= names  # fmt: skip


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_without_warnings(path: Path) -> None:
    checked = [check_document(doc) for doc in manifests.read(str(path))]
    ours = [c for c in checked if not c.skipped]
    assert ours, "no ClusterPolicy or NVIDIADriver in the example"
    for result in ours:
        assert result.errors == [], result.ref
        assert result.warnings == [], result.ref
