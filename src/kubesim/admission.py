"""The storage layer's own admission: side effects the real API server's storage strategies run
on every create (old None) and update, before the object is stored.

Service cluster IPs and node ports (service_ips), Job selectors and HPA defaults
(workload_admission), pod priority from its PriorityClass (pod_priority), the RuntimeClass a
pod names (runtime_class) and the namespace label DRA admin access needs (dra_admin_access).
The store calls whatever is in `Store.admission`; the cluster set-up registers these with
`install` (and the authorizer adds its own write checks after them), so the store imports none
of the modules that read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubesim import (
    dra_admin_access,
    pod_priority,
    runtime_class,
    service_ips,
    workload_admission,
)

if TYPE_CHECKING:
    from kubesim.store import AdmissionHook, Store

# In the order the store runs them.
BUILTIN: tuple[AdmissionHook, ...] = (
    service_ips.admit,
    workload_admission.admit,
    pod_priority.admit,
    runtime_class.admit,
    dra_admin_access.admit,
)


def install(store: Store) -> None:
    """Register the built-in admission on `store`, ahead of any hook already there."""
    store.admission[:0] = [hook for hook in BUILTIN if hook not in store.admission]
