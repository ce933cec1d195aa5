"""What the storage of some workload kinds does on create and update, beyond plain defaults.

Jobs: unless `spec.manualSelector` is true, the real server selects the Job's pods by
`batch.kubernetes.io/controller-uid=<uid>` and stamps the pod template with that label, the
`batch.kubernetes.io/job-name` label and their two legacy spellings; a Job created without labels
of its own takes the template's labels. The selector is immutable.

HorizontalPodAutoscalers: the autoscaling/v2 defaults (`minReplicas: 1`, a CPU utilisation
target of 80% when no metric is given); an autoscaling/v1 `targetCPUUtilizationPercentage` is
stored as the equivalent v2 metric.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubesim.resources import ResourceType
from kubesim.validation import field

if TYPE_CHECKING:
    from kubesim.store import Store

JOB_KEY = ("batch", "jobs")
HPA_KEY = ("autoscaling", "horizontalpodautoscalers")
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID = "controller-uid"
LEGACY_JOB_NAME = "job-name"


def admit(store: Store, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Run the create/update step of the kinds this module knows."""
    if rt.from_crd:
        return
    if rt.key == JOB_KEY:
        admit_job(obj, old)
    elif rt.key == HPA_KEY:
        admit_hpa(obj)


def admit_hpa(obj: dict[str, Any]) -> None:
    """Default an HPA as autoscaling/v2 does, converting a v1 CPU target to a v2 metric."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("minReplicas", 1)
    target = spec.pop("targetCPUUtilizationPercentage", None)
    if target is not None and not spec.get("metrics"):
        spec["metrics"] = [_cpu_metric(int(target))]
    if not spec.get("metrics"):
        spec["metrics"] = [_cpu_metric(80)]
    if obj.get("apiVersion") == "autoscaling/v1":
        # Stored in the v2 shape; kubesim does not convert back for v1 readers.
        obj["apiVersion"] = "autoscaling/v2"


def _cpu_metric(percent: int) -> dict[str, Any]:
    return {
        "type": "Resource",
        "resource": {
            "name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": percent},
        },
    }


def admit_job(obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Generate the selector and labels of a new Job; keep the selector immutable on update."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    name = obj["metadata"].get("name", "")
    if old is not None:
        old_selector = (old.get("spec") or {}).get("selector")
        if spec.get("selector") is None and old_selector is not None:
            spec["selector"] = old_selector
        elif spec.get("selector") != old_selector:
            field.raise_invalid(
                "Job",
                "batch",
                name,
                [
                    field.invalid(
                        "spec.selector",
                        field.label_selector_repr(spec.get("selector")),
                        "field is immutable",
                    )
                ],
            )
        return
    template = spec.get("template")
    if not isinstance(template, dict):
        return
    if spec.get("manualSelector"):
        if not spec.get("selector"):
            field.raise_invalid("Job", "batch", name, [field.required("spec.selector")])
        return
    if spec.get("selector"):
        field.raise_invalid(
            "Job",
            "batch",
            name,
            [
                field.invalid(
                    "spec.selector",
                    field.label_selector_repr(spec["selector"]),
                    "`selector` not auto-generated",
                )
            ],
        )
    uid = obj["metadata"]["uid"]
    template_meta = template.setdefault("metadata", {})
    before = dict(template_meta.get("labels") or {})
    labels = dict(before)
    labels[CONTROLLER_UID] = uid
    labels[JOB_NAME] = name
    labels[LEGACY_CONTROLLER_UID] = uid
    labels[LEGACY_JOB_NAME] = name
    template_meta["labels"] = labels
    spec["selector"] = {"matchLabels": {CONTROLLER_UID: uid}}
    # A 1.35 server reports the generated case explicitly.
    spec["manualSelector"] = False
    own = obj["metadata"].get("labels")
    # A Job without labels of its own is labelled like its pods (the defaulting may already
    # have copied the template's labels from before the generated ones were added).
    if not own or own == before:
        obj["metadata"]["labels"] = dict(labels)
