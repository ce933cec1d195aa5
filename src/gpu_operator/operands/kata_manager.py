"""State `state-kata-manager`: deprecated upstream and never deployed.

It stays in the state list so that objects an older operator left with this state's label are
pruned like those of any disabled state.
"""

from __future__ import annotations

from typing import Any

from gpu_operator import api
from gpu_operator.operands.facts import ClusterFacts

NAME = "state-kata-manager"


def enabled(policy: api.ClusterPolicy, facts: ClusterFacts) -> bool:
    return False


def render(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[dict[str, Any]]:
    return []
