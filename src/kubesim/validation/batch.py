"""Validation of batch/v1 Jobs and CronJobs (including the cron schedule syntax)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubesim.validation import apps, core, field, meta
from kubesim.validation.field import FieldError

JOB_RESTART_POLICIES = ("OnFailure", "Never")
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
# (minimum, maximum, names) per field of a standard five-field schedule.
_CRON_FIELDS: tuple[tuple[int, int, dict[str, int]], ...] = (
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (
        1,
        12,
        {m: i + 1 for i, m in enumerate(_MONTHS)},
    ),
    (0, 6, {d: i for i, d in enumerate(_DAYS)}),
)
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")


def job_spec(spec: Mapping[str, Any], path: str, *, in_template: bool) -> list[FieldError]:
    """A JobSpec; a CronJob's job template gets its selector later, so none is required there."""
    problems = apps.non_negative(
        spec, path, "parallelism", "completions", "activeDeadlineSeconds", "backoffLimit"
    )
    mode = spec.get("completionMode")
    if mode is not None and mode not in ("NonIndexed", "Indexed"):
        problems.append(
            field.not_supported(f"{path}.completionMode", mode, ("NonIndexed", "Indexed"))
        )
    policy = spec.get("podReplacementPolicy")
    if policy is not None and policy not in ("TerminatingOrFailed", "Failed"):
        problems.append(
            field.not_supported(
                f"{path}.podReplacementPolicy", policy, ("TerminatingOrFailed", "Failed")
            )
        )
    template = spec.get("template")
    selector = spec.get("selector")
    if selector is None and not in_template:
        problems.append(field.required(f"{path}.selector"))
    elif selector is not None:
        problems.extend(meta.label_selector(selector, f"{path}.selector"))
        labels = (
            ((template or {}).get("metadata") or {}).get("labels")
            if isinstance(template, Mapping)
            else None
        )
        if not meta.selector_empty(selector) and not meta.selector_matches(selector, labels):
            problems.append(
                field.invalid(
                    f"{path}.template.metadata.labels",
                    labels or {},
                    "`selector` does not match template `labels`",
                )
            )
    if not isinstance(template, Mapping):
        problems.append(field.required(f"{path}.template"))
        return problems
    problems.extend(meta.template_meta(template.get("metadata"), f"{path}.template.metadata"))
    pod_spec = template.get("spec") or {}
    problems.extend(core.pod_spec(pod_spec, f"{path}.template.spec"))
    restart = pod_spec.get("restartPolicy")
    if restart not in JOB_RESTART_POLICIES:
        problems.append(
            field.not_supported(
                f"{path}.template.spec.restartPolicy", restart or "", JOB_RESTART_POLICIES
            )
        )
    return problems


def job(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A Job's spec; the selector rules (generated unless manualSelector, immutable) belong to
    the Job storage hook (kubesim.workload_admission), which runs before this."""
    spec = obj.get("spec") or {}
    generated = not spec.get("manualSelector")
    return job_spec(spec, "spec", in_template=generated)


def cron_job(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """A CronJob: schedule, concurrency policy, history limits and its job template."""
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    schedule = spec.get("schedule")
    if not schedule:
        problems.append(field.required("spec.schedule"))
    else:
        problem = schedule_problem(schedule)
        if problem:
            problems.append(field.invalid("spec.schedule", schedule, problem))
    policy = spec.get("concurrencyPolicy")
    if policy is not None and policy not in ("Allow", "Forbid", "Replace"):
        problems.append(
            field.not_supported("spec.concurrencyPolicy", policy, ("Allow", "Forbid", "Replace"))
        )
    problems.extend(
        apps.non_negative(
            spec,
            "spec",
            "startingDeadlineSeconds",
            "successfulJobsHistoryLimit",
            "failedJobsHistoryLimit",
        )
    )
    template = spec.get("jobTemplate")
    if not isinstance(template, Mapping):
        problems.append(field.required("spec.jobTemplate"))
    else:
        problems.extend(meta.template_meta(template.get("metadata"), "spec.jobTemplate.metadata"))
        problems.extend(
            job_spec(template.get("spec") or {}, "spec.jobTemplate.spec", in_template=True)
        )
    return problems


def schedule_problem(schedule: str) -> str | None:
    """Why a cron schedule does not parse (the cron library's wording), or None."""
    text = schedule.strip()
    if "TZ=" in text:
        return "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
    if text.startswith("@"):
        if text in _DESCRIPTORS:
            return None
        if text.startswith("@every "):
            duration = text[len("@every ") :].strip()
            return (
                None
                if _DURATION.match(duration)
                else f'failed to parse duration {text}: time: invalid duration "{duration}"'
            )
        return f"unrecognized descriptor: {text}"
    fields = text.split()
    if len(fields) != 5:
        return f"expected exactly 5 fields, found {len(fields)}: {text}"
    for value, (low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in value.split(","):
            problem = _cron_part(part, low, high, names)
            if problem:
                return problem
    return None


def _cron_part(part: str, low: int, high: int, names: dict[str, int]) -> str | None:
    range_part, _, step = part.partition("/")
    if step and not step.isdigit():
        return f'failed to parse int from {step}: strconv.Atoi: parsing "{step}": invalid syntax'
    if range_part in ("*", "?"):
        return None
    start_text, _, end_text = range_part.partition("-")
    bounds = []
    for text in (start_text, end_text) if end_text else (start_text,):
        lowered = text.lower()
        if lowered in names:
            bounds.append(names[lowered])
        elif text.isdigit():
            bounds.append(int(text))
        else:
            return (
                f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax'
            )
    start, end = bounds[0], bounds[-1]
    if start < low:
        return f"beginning of range ({start}) below minimum ({low}): {part}"
    if end > high:
        return f"end of range ({end}) above maximum ({high}): {part}"
    if start > end:
        return f"beginning of range ({start}) beyond end of range ({end}): {part}"
    return None


VALIDATORS = {"Job": job, "CronJob": cron_job}
