"""The `fieldValidation` directive of a write: checking its value and the Warning header of Warn.

With Warn (the default) the server answers with one `299` warning per unknown or duplicated field
(`unknown field "spec.foo"`, `duplicate field "spec.replicas"`); Ignore drops them silently and
Strict turns them into a 400 (raised during decoding, see `kubesim.validation.decode`).
"""

from __future__ import annotations

import json

from kubesim.validation import field

DIRECTIVES = ("", "Ignore", "Strict", "Warn")
OPTIONS_KINDS = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}


def check_directive(method: str, value: str | None) -> None:
    """A 422 on the request options for a fieldValidation value the server does not know."""
    if value is None or value in DIRECTIVES or method not in OPTIONS_KINDS:
        return
    field.raise_invalid(
        OPTIONS_KINDS[method],
        "meta.k8s.io",
        "",
        [field.not_supported("fieldValidation", value, DIRECTIVES)],
    )


def messages(pruned: list[str], duplicated: list[str]) -> list[str]:
    """The warning texts for unknown and duplicated fields, each reported once."""
    texts = [f'duplicate field "{p}"' for p in duplicated]
    texts += [f'unknown field "{p}"' for p in pruned]
    return list(dict.fromkeys(texts))


def header(directive: str, pruned: list[str], duplicated: list[str]) -> str | None:
    """The `Warning` header value for a response, or None when there is nothing to say."""
    if directive not in ("Warn", ""):
        return None
    texts = messages(pruned, duplicated)
    if not texts:
        return None
    return ", ".join(f"299 - {json.dumps(text)}" for text in texts)
