"""Cost of kubesim's authentication/authorisation hook per request, in microseconds.

Run: `.venv/bin/python bench/kubesim_auth_bench.py`. Calls `Auth.admit` on a mocked GET of one
node in each mode (no HTTP), so the figure is the hook's own share of a request; prints, asserts
nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from aiohttp.test_utils import make_mocked_request

from kubesim.auth import Auth
from kubesim.store import Store

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

CALLS = 200_000
RBAC = "rbac.authorization.k8s.io"


def per_call(auth: Auth, headers: dict[str, str], clear_cache: bool = False) -> float:
    # Every client names the server; without authentication the name must be a loopback one.
    headers = {"Host": "127.0.0.1:6443", **headers}
    request = make_mocked_request("GET", "/api/v1/nodes/node-1", headers=headers)
    auth.admit(request)
    calls = CALLS // 10 if clear_cache else CALLS
    start = time.perf_counter()
    for _ in range(calls):
        if clear_cache and auth.rbac is not None:
            auth.rbac.clear()
        auth.admit(request)
    return (time.perf_counter() - start) / calls * 1e6


def rbac_cluster() -> tuple[Auth, str]:
    """An RBAC store with the bootstrap policy and a ServiceAccount allowed to get nodes."""
    store = Store()
    auth = Auth(store, authorization="rbac")
    auth.install_bootstrap_policy()
    resolve = store.registry.resolve
    store.insert(resolve("namespaces"), {"metadata": {"name": "default"}})
    store.insert(resolve("serviceaccounts"), {"metadata": {"name": "b", "namespace": "default"}})
    store.insert(
        resolve(f"clusterroles.{RBAC}"),
        {
            "metadata": {"name": "nodes"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        },
    )
    store.insert(
        resolve(f"clusterrolebindings.{RBAC}"),
        {
            "metadata": {"name": "nodes"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "nodes"},
            "subjects": [{"kind": "ServiceAccount", "name": "b", "namespace": "default"}],
        },
    )
    return auth, auth.token_for_service_account("default", "b")


def main() -> None:
    open_auth = Auth(Store())
    authenticating = Auth(Store(), authentication=True)
    rbac, token = rbac_cluster()
    rows = [
        ("open, authentication off, no token", per_call(open_auth, {})),
        (
            "open, authentication on, admin token",
            per_call(authenticating, {"Authorization": f"Bearer {authenticating.admin_token}"}),
        ),
        (
            "rbac, admin (system:masters)",
            per_call(rbac, {"Authorization": f"Bearer {rbac.admin_token}"}),
        ),
        (
            "rbac, ServiceAccount, cached decision",
            per_call(rbac, {"Authorization": f"Bearer {token}"}),
        ),
        (
            "rbac, ServiceAccount, decision evaluated",
            per_call(rbac, {"Authorization": f"Bearer {token}"}, clear_cache=True),
        ),
    ]
    for label, micros in rows:
        print(f"{label:42} {micros:6.2f} us per request")
    names = ["open_us", "authenticated_us", "rbac_admin_us", "rbac_sa_cached_us", "rbac_sa_us"]
    history.append("kubesim_auth", {n: micros for n, (_, micros) in zip(names, rows, strict=True)})


if __name__ == "__main__":
    main()
