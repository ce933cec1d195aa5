"""Name and key syntax checks, returning the server's wording for each failure (empty = valid).

The most used checks remember the values they found valid (keys and names repeat across writes),
so a repeated value costs one set lookup; invalid values are checked again each time.

The regular expressions and limits are the API's: RFC 1123 labels (63) and subdomains (253),
qualified names (an optional subdomain prefix and a 63-character name part), label values (63),
ConfigMap/Secret keys (253), IANA service names for ports (15), and environment variable names
(any printable ASCII but `=`, the rule since the relaxed validation went GA).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

DNS1123_LABEL_RE = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_RE = DNS1123_LABEL_RE + r"(\." + DNS1123_LABEL_RE + ")*"
QUALIFIED_NAME_RE = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
LABEL_VALUE_RE = "(" + QUALIFIED_NAME_RE + ")?"
CONFIG_KEY_RE = "[-._a-zA-Z0-9]+"
DNS1035_LABEL_RE = "[a-z]([-a-z0-9]*[a-z0-9])?"

_LABEL = re.compile(f"^{DNS1123_LABEL_RE}$")
_SUBDOMAIN = re.compile(f"^{DNS1123_SUBDOMAIN_RE}$")
_QUALIFIED = re.compile(f"^{QUALIFIED_NAME_RE}$")
_LABEL_VALUE = re.compile(f"^{LABEL_VALUE_RE}$")
_CONFIG_KEY = re.compile(f"^{CONFIG_KEY_RE}$")
_DNS1035 = re.compile(f"^{DNS1035_LABEL_RE}$")
_PORT_NAME_CHARS = re.compile("^[-a-z0-9]+$")
_PORT_NAME_LETTER = re.compile("[a-z]")


# How many valid values each memoised check remembers before it starts afresh. A set of the
# strings alone: an lru_cache entry (a link list and the answer list, both tracked by the garbage
# collector) costs about 200 bytes more per name, and object names are mostly unique.
_MEMO_LIMIT = 1 << 15


def _memoised(check: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """`check`, remembering the values it accepted (a pure function: the answer never changes)."""
    valid: set[str] = set()

    @functools.wraps(check)
    def remembered(value: str) -> list[str]:
        if value in valid:
            return []
        problems = check(value)
        if not problems:
            if len(valid) >= _MEMO_LIMIT:
                valid.clear()
            valid.add(value)
        return problems

    return remembered


def _examples(*names: str) -> str:
    return ",  or ".join(f"'{n}'" for n in names)


def _format_message(kind: str, regex: str, *examples: str) -> str:
    return f"{kind} (e.g. {_examples(*examples)}, regex used for validation is '{regex}')"


def max_len(limit: int) -> str:
    """The length message the server uses for names and keys."""
    return f"must be no more than {limit} characters"


@_memoised
def dns1123_label(value: str) -> list[str]:
    """Problems with an RFC 1123 label (container names, namespaces, services)."""
    problems = []
    if len(value) > 63:
        problems.append(max_len(63))
    if not _LABEL.match(value):
        problems.append(
            _format_message(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL_RE,
                "my-name",
                "123-abc",
            )
        )
    return problems


@_memoised
def dns1123_subdomain(value: str) -> list[str]:
    """Problems with an RFC 1123 subdomain (most object names)."""
    problems = []
    if len(value) > 253:
        problems.append(max_len(253))
    if not _SUBDOMAIN.match(value):
        problems.append(
            _format_message(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
                DNS1123_SUBDOMAIN_RE,
                "example.com",
            )
        )
    return problems


def dns1035_label(value: str) -> list[str]:
    """Problems with an RFC 1035 label (Service names)."""
    problems = []
    if len(value) > 63:
        problems.append(max_len(63))
    if not _DNS1035.match(value):
        problems.append(
            _format_message(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character",
                DNS1035_LABEL_RE,
                "my-name",
                "abc-123",
            )
        )
    return problems


def path_segment_name(value: str) -> list[str]:
    """Problems with a name used as a URL path segment (RBAC kinds)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    for bad in ("/", "%"):
        if bad in value:
            return [f"may not contain '{bad}'"]
    return []


@_memoised
def qualified_name(value: str) -> list[str]:
    """Problems with a qualified name (label and annotation keys): `[prefix/]name`."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        prefix = None
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return [
            _format_message(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character",
                QUALIFIED_NAME_RE,
                "MyName",
                "my.name",
                "123-abc",
            )
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    problems: list[str] = []
    if prefix is not None:
        problems.extend(f"prefix part {p}" for p in dns1123_subdomain(prefix))
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part " + max_len(63))
    if name and not _QUALIFIED.match(name):
        problems.append(
            "name part "
            + _format_message(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                "end with an alphanumeric character",
                QUALIFIED_NAME_RE,
                "MyName",
                "my.name",
                "123-abc",
            )
        )
    return problems


@_memoised
def label_value(value: str) -> list[str]:
    """Problems with a label value."""
    problems = []
    if len(value) > 63:
        problems.append(max_len(63))
    if not _LABEL_VALUE.match(value):
        problems.append(
            _format_message(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                LABEL_VALUE_RE,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return problems


@_memoised
def config_key(value: str) -> list[str]:
    """Problems with a ConfigMap or Secret data key."""
    problems = []
    if len(value) > 253:
        problems.append(max_len(253))
    if not _CONFIG_KEY.match(value):
        problems.append(
            _format_message(
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                CONFIG_KEY_RE,
                "key.name",
                "KEY_NAME",
                "key-name",
            )
        )
    if value in (".", ".."):
        problems.append(f"must not be '{value}'")
    elif value.startswith(".."):
        problems.append("must not start with '..'")
    return problems


def env_var_name(value: str) -> list[str]:
    """Problems with an environment variable name."""
    if value and all(32 <= ord(c) <= 126 and c != "=" for c in value):
        return []
    return [
        "a valid environment variable name must consist only of printable ASCII characters "
        "other than '='"
    ]


def port_name(value: str) -> list[str]:
    """Problems with a named port (an IANA service name)."""
    problems: list[str] = []
    if len(value) > 15:
        problems.append(max_len(15))
    if not _PORT_NAME_CHARS.match(value):
        problems.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in value:
        problems.append("must not contain consecutive hyphens")
    if not _PORT_NAME_LETTER.search(value):
        problems.append("must contain at least one letter (a-z)")
    if value.startswith("-") or value.endswith("-"):
        problems.append("must not begin or end with a hyphen")
    return problems


def port_number(value: int) -> list[str]:
    """Problems with a port number."""
    return [] if 1 <= value <= 65535 else ["must be between 1 and 65535, inclusive"]
