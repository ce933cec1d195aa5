"""What a request body may be: its media type per verb, its size, its nesting depth, and how much
its YAML aliases may expand. Every refusal is a Status and happens before anything is decoded.

Facts from the real server: bodies are read up to `MaxRequestBodyBytes` (3 MiB, twice etcd's
request limit because JSON is larger than the protobuf stored) and anything longer is 413
"Request entity too large: limit is 3145728", whatever the media type; JSON patches may hold at
most 10,000 operations and their copies may add at most 3 MiB; Go's JSON decoder stops at 10,000
levels ("exceeded max depth"); the YAML decoder stops at the same depth ("yaml: exceeded max depth
of 10000") and refuses documents decoded mostly through aliases ("yaml: document contains
excessive aliasing", the ratio rule below). kubesim takes the same 10,000 levels: a body deeper
than `kubesim.deep.SHALLOW` is handled under a raised recursion limit (`kubesim.deep`), and the
depth checks here never recurse.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from aiohttp import web

from kubesim import deep, errors

MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_DEPTH = 10_000
MAX_JSON_PATCH_OPERATIONS = 10_000
MAX_JSON_PATCH_COPY_BYTES = 3 * 1024 * 1024
# etcd's default request limit; kubesim measures the stored object's JSON.
MAX_OBJECT_BYTES = 1536 * 1024

JSON_TYPE = "application/json"
YAML_TYPE = "application/yaml"
PROTOBUF_TYPE = "application/vnd.kubernetes.protobuf"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_YAML = "application/apply-patch+yaml"

# The media types the server decodes objects from, in the order its 415 lists them.
BODY_TYPES = (JSON_TYPE, YAML_TYPE, PROTOBUF_TYPE)
# Patch types: strategic merge only for built-in kinds. CBOR apply is behind a feature gate that
# is off by default, so it is refused like any unknown type.
BUILTIN_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_YAML)
CUSTOM_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_YAML)

OBJECT = "object"  # create, update and DeleteOptions bodies
APPLY = "apply"
PATCH = "patch"  # JSON and merge patches
STRATEGIC = "strategic"


def too_large(detail: str) -> errors.ApiError:
    """413 as the server words it."""
    return errors.ApiError(
        413, f"Request entity too large: {detail}", reason="RequestEntityTooLarge"
    )


def unsupported(accepted: tuple[str, ...]) -> errors.ApiError:
    """415 listing the media types the endpoint takes."""
    return errors.ApiError(
        415,
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def media_type(request: web.BaseRequest) -> str:
    """The request's media type without parameters, or "" when no Content-Type was sent."""
    header = request.headers.get("Content-Type", "")
    return header.split(";", 1)[0].strip().lower()


def check_body_type(content_type: str) -> None:
    """Objects (create, update, DeleteOptions) decode from JSON, YAML or protobuf only.

    The real server reads a body without Content-Type as JSON; kubesim refuses it, like a body
    of a form or text type, so that no browser "simple" cross-origin request (form posts, text
    bodies, untyped blobs) can write to it.
    """
    if content_type not in BODY_TYPES:
        raise unsupported(BODY_TYPES)


def check_patch_type(content_type: str, *, custom: bool) -> None:
    """Patches are one of the patch media types (no strategic merge for custom resources)."""
    accepted = CUSTOM_PATCH_TYPES if custom else BUILTIN_PATCH_TYPES
    if content_type not in accepted:
        raise unsupported(accepted)


async def read_body(request: web.BaseRequest) -> bytes:
    """The body, or 413 once it passes `MAX_BODY_BYTES` (the server's client size is set to it)."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise too_large(f"limit is {MAX_BODY_BYTES}")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large(f"limit is {MAX_BODY_BYTES}") from exc


async def admit_body(request: web.BaseRequest, verb: str, kind: str, *, custom: bool) -> int:
    """Check a write's media type, size and nesting before anything decodes its body; returns
    the body's nesting depth as far as `kubesim.deep` needs it (exact up to SHALLOW levels,
    "more than SHALLOW" beyond), 0 for no body.

    The body is read here (aiohttp keeps it for later `request.read()` calls), so every decoder
    downstream sees only bodies within the limits.
    """
    if verb not in ("create", "update", "patch", "delete", "deletecollection"):
        return 0
    content_type = media_type(request)
    if verb == "patch":
        check_patch_type(content_type, custom=custom)
    body = await read_body(request)
    if not body:
        return 0  # nothing to decode: the handlers answer for bodies they require
    if verb != "patch":
        check_body_type(content_type)
    if content_type == APPLY_YAML:
        purpose = APPLY
    elif content_type == STRATEGIC_PATCH:
        purpose = STRATEGIC
    else:
        purpose = PATCH if verb == "patch" else OBJECT
    check_nesting(body, content_type, purpose, kind)
    if content_type in (YAML_TYPE, APPLY_YAML):
        return _yaml_depth_bound(body, deep.SHALLOW)
    return json_depth(body, deep.SHALLOW)


# ----- nesting and aliases ----------------------------------------------------------------------


def check_nesting(body: bytes, content_type: str, purpose: str, kind: str) -> bool:
    """Refuse bodies nested deeper than `MAX_DEPTH` or YAML whose aliases expand too much;
    returns whether the body is YAML that uses aliases (their values decode as shared objects,
    which in-place defaulting treats alike, as the expanded document would be)."""
    if content_type in (YAML_TYPE, APPLY_YAML):
        return _check_yaml(body, purpose, kind)
    json_types = (JSON_TYPE, JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH)
    if content_type in json_types and json_depth(body) > MAX_DEPTH:
        raise _decode_error(purpose, kind, body, "exceeded max depth", yaml_text=False)
    return False


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(body: bytes, bound: int = MAX_DEPTH) -> int:
    """The deepest nesting of a JSON text as far as `bound` matters: at most the count of its
    openers (returned when that is within `bound`, which is cheap), else exact up to the first
    level past `bound`. Iterative, so any depth is safe."""
    openers = body.count(b"{") + body.count(b"[")
    if openers <= bound:
        return openers
    depth = deepest = 0
    for match in _BRACKETS.finditer(_JSON_STRING.sub(b'""', body)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > bound:
                    return deepest
        else:
            depth -= 1
    return deepest


def _decode_error(
    purpose: str, kind: str, body: bytes, reason: str, *, yaml_text: bool
) -> errors.ApiError:
    """The 400 each decoding path of the server answers with."""
    if purpose == APPLY:
        return errors.bad_request(f"error decoding YAML: error converting YAML to JSON: {reason}")
    if purpose == PATCH:
        return errors.bad_request(f"error decoding patch: {reason}")
    if purpose == STRATEGIC:
        return errors.bad_request(reason)
    if not yaml_text:
        reason = f"couldn't get version/kind; json parse error: {reason}"
    return errors.bad_request(
        f"the object provided is unrecognized (must be of type {kind}): {reason} ({_summary(body)})"
    )


def _summary(body: bytes, length: int = 30) -> str:
    """The start of a body as the server quotes it: text for JSON objects, else hex."""
    if not body:
        return "<empty>"
    if body[:1] == b"{":
        text = body[:length].decode("utf-8", "replace")
        return text + " ..." if len(body) > length else text
    return body[:length].hex() + (" ..." if len(body) > length else "")


# go-yaml's alias budget: below 400,000 decoded nodes up to 99% may come from aliases, above
# 4,000,000 only 10%, linear in between; checked once more than 100 aliased and 1,000 nodes.
_ALIAS_LOW = 400_000
_ALIAS_HIGH = 4_000_000


def _allowed_alias_ratio(decoded: int) -> float:
    if decoded <= _ALIAS_LOW:
        return 0.99
    if decoded >= _ALIAS_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_LOW) / (_ALIAS_HIGH - _ALIAS_LOW)


def _yaml_depth_bound(body: bytes, bound: int = MAX_DEPTH) -> int:
    """An upper bound of a YAML text's nesting: indentation and sequence dashes per line plus
    the deepest flow nesting (cheap; exact enough to tell documents within `bound`)."""
    block = 0
    for line in body.splitlines():
        stripped = line.lstrip(b" ")
        dashes = 0
        while stripped[:2] == b"- " or stripped == b"-":
            dashes += 1
            stripped = stripped[2:].lstrip(b" ")
        block = max(block, len(line) - len(line.lstrip(b" ")) + dashes + 2)
        if block > bound:
            return block
    return block + json_depth(body, bound)


def _yaml_event_depth(body: bytes) -> int:
    """The exact nesting of a YAML text from its parse events (the pure-Python parser keeps its
    own stack, so this never recurses), stopping past MAX_DEPTH; 0 when it does not parse (the
    decoder reports that in its own words)."""
    depth = deepest = 0
    try:
        for event in yaml.parse(body, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
                if deepest > MAX_DEPTH:
                    break
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return 0
    return deepest


def _compose(body: bytes, shallow: bool) -> yaml.Node | None:
    # The C composer recurses in C without a limit, so it only sees shallow documents; deeper
    # ones go through the Python composer under kubesim.deep's raised recursion limit.
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader) if shallow else yaml.SafeLoader
    loader = loader_class(body)
    try:
        with deep.raised(not shallow):
            node: yaml.Node | None = loader.get_single_node()
        return node
    finally:
        loader.dispose()


def _check_yaml(body: bytes, purpose: str, kind: str) -> bool:
    def fail(reason: str) -> errors.ApiError:
        return _decode_error(purpose, kind, body, f"yaml: {reason}", yaml_text=True)

    # More flow levels ("[[[[...") than the limit are refused at once: PyYAML's pure-Python
    # scanner needs about a minute for 10,000 of them. Brackets inside double quotes do not
    # count; thousands of unbalanced ones in single-quoted or plain scalars would (a documented
    # difference). A document that may pass the limit only with its block nesting added
    # (indentation, `- - -`) is parsed to count exactly.
    if json_depth(body) > MAX_DEPTH:
        raise fail(f"exceeded max depth of {MAX_DEPTH}")
    bound = _yaml_depth_bound(body)
    if bound > MAX_DEPTH and _yaml_event_depth(body) > MAX_DEPTH:
        raise fail(f"exceeded max depth of {MAX_DEPTH}")
    if b"*" not in body:
        return False  # within the limit, and nothing can expand: no alias is written without "*"
    try:
        root = _compose(body, bound <= deep.SHALLOW)
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return False  # malformed: the decoder reports it in its own words
    if root is None:
        return False
    seen: set[int] = set()
    decoded = aliased = 0
    # (node, depth, alias depth, reached through an alias); go-yaml counts every node it
    # unmarshals, an alias once itself and then every node of its target again.
    stack: list[tuple[yaml.Node, int, int, bool]] = [(root, 1, 0, False)]
    while stack:
        node, depth, alias_depth, target = stack.pop()
        if not target and id(node) in seen:
            decoded += 1
            aliased += alias_depth > 0
            stack.append((node, depth, alias_depth + 1, True))
            continue
        seen.add(id(node))
        decoded += 1
        aliased += alias_depth > 0
        if aliased > 100 and decoded > 1000 and aliased / decoded > _allowed_alias_ratio(decoded):
            raise fail("document contains excessive aliasing")
        if isinstance(node, yaml.CollectionNode):
            if depth > MAX_DEPTH:
                raise fail(f"exceeded max depth of {MAX_DEPTH}")
            if isinstance(node, yaml.MappingNode):
                for key, value in reversed(node.value):
                    stack.append((value, depth + 1, alias_depth, False))
                    stack.append((key, depth + 1, alias_depth, False))
            else:
                for item in reversed(node.value):
                    stack.append((item, depth + 1, alias_depth, False))
    return decoded != len(seen)


def check_object_size(size: int) -> None:
    """Refuse to store an object larger than etcd would take (413, as the server maps it)."""
    if size > MAX_OBJECT_BYTES:
        raise too_large("etcdserver: request is too large")


def nesting_depth(value: Any) -> int:
    """How deeply containers nest in a decoded value (iterative: safe on any depth)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest
