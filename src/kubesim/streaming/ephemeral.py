"""`pods/{name}/ephemeralcontainers`: GET, PUT and PATCH that may only add debug containers.

As on the real server, only `spec.ephemeralContainers` is taken from the written Pod (other
changes are silently dropped), existing entries may be neither removed nor changed, and new ones
follow the ephemeral-container rules (unique name, image, no ports/probes/resources/lifecycle...).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kubesim import errors, patch
from kubesim.resources import ResourceType
from kubesim.store import Store, Stored
from kubesim.validation import field

POD_KEY = ("", "pods")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Fields an ephemeral container may not set (the real server keeps an allow-list of the rest).
_DISALLOWED = (
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
)


def _defaults(container: dict[str, Any]) -> None:
    image = str(container.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")


def _empty(value: Any) -> bool:
    return value in (None, "", [], {}, 0, False)


def validate(old_pod: dict[str, Any], new_list: list[Any]) -> list[field.FieldError]:
    """The problems with replacing the pod's ephemeral containers by `new_list`."""
    problems: list[field.FieldError] = []
    spec = old_pod.get("spec") or {}
    others = {c.get("name") for k in ("containers", "initContainers") for c in spec.get(k) or []}
    seen = set(others)
    path = "spec.ephemeralContainers"
    for index, container in enumerate(new_list):
        at = f"{path}[{index}]"
        if not isinstance(container, dict):
            problems.append(field.invalid(at, container, "must be an object"))
            continue
        name = container.get("name") or ""
        if not name:
            problems.append(field.required(f"{at}.name"))
        elif not _DNS_LABEL.match(name) or len(name) > 63:
            problems.append(
                field.invalid(
                    f"{at}.name",
                    name,
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric "
                    "characters or '-', and must start and end with an alphanumeric character "
                    "(e.g. 'my-name',  or '123-abc', regex used for validation is "
                    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                )
            )
        if name in seen:
            problems.append(field.duplicate(f"{at}.name", name))
        seen.add(name)
        if not container.get("image"):
            problems.append(field.required(f"{at}.image"))
        target = container.get("targetContainerName")
        if target and target not in others:
            problems.append(field.not_found(f"{at}.targetContainerName", target))
        for key in _DISALLOWED:
            if not _empty(container.get(key)):
                problems.append(
                    field.forbidden(f"{at}.{key}", "cannot be set for an Ephemeral Container")
                )
        for mount_index, mount in enumerate(container.get("volumeMounts") or []):
            for key in ("subPath", "subPathExpr"):
                if isinstance(mount, dict) and mount.get(key):
                    problems.append(
                        field.forbidden(
                            f"{at}.volumeMounts[{mount_index}].{key}",
                            "cannot be set for an Ephemeral Container",
                        )
                    )
    by_name = {c.get("name"): c for c in new_list if isinstance(c, dict)}
    for existing in spec.get("ephemeralContainers") or []:
        name = existing.get("name")
        if name not in by_name:
            problems.append(
                field.forbidden(
                    path, f"existing ephemeral containers {json.dumps(name)} may not be removed\n"
                )
            )
        elif by_name[name] != existing:
            problems.append(
                field.forbidden(
                    path, f"existing ephemeral containers {json.dumps(name)} may not be changed\n"
                )
            )
    return problems


def write(
    store: Store,
    rt: ResourceType,
    namespace: str,
    name: str,
    method: str,
    content_type: str,
    body: Any,
    *,
    manager: str,
    dry_run: bool,
) -> Stored:
    """Apply a PUT or PATCH of the subresource; returns the stored pod."""
    stored = store.peek(POD_KEY, namespace, name)
    if stored is None:
        raise errors.not_found("pods", "", name)
    current = stored.copy()
    if method == "PUT":
        if not isinstance(body, dict):
            raise errors.bad_request("the body must be a Pod object")
        written = body
    elif content_type == patch.MERGE:
        if not isinstance(body, dict):
            raise errors.bad_request("a merge patch must be a JSON object")
        written = patch.merge_patch(stored.copy(), body)
    elif content_type == patch.JSON:
        written = patch.json_patch(stored.copy(), body)
    elif content_type == patch.STRATEGIC:
        if not isinstance(body, dict):
            raise errors.bad_request("a strategic merge patch must be a JSON object")
        written = patch.strategic_merge_patch(stored.copy(), body)
    else:
        raise errors.ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            f"{patch.JSON}, {patch.MERGE}, {patch.STRATEGIC}",
        )
    if not isinstance(written, dict):
        raise errors.ApiError(422, "the patched document is not an object", reason="Invalid")
    wanted = (written.get("spec") or {}).get("ephemeralContainers") or []
    if not isinstance(wanted, list):
        raise errors.bad_request("spec.ephemeralContainers must be a list")
    existing = {c.get("name") for c in (current.get("spec") or {}).get("ephemeralContainers") or []}
    for container in wanted:
        if isinstance(container, dict) and container.get("name") not in existing:
            _defaults(container)
    problems = validate(current, wanted)
    if problems:
        field.raise_invalid("Pod", "", name, problems)
    spec = current.setdefault("spec", {})
    if wanted:
        spec["ephemeralContainers"] = wanted
    else:
        spec.pop("ephemeralContainers", None)
    meta = written.get("metadata") or {}
    if method == "PUT" and meta.get("resourceVersion"):
        current["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return store.replace(
        rt,
        current,
        namespace=namespace,
        name=name,
        subresource="ephemeralcontainers",
        manager=manager,
        dry_run=dry_run,
    )
