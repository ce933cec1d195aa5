"""Reading the label ledger (issue 32: the status and upgrade passes decoded every node's ledger
JSON on every pass)."""

from __future__ import annotations

import json

import pytest

from gpu_operator.nodes import ledger


def test_a_ledger_value_is_decoded_once_however_many_nodes_and_passes_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = ledger.encode({"nvidia.com/gpu.deploy.driver": "true", "issue-32-decode-once": "1"})
    assert raw is not None
    decoded: list[str] = []
    real = json.loads

    def counting(text: str) -> object:
        decoded.append(text)
        return real(text)

    monkeypatch.setattr(ledger.json, "loads", counting)
    for _ in range(5):
        # Equal values from different nodes, not the same string object.
        assert ledger.read({ledger.ANNOTATION: "".join(list(raw))}) == {
            "nvidia.com/gpu.deploy.driver": "true",
            "issue-32-decode-once": "1",
        }
    assert len(decoded) <= 1


def test_each_read_is_a_dict_of_its_own() -> None:
    raw = ledger.encode({"nvidia.com/gpu.deploy.toolkit": "true"})
    assert raw is not None
    first = ledger.read({ledger.ANNOTATION: raw})
    first["nvidia.com/gpu.deploy.toolkit"] = "changed"
    first["extra"] = "x"
    assert ledger.read({ledger.ANNOTATION: raw}) == {"nvidia.com/gpu.deploy.toolkit": "true"}


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"', ""])
def test_a_mangled_ledger_owns_nothing(raw: str) -> None:
    assert ledger.read({ledger.ANNOTATION: raw}) == {}
