"""Shared fixtures."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "charts" / "gpu-operator"
NFD_STANDIN = ROOT / "tests" / "chart" / "nfd-standin"
OPERATOR_NAMESPACE = "gpu-operator"
OPERATOR_ACCOUNT = "gpu-operator"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@functools.cache
def chart_rbac_objects(values: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """The operator's ServiceAccount and RBAC objects exactly as `helm template` renders them
    (hooks left out: they belong to the CRD Jobs, not to the running operator)."""
    with tempfile.TemporaryDirectory(prefix="chart-rbac-") as tmp:
        chart = Path(tmp) / "gpu-operator"
        shutil.copytree(CHART, chart)
        shutil.copytree(NFD_STANDIN, chart / "charts" / "node-feature-discovery")
        args = [str(HELM), "template", "gpu-operator", str(chart), "-n", OPERATOR_NAMESPACE]
        for file in values:
            args += ["-f", file]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return tuple(
        doc
        for doc in yaml.safe_load_all(proc.stdout)
        if doc
        and doc["kind"] in RBAC_KINDS
        and "helm.sh/hook" not in (doc["metadata"].get("annotations") or {})
    )


def install_chart_rbac(sim: Any, values: Sequence[str | Path] = ()) -> Path:
    """Create the chart's ServiceAccount and (Cluster)Roles/bindings in a kubesim cluster and
    return a kubeconfig authenticating as that ServiceAccount (RBAC is enforced by the cluster)."""
    store = sim.store
    if store.get("namespaces", OPERATOR_NAMESPACE) is None:
        store.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}
        )
    for doc in chart_rbac_objects(tuple(str(v) for v in values)):
        store.create(yaml.safe_load(yaml.safe_dump(doc)))  # a private copy per cluster
    token = sim.auth.token_for_service_account(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)
    path: Path = sim.auth.write_kubeconfig(
        token, Path(sim.kubeconfig_path).with_name("operator-kubeconfig"), OPERATOR_NAMESPACE
    )
    return path


@pytest.fixture
def chart_rbac() -> Callable[..., Path] | None:
    """`chart_rbac(sim, values=())` installs the chart's RBAC and returns a ServiceAccount
    kubeconfig; None when helm is not installed (scripts/setup installs it)."""
    return install_chart_rbac if HELM.exists() else None
