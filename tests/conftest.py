"""Shared fixtures."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.auth.attributes import Attributes
from kubesim.auth.rules import Rule

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "charts" / "gpu-operator"
OPERATOR_NAMESPACE = "gpu-operator"
OPERATOR_ACCOUNT = "gpu-operator"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}"
# Permissions the chart grants the operator that these suites cannot exercise, each with why.
RBAC_UNEXERCISED = ROOT / "tests" / "chart" / "operator_rbac_unexercised.yaml"
# Every request the chart's RBAC allowed the operator, across the suites that run it under RBAC.
OPERATOR_GRANTS: set[tuple[str, Attributes]] = set()


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest process (each xdist worker) gets a home of its own, so kubectl's discovery
    cache, helm's settings and the demo's default kubeconfig never cross between tests running at
    once, and nothing from the user's own home or environment leaks in."""
    home = Path(tempfile.mkdtemp(prefix="gpu-operator-tests-home-"))
    os.environ["HOME"] = str(home)
    for name in (
        "KUBECONFIG", "KUBECACHEDIR", "HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME",
        "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
    ):  # fmt: skip
        os.environ.pop(name, None)
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@functools.cache
def chart_rbac_objects(values: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """The operator's ServiceAccount and RBAC objects exactly as `helm template` renders them
    (hooks left out: they belong to the CRD Jobs, not to the running operator)."""
    args = [str(HELM), "template", "gpu-operator", str(CHART), "-n", OPERATOR_NAMESPACE]
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
        # The NFD sub-chart's accounts and roles are NFD's, not the operator's.
        and (doc["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
        != "node-feature-discovery"
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
    sim.auth.granted = OPERATOR_GRANTS
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


# ----- least privilege: a permission the chart grants but the operator never uses fails the run ---
#
# The suites that run the operator under the chart's RBAC (tests/controller and the chart-on-kubesim
# tests) record every request it was allowed. When all of them ran and passed, every rule the chart
# binds to the operator's ServiceAccount must have allowed at least one of those requests, or be
# listed in RBAC_UNEXERCISED with the reason it is needed. A missing permission already fails those
# tests (a 403 is asserted against); this catches the excess ones.

_RBAC_SCOPE = ("tests/controller/", "tests/chart/test_on_kubesim.py")
_scope_items: set[str] = set()
_scope_passed: set[str] = set()


def _in_rbac_scope(nodeid: str) -> bool:
    return nodeid.startswith(_RBAC_SCOPE)


# Under pytest-xdist each worker records the grants of the tests it ran and hands them to the
# controller when it finishes; the controller sees every collected id and every report, and judges.


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_finish(session: pytest.Session) -> None:
    _scope_items.update(item.nodeid for item in session.items if _in_rbac_scope(item.nodeid))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    _scope_items.update(nodeid for nodeid in ids if _in_rbac_scope(nodeid))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed and _in_rbac_scope(report.nodeid):
        _scope_passed.add(report.nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for user, attrs in getattr(node, "workeroutput", {}).get("operator_grants", ()):
        OPERATOR_GRANTS.add((user, Attributes(*attrs)))


def operator_rule_atoms() -> list[tuple[str, Rule]]:
    """The chart's rules bound to the operator's ServiceAccount as (namespace, atom): "" for
    cluster-wide grants, one atom per verb and resource."""
    docs = chart_rbac_objects()
    roles = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs
    }
    atoms: dict[tuple[str, Rule], None] = {}
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == OPERATOR_ACCOUNT
            and s.get("namespace", binding["metadata"].get("namespace")) == OPERATOR_NAMESPACE
            for s in binding.get("subjects") or ()
        ):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "")
        role = roles.get(
            (ref["kind"], "" if ref["kind"] == "ClusterRole" else namespace, ref["name"])
        )
        assert role is not None, f"{binding['metadata']['name']} binds a role the chart lacks"
        for rule in role.get("rules") or ():
            # Names are not split out: a rule listing the operand objects' names is used when the
            # operator used its verb on any of them (not every operand runs in these suites).
            for atom in Rule.parse(rule).breakdown():
                atoms[(namespace, Rule(atom.verbs, atom.api_groups, atom.resources))] = None
    return list(atoms)


def unused_operator_permissions(grants: set[tuple[str, Attributes]]) -> tuple[list[str], list[str]]:
    """(granted but never used and not listed as unexercised, listed but used after all).

    A cluster-wide grant is used only by a request the namespaced grants would not have allowed.
    """
    used = [attrs._replace(name="") for user, attrs in grants if user == OPERATOR_USER]
    atoms = operator_rule_atoms()
    local = [rule for namespace, rule in atoms if namespace]

    def needs(namespace: str, rule: Rule, attrs: Attributes) -> bool:
        if not rule.allows(attrs):
            return False
        if namespace:
            return attrs.namespace == namespace
        return attrs.namespace != OPERATOR_NAMESPACE or not any(r.allows(attrs) for r in local)

    listed = yaml.safe_load(RBAC_UNEXERCISED.read_text()) or []
    reserved = [
        (OPERATOR_NAMESPACE if entry.get("scope") == "namespace" else "", Rule.parse(entry))
        for entry in listed
    ]
    unused = sorted(
        {
            f"{namespace or 'cluster'}: {rule.compact_string()}"
            for namespace, rule in atoms
            if not any(needs(namespace, rule, a) for a in used)
            and not any(ns == namespace and r.covers(rule) for ns, r in reserved)
        }
    )
    stale = [
        f"{namespace or 'cluster'}: {rule.compact_string()}"
        for namespace, rule in reserved
        if any(needs(namespace, atom, a) for atom in rule.breakdown() for a in used)
    ]
    return unused, stale


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_xdist_worker(session.config):
        session.config.workeroutput["operator_grants"] = [  # type: ignore[attr-defined]
            (user, tuple(attrs)) for user, attrs in OPERATOR_GRANTS
        ]
        return
    if not _scope_items or _scope_items != _scope_passed or not OPERATOR_GRANTS:
        return  # a partial or failing run says nothing about what the operator needs
    unused, stale = unused_operator_permissions(OPERATOR_GRANTS)
    if not unused and not stale:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["chart RBAC is not least-privilege for the operator's ServiceAccount:"]
    lines += [f"  granted, never used: {rule}" for rule in unused]
    lines += [f"  listed as unexercised but used: {rule}" for rule in stale]
    lines.append(
        f"  (remove the grant from the chart, or list it with a reason in {RBAC_UNEXERCISED})"
    )
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
