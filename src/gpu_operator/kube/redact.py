"""Credentials out of text and API objects, for archives attached to public bug reports.

Pure: text or an object in; the redacted copy and how many values of each kind were replaced
out. A value is found two ways:

- by **shape**, wherever it is: PEM private-key blocks, `user:password@` in URLs and DSNs,
  Authorization and Cookie headers, Bearer tokens, JWTs, vendor tokens with a fixed prefix
  (AWS access key ids, GitHub, GitLab, NGC, Slack, Google), base64-encoded JSON holding a
  credential (a docker config), URL query parameters named like a credential;
- by **name**: the value of a command-line flag (`--password VALUE`, `--docker-auth=VALUE`), of
  an env var, a field, an annotation or a `key=value`/`key: value` pair whose name is
  credential-like (see `secret_named`), and the data of Secret objects.

Only the value is replaced (by REDACTED): names, schemes, PEM markers, user names and the rest
of a URL stay, so the reader sees that something was there and what. A value that only refers
to a credential stays: `$(VAR)` and `${VAR}` references, `{{ template }}` placeholders,
`<set to the key ...>`, paths in flags named `...-file`/`...-path`, Secret names
(`secretName`, `secretKeyRef`). Redacting redacted text changes nothing and counts nothing.

Linear in the text: no pattern nests quantifiers that can backtrack into each other, every
repetition a match has to backtrack over is bounded, candidates are found with `str.find` on
fixed words (not by a pattern tried at every position), and a scan that reads a value to the end
of its line goes on after it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import string
from collections import Counter
from typing import Any

REDACTED = "<redacted>"

# Kinds, in the order MANIFEST.txt lists them, and what each covers.
KINDS: dict[str, str] = {
    "private-key": "PEM private key blocks (BEGIN ... PRIVATE KEY): the body between the markers",
    "url-credentials": "passwords in user:password@ URLs and DSNs, token-like user names",
    "authorization": "Authorization / Proxy-Authorization header values and Bearer tokens",
    "cookie": "Cookie / Set-Cookie header values",
    "jwt": "JSON Web Tokens (service account tokens)",
    "aws-access-key": "AWS access key ids (AKIA..., ASIA...)",
    "github-token": "GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
    "gitlab-token": "GitLab tokens (glpat-, gldt-, glrt-, ...)",
    "ngc-api-key": "NVIDIA NGC API keys (nvapi-...)",
    "slack-token": "Slack tokens (xoxb-, xoxp-, ...)",
    "google-api-key": "Google API keys (AIza...)",
    "encoded-secret": "base64-encoded JSON that holds a credential (a docker config)",
    "query-parameter": "URL query parameters named like a credential (token=, apikey=, sig=)",
    "argument": "values of command-line flags named like a credential (--password VALUE)",
    "named-value": "values of env vars, fields, annotations and key=value pairs named like a "
    "credential",
    "secret-data": "the data of Secret objects (the keys are kept)",
}

# ----------------------------------------------------------------------------- names

# Credential words found anywhere in a name once separators are removed and it is lowercased
# (`DB_PASSWORD`, `ngcApiKey`, `X-Auth-Token`, `.dockerconfigjson`, `clientSecret`).
_STRONG = re.compile(
    "passw|passphrase|secret|token|credential|cookie|dockerconfigjson|dockercfg|privkey"
    "|(?:api|private|access|signing|encryption|session|license|client|master|account|shared"
    "|auth)key|connectionstring|connstr"
)
# Words that name a credential only as the name's last word (`DB_PASS`, `docker-auth`,
# `example.com/auth`, `SENTRY_DSN`), not as its first (`PASS_DEVICE_SPECS`, `SSH_AUTH_SOCK`).
_WEAK_LAST = frozenset({"auth", "pass", "pwd", "pw", "cred", "creds", "dsn", "authorization"})
# A last word saying the value is where or how a credential lives, not the credential itself:
# `secretName`, `passwordFile`, `NLS_TOKEN_PATH`, `tokenTTL`, `authorization-mode`, `secretEnv`.
_REFERENCE_LAST = frozenset(
    {
        "file", "files", "path", "paths", "dir", "directory", "name", "names", "ref", "refs",
        "reference", "namespace", "env", "id", "ids", "ttl", "second", "seconds", "duration",
        "interval", "period", "expiry", "expiration", "expires", "timeout", "length", "size",
        "count", "type", "kind", "mode", "enabled", "disabled", "required", "url", "uri",
        "endpoint", "host", "port", "issuer", "audience", "audiences", "provider", "policy",
        "spec", "format", "source", "location", "mount", "configmap", "version",
    }
)  # fmt: skip
# Env var names that only look like one: the shell's working directories.
_NOT_SECRET = frozenset({"pwd", "oldpwd"})
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def words(name: str) -> list[str]:
    """`name` in lowercase words: separators and camelCase split (`ngcAPIKey` -> ngc, api, key)."""
    return [w.lower() for w in _WORDS.findall(name)]


@functools.lru_cache(maxsize=8192)
def secret_named(name: str) -> bool:
    """Whether a value under this name (env var, field, annotation key, flag, query parameter) is
    a credential. `monkey`, `key`, `topologyKey`, `secretName`, `passwordFile`, `PWD` are not."""
    parts = words(name)
    if not parts or name.lower() in _NOT_SECRET or parts[-1] in _REFERENCE_LAST:
        return False
    if parts[-2:] in (["pull", "secret"], ["pull", "secrets"]):  # imagePullSecrets: names
        return False
    return bool(_STRONG.search("".join(parts))) or parts[-1] in _WEAK_LAST


# Values that hold no credential even under a credential's name: empty, YAML/Go literals,
# masks, references to env vars, templates, kubectl's `<set to the key 'k' in secret 's'>`.
_PLACEHOLDER = re.compile(
    r"(?i)(?:|null|nil|none|true|false|yes|no|~|\*+|x{3,}|\$\(\w+\)|\$\{\w+\}|\$\w+|\{\{.*\}\}|<.*)"
)


def placeholder(value: str) -> bool:
    """Whether `value` is no credential whatever its name (also REDACTED itself)."""
    return _PLACEHOLDER.fullmatch(value.strip()) is not None


# ----------------------------------------------------------------------------- text

Counts = Counter[str]
_Edit = tuple[int, int, str, str]  # start, end, replacement, kind
# Lowercase that keeps every position (str.lower() may not: some characters grow).
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _apply(text: str, edits: list[_Edit], counts: Counts) -> str:
    """`text` with the edits made (in order; one overlapping an earlier one is dropped), each
    counted under its kind."""
    if not edits:
        return text
    out: list[str] = []
    pos = 0
    for start, end, replacement, kind in sorted(edits):
        if start < pos:
            continue
        out.append(text[pos:start])
        out.append(replacement)
        counts[kind] += 1
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _find_all(text: str, needles: tuple[str, ...]) -> list[int]:
    """Every position where one of `needles` starts, in order (str.find: no regex per char)."""
    found: list[int] = []
    for needle in needles:
        at = text.find(needle)
        while at >= 0:
            found.append(at)
            at = text.find(needle, at + 1)
    found.sort()
    return found


def _escape_before(text: str, at: int) -> bool:
    """Whether text[:at] ends with a JSON escape (`\\n`, `\\r`, `\\t`): a log line quoted in a
    JSON string, where a word right after the escape starts a new line."""
    return at >= 2 and text[at - 2] == "\\" and text[at - 1] in "nrt"


def _word_start(text: str, at: int, joiners: str) -> bool:
    """Whether a token found at `at` starts there, not inside a longer word: the character
    before is no ASCII letter or digit nor one of `joiners`, or ends a JSON escape."""
    if at == 0:
        return True
    before = text[at - 1]
    if not (before.isascii() and before.isalnum()) and before not in joiners:
        return True
    return _escape_before(text, at)


# ---- private keys

# Line breaks, real or JSON-escaped (a key inside a JSON string in a log line).
_BREAK = re.compile(r"\r\n|\n|\r|\\r\\n|\\n|\\r")
_LEAD = re.compile(r"(?:[ \t]|\r\n|\n|\r|\\r\\n|\\n|\\r)*")
_PEM = re.compile(r"-----(BEGIN|END) [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----")
# One line of a PEM body: base64 (in words when the breaks became spaces) or an RFC 1421 header.
_PEM_LINE = re.compile(
    r"[ \t]*(?:[A-Za-z0-9+/=]+(?:[ \t]+[A-Za-z0-9+/=]+)*"
    r"|(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset):[^\r\n]*)?[ \t]*"
)


# The base64 that starts or ends a line which is not all PEM body: a key line cut by what
# follows or precedes it on that line (`read failed: MIIE...`, `...AAAA"}` in JSON).
_HEAD_RUN = re.compile(r"[ \t]*([A-Za-z0-9+/=]{4,})")
_TAIL_RUN = re.compile(r"(?<![A-Za-z0-9+/=])([A-Za-z0-9+/=]{4,})[ \t]*\Z")


def _base64ish(run: re.Match[str] | None) -> bool:
    """Whether a run of base64 characters reads as base64, not as a word (`step`, `Starting`)."""
    if run is None:
        return False
    chars = run.group(1)
    return (
        len(chars) >= 20
        or any(c.isdigit() or c in "+/=" for c in chars)
        or any(c.isupper() for c in chars[1:])
    )


def _pem_forward(text: str, start: int, stop: int) -> int:
    """End of the PEM body lines from `start` (a BEGIN marker whose END is missing: a log cut
    after it)."""
    end = pos = start
    for brk in _BREAK.finditer(text, start, stop):
        line = text[pos : brk.start()]
        if not _PEM_LINE.fullmatch(line):
            head = _HEAD_RUN.match(text, pos, brk.start())
            return head.end() if head and _base64ish(head) else end
        if line.strip():
            end = brk.start()
        pos = brk.end()
    line = text[pos:stop]
    if line.strip() and _PEM_LINE.fullmatch(line):
        return stop
    head = _HEAD_RUN.match(text, pos, stop)
    return head.end() if head and _base64ish(head) else end


def _pem_backward(text: str, start: int, stop: int) -> int:
    """Start of the PEM body lines that end at `stop` (an END marker whose BEGIN is missing: a
    log tail that starts inside the key)."""
    first = line_end = stop
    for brk in reversed(list(_BREAK.finditer(text, start, stop))):
        line = text[brk.end() : line_end]
        if not _PEM_LINE.fullmatch(line):
            tail = _TAIL_RUN.search(text, max(brk.end(), line_end - 256), line_end)
            return tail.start() if tail and _base64ish(tail) else first
        if line.strip():
            first = brk.end()
        line_end = brk.start()
    line = text[start:line_end]
    if line.strip() and _PEM_LINE.fullmatch(line):
        return start
    tail = _TAIL_RUN.search(text, max(start, line_end - 256), line_end)
    return tail.start() if tail and _base64ish(tail) else first


def _lead_end(text: str, start: int, end: int) -> int:
    """`start` past the blanks and line breaks text[start:end] begins with."""
    lead = _LEAD.match(text, start, end)
    return lead.end() if lead else start


def _trail_start(text: str, start: int, end: int) -> int:
    """`end` before the blanks and line breaks text[start:end] ends with."""
    while end > start:
        for brk in (" ", "\t", "\r\n", "\n", "\r", "\\r\\n", "\\n", "\\r"):
            if text.endswith(brk, start, end):
                end -= len(brk)
                break
        else:
            break
    return end


def _private_keys(text: str, counts: Counts) -> str:
    """The body of each private key, between its markers (kept). A key the log cut (no END
    after its BEGIN, or no BEGIN before its END) loses the base64 lines next to its marker."""
    if "PRIVATE KEY" not in text:
        return text
    markers = list(_PEM.finditer(text))
    edits: list[_Edit] = []
    i = 0
    while i < len(markers):
        mark = markers[i]
        after = markers[i + 1] if i + 1 < len(markers) else None
        if mark.group(1) == "BEGIN":
            stop = after.start() if after is not None else len(text)
            start = _lead_end(text, mark.end(), stop)
            if after is not None and after.group(1) == "END":
                end = _trail_start(text, start, stop)
                i += 1  # the END is this key's
            else:
                end = _trail_start(text, start, _pem_forward(text, start, stop))
        else:
            begin = markers[i - 1].end() if i else 0
            end = _trail_start(text, begin, mark.start())
            start = _pem_backward(text, begin, end)
        if text[start:end].strip() not in ("", REDACTED):
            edits.append((start, end, REDACTED, "private-key"))
        i += 1
    return _apply(text, edits, counts)


# ---- URLs

_USERINFO = re.compile(r"(?P<user>[^\s:/?#@\"'<>\[\]\\]{0,256}):(?P<password>[^\s/?#\"'\\]*)@")
# `https://<token>@host`: a user name long and mixed enough to be a token (not `git@`).
_TOKEN_USER = re.compile(r"[\w.~%+-]{20,256}(?=@)")
_DSN_USER = re.compile(r"[\w.-]{1,64}")
# Go's MySQL DSN: user:password@tcp(host:3306)/db.
_DSN_PROTOCOLS = ("@tcp(", "@udp(", "@unix(")
_DSN_STOP = frozenset(" \t\r\n\"'`/@=,;\\")


def _token_user(user: str) -> bool:
    return any(c.isalpha() for c in user) and any(c.isdigit() for c in user)


def _redactable_part(value: str) -> bool:
    return bool(value) and not placeholder(value) and REDACTED not in value


def _urls(text: str, counts: Counts) -> str:
    """The password of `scheme://user:password@`, a token as a URL's user name, a DSN's
    password; the user names stay."""
    edits: list[_Edit] = []
    pos = text.find("://")
    while pos >= 0:
        at = pos + 3
        if pos and text[pos - 1].isalnum():  # a scheme before it
            userinfo = _USERINFO.match(text, at)
            token = None if userinfo else _TOKEN_USER.match(text, at)
            if userinfo and _redactable_part(userinfo.group("password")):
                edits.append((*userinfo.span("password"), REDACTED, "url-credentials"))
            elif token and _token_user(token.group()) and REDACTED not in token.group():
                edits.append((*token.span(), REDACTED, "url-credentials"))
        pos = text.find("://", at)
    for at in _find_all(text, _DSN_PROTOCOLS):
        start = at
        while start > 0 and at - start <= 322 and text[start - 1] not in _DSN_STOP:
            start -= 1
        user, colon, password = text[start:at].partition(":")
        if colon and _DSN_USER.fullmatch(user) and _redactable_part(password):
            edits.append((start + len(user) + 1, at, REDACTED, "url-credentials"))
    return _apply(text, edits, counts)


# ---- values after a name

# A value in double quotes (JSON), single quotes or Go's [brackets]; unquoted.
_DOUBLE = re.compile(r'"((?:[^"\\\r\n]|\\.)*)"')
_SINGLE = re.compile(r"'([^'\r\n]*)'")
_BRACKETS = re.compile(r"\[([^\[\]{}\r\n]*)\]")
# Unquoted values end at blanks, quotes, separators and JSON escapes (`\n`, `\"`).
_BARE = re.compile(r"(?:[^\s\"'&,;\\]|\\(?![nrt\"]))+")
_BARE_ARG = re.compile(r"(?:[^\s\"'\\]|\\(?![nrt\"]))+")
_BLOCK = re.compile(r"[|>][-+0-9]{0,3}[ \t]*(?=\r?\n)")


class _Lines:
    """Where the lines of one text end, each found once however many values on a long line
    ask (the scans stay linear). A line ends at a real break; with `escaped`, also at a
    JSON-escaped one (the end of a log line quoted in a JSON string)."""

    def __init__(self, text: str, *, escaped: bool) -> None:
        self.text = text
        self.breaks = ("\n", "\r", "\\n", "\\r") if escaped else ("\n", "\r")
        self.start = self.end = -1

    def end_of(self, pos: int) -> int:
        if self.start <= pos <= self.end:
            return self.end
        end = len(self.text)
        for brk in self.breaks:
            found = self.text.find(brk, pos, end)
            if found >= 0:
                end = found
        self.start, self.end = pos, end
        return end


_OPENER = {")": "(", "]": "[", "}": "{"}


def _trim_closers(text: str, start: int, end: int) -> int:
    """`end` before closing brackets the value does not open (`{Password:x}` -> `x`)."""
    value = text[start:end]
    while end > start and text[end - 1] in _OPENER and _OPENER[text[end - 1]] not in value:
        end -= 1
    return end


def _block(text: str, key_start: int, start: int) -> tuple[int, int] | None:
    """The lines of a YAML block scalar (`password: |` at `key_start`; `start` at the end of its
    line): those indented more than the line of the key."""
    line_start = text.rfind("\n", 0, key_start) + 1
    column = len(text[line_start:key_start]) - len(text[line_start:key_start].lstrip(" "))
    first = text.find("\n", start) + 1
    pos, end = first - 1, first
    while 0 <= pos < len(text) - 1:
        nxt = text.find("\n", pos + 1)
        line = text[pos + 1 : nxt if nxt >= 0 else len(text)]
        if line.strip():
            if len(line) - len(line.lstrip(" ")) <= column:
                break
            end = pos + 1 + len(line.rstrip())
        pos = nxt
    first += len(text[first:end]) - len(text[first:end].lstrip())
    return (first, end) if end > first else None


def _value(
    text: str, start: int, lines: _Lines, *, bare: re.Pattern[str], key_start: int
) -> tuple[int, int] | None:
    """Where the value that starts at `start` is (inside its quotes), or None (no scalar). A
    quote not closed on its line (a value cut by the log limit) runs to the end of the line;
    `lines` finds real line ends (a JSON string may hold escaped ones)."""
    if text.startswith('\\"', start):  # a JSON string inside a JSON string
        line_end = lines.end_of(start + 2)
        end = text.find('\\"', start + 2, line_end)
        return start + 2, end if end >= 0 else line_end
    first = text[start : start + 1]
    if first in ('"', "'"):
        line_end = lines.end_of(start + 1)
        quoted = (_DOUBLE if first == '"' else _SINGLE).match(text, start, line_end)
        return (quoted.start(1), quoted.end(1)) if quoted else (start + 1, line_end)
    if first == "[":
        listed = _BRACKETS.match(text, start)
        return (listed.start(1), listed.end(1)) if listed else None
    if first in ("", "{", "(") or first.isspace():
        return None
    if first in "|>" and (block := _BLOCK.match(text, start)):
        return _block(text, key_start, block.end())
    match = bare.match(text, start)
    if not match:
        return None
    return start, _trim_closers(text, start, match.end())


def _redactable(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] holds a value to redact: not a placeholder, not redacted, and
    not the scheme of a value redacted already (`token: Bearer <redacted>`)."""
    value = text[start:end]
    if placeholder(value) or REDACTED in value:
        return False
    after = end
    while after < min(end + 8, len(text)) and text[after] in " \t":
        after += 1
    return not text.startswith(REDACTED, after)


# ---- headers

_HEADER_TAIL = re.compile(r"\\?[\"'\]]?[ \t]{0,8}[:=][ \t]{0,8}")
# Authorization schemes whose parameters are quoted (`Digest username="u", response="..."`).
_PARAM_SCHEMES = frozenset({"digest", "aws4-hmac-sha256", "signature", "hoba", "mutual", "oauth"})
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}[ \t]+(?=\S)")


def _header_value(
    text: str, name_start: int, start: int, lines: _Lines, escaped: _Lines
) -> tuple[int, int] | None:
    """A header's value: quoted, bracketed, or the rest of the line (up to the quote the header
    itself is in: `-H 'Authorization: Bearer x'`, a JSON string)."""
    if text.startswith(('\\"', '"', "'", "["), start):
        return _value(text, start, lines, bare=_BARE, key_start=name_start)
    end = escaped.end_of(start)
    before = text[max(name_start - 2, 0) : name_start]
    scheme = _SCHEME.match(text, start, end)
    if not (scheme and scheme.group().strip().lower() in _PARAM_SCHEMES):
        for quote in ('\\"', '"', "'"):
            if before.endswith(quote):
                found = text.find(quote, start, end)
                end = found if found >= 0 else end
                break
    end = _trail_start(text, start, end)
    return (start, end) if end > start else None


def _cookie_spans(text: str, start: int, end: int, set_cookie: bool) -> list[tuple[int, int]]:
    """Each cookie value after its `name=` (only the first of a Set-Cookie: then attributes)."""
    spans: list[tuple[int, int]] = []
    pos = start
    for number, pair in enumerate(text[start:end].split(";")):
        if set_cookie and number:
            break
        key, eq, _ = pair.partition("=")
        first = _lead_end(text, pos + (len(key) + 1 if eq else 0), pos + len(pair))
        last = _trail_start(text, first, pos + len(pair))
        if last > first:
            spans.append((first, last))
        pos += len(pair) + 1
    return spans


def _headers(text: str, counts: Counts) -> str:
    """Authorization values after their scheme (`Bearer <redacted>`); cookie values (names and
    Set-Cookie attributes stay), one count per header."""
    lower = text.translate(_ASCII_LOWER)
    candidates: list[tuple[int, int]] = []  # name start, name end
    for at in _find_all(lower, ("authorization", "cookie")):
        end = at + (13 if lower.startswith("authorization", at) else 6)
        prefix = "proxy-" if end - at == 13 else "set-"
        start = at - len(prefix) if lower.endswith(prefix, 0, at) else at
        candidates.append((start, end))
    edits: list[_Edit] = []
    lines, escaped = _Lines(text, escaped=False), _Lines(text, escaped=True)
    done = 0
    for start, name_end in sorted(candidates):
        tail = _HEADER_TAIL.match(text, name_end)
        if start < done or tail is None or not _word_start(text, start, "_-"):
            continue
        where = _header_value(text, start, tail.end(), lines, escaped)
        if where is None:
            continue
        first, end = where
        value = text[first:end]
        if placeholder(value) or REDACTED in value or value.startswith("{"):
            continue
        done = end
        if lower.endswith("authorization", start, name_end):
            scheme = _SCHEME.match(text, first, end)
            edits.append((scheme.end() if scheme else first, end, REDACTED, "authorization"))
            continue
        spans = _cookie_spans(text, first, end, lower.startswith("set-", start))
        if spans:
            parts, cursor = [], spans[0][0]
            for left, right in spans:
                parts.append(text[cursor:left] + REDACTED)
                cursor = right
            edits.append((spans[0][0], spans[-1][1], "".join(parts), "cookie"))
    return _apply(text, edits, counts)


# ---- tokens by shape

# Tokens with a fixed prefix: (the prefixes, kind, the pattern from a prefix on, the characters
# that may not come right before a prefix: it would be the tail of a longer word).
_GITLAB = ("pat", "dt", "rt", "ptt", "cbt", "ft", "imt", "oas", "soat", "agent", "wt", "ffct")
_SHAPES: tuple[tuple[tuple[str, ...], str, re.Pattern[str], str], ...] = (
    (
        ("eyJ",),
        "jwt",
        re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){0,3}"),
        "_-",
    ),
    (
        ("AKIA", "ASIA", "ABIA", "ACCA"),
        "aws-access-key",
        re.compile(r"A[A-Z]{3}[A-Z0-9]{16}(?![A-Za-z0-9])"),
        "",
    ),
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        "github-token",
        re.compile(r"gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{22,255}"),
        "_",
    ),
    (
        tuple(f"gl{kind}-" for kind in _GITLAB),
        "gitlab-token",
        re.compile(r"gl[a-z]{2,5}-[A-Za-z0-9_-]{20,255}"),
        "_-",
    ),
    (("nvapi-",), "ngc-api-key", re.compile(r"nvapi-[A-Za-z0-9_-]{20,255}"), "_-"),
    (
        tuple(f"xox{kind}-" for kind in "abeoprs"),
        "slack-token",
        re.compile(r"xox[a-z]-[A-Za-z0-9-]{10,255}"),
        "_-",
    ),
    (("AIza",), "google-api-key", re.compile(r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])"), "_-"),
)


def _shapes(text: str, counts: Counts) -> str:
    for prefixes, kind, pattern, joiners in _SHAPES:
        edits: list[_Edit] = []
        done = 0
        for at in _find_all(text, prefixes):
            if at < done or not _word_start(text, at, joiners):
                continue
            if (match := pattern.match(text, at)) is not None:
                edits.append((at, match.end(), REDACTED, kind))
                done = match.end()
        text = _apply(text, edits, counts)
    return text


# A bearer token outside an Authorization header; `bearer token` and `Bearer authentication` in
# prose are words, not tokens (letters only, short).
_BEARER = re.compile(r"(?i)bearer[ \t]+(?P<token>[A-Za-z0-9._~+/-]+=*)")


def _bearer(text: str, counts: Counts) -> str:
    edits: list[_Edit] = []
    for at in _find_all(text.translate(_ASCII_LOWER), ("bearer",)):
        match = _BEARER.match(text, at)
        if match is None or not _word_start(text, at, "_-"):
            continue
        token = match.group("token")
        if not (token.isalpha() and len(token) < 20) and REDACTED not in token:
            edits.append((*match.span("token"), REDACTED, "authorization"))
    return _apply(text, edits, counts)


# base64 of a JSON object: `{"` -> eyJ, `{ "` -> eyA, `{\n` -> ewo, `{\r` -> ew0.
_ENCODED = re.compile(r"e[yw][A-Za-z0-9][A-Za-z0-9+/_-]{17,}={0,2}")


def _decodes_to_secret(blob: str, depth: int) -> bool:
    try:
        data = base64.b64decode(blob.replace("-", "+").replace("_", "/") + "=" * (-len(blob) % 4))
    except (binascii.Error, ValueError):
        return False
    decoded = data.decode("utf-8", "replace")
    return _redact(decoded, Counter(), depth + 1) != decoded


def _encoded(text: str, counts: Counts, depth: int) -> str:
    """base64-encoded JSON whose decoded text holds a credential (a docker config)."""
    if depth > 2:
        return text
    edits: list[_Edit] = []
    done = 0
    for at in _find_all(text, ("eyJ", "eyA", "ewo", "ew0")):
        if at < done or not _word_start(text, at, "+/_-"):
            continue
        match = _ENCODED.match(text, at)
        if match is not None:
            done = match.end()
            if _decodes_to_secret(match.group(), depth):
                edits.append((at, match.end(), REDACTED, "encoded-secret"))
    return _apply(text, edits, counts)


# ---- by name

_QUERY = re.compile(r"[?&;](?P<name>[A-Za-z0-9_.\-\[\]]{1,64})=(?P<value>[^&#\s\"'<>;\\]+)")
# Query parameters that are credentials in signed URLs whatever secret_named says.
_QUERY_NAMES = frozenset(
    {"sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
     "x-goog-signature", "x-goog-credential", "code"}
)  # fmt: skip


def _query(text: str, counts: Counts) -> str:
    """`?token=...`, `&apikey=...`, `&sig=...`: the value, up to the next parameter."""
    if "=" not in text:
        return text
    edits: list[_Edit] = []
    for match in _QUERY.finditer(text):
        name, value = match.group("name"), match.group("value")
        named = name.lower() in _QUERY_NAMES or secret_named(name)
        if named and not placeholder(value) and REDACTED not in value:
            edits.append((*match.span("value"), REDACTED, "query-parameter"))
    return _apply(text, edits, counts)


# Where a credential's name can be: every name `secret_named` accepts holds one of these as
# written (a word of it, or `key` of `api_key`, `privateKey`, ...), so only the text around
# them is looked at. Most logs hold none.
_TRIGGERS = ("pass", "pw", "secret", "token", "cred", "cookie", "docker", "privkey", "auth",
             "dsn", "conn", "key")  # fmt: skip
_NAME_MAX = 81  # longest name looked at (a flag, a key, an env var)
_SEPARATOR = re.compile(r"[ \t]{0,8}(?::=|=>|=|:(?![:/]))[ \t]{0,8}")
_FLAG_SEPARATOR = re.compile(r"=|[ \t]+")
# `name: X` before an env var name (YAML, JSON, Go's `Name:X`), and the `value:` after it.
_NAME_KEY_BEFORE = re.compile(
    r"(?i)(?<![\w.\-/])\\?[\"']?name\\?[\"']?[ \t]{0,8}(?::=|=|:)[ \t]{0,8}\\?[\"']?\Z"
)
_NAME_KEY = re.compile(r"(?i)(?<![\w.\-/])\\?[\"']?name\\?[\"']?[ \t]{0,8}[:=]")
_VALUE_KEY = re.compile(
    r"(?i)(?<![\w.\-/])(?P<quote>\\?[\"']?)value(?P=quote)[ \t]{0,8}(?::=|=>|=|:(?![:/]))[ \t]{0,8}"
)
# How far after `name: X` a `value:` still belongs to it (an env entry).
_ENV_PAIR = 256
# Left to the header rule (its value keeps the scheme, cookies keep their names).
_HEADER_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


def _name_char(char: str) -> bool:
    return char.isalnum() or char in "_.-/"


def _token_at(text: str, at: int) -> tuple[int, int] | None:
    """The run of name characters around `at`, or None when longer than a name can be."""
    start = at
    while start > 0 and _name_char(text[start - 1]) and not _escape_before(text, start):
        start -= 1
        if at - start > _NAME_MAX:
            return None
    end = at
    while end < len(text) and _name_char(text[end]):
        end += 1
        if end - start > _NAME_MAX:
            return None
    return start, end


def _quote_before(text: str, at: int) -> str:
    if text.endswith('\\"', 0, at):
        return '\\"'
    return text[at - 1] if at and text[at - 1] in "\"'" else ""


class _NameScan:
    """One pass over the places a credential's name may be (see _TRIGGERS)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = _Lines(text, escaped=False)
        self.edits: list[_Edit] = []

    def flag(self, start: int, end: int) -> int:
        """`--name VALUE` / `--name=VALUE` / `-name VALUE`: where the scan goes on."""
        text = self.text
        dashes = 2 if text.startswith("--", start) else 1
        name = text[start + dashes : end]
        if dashes > 2 or not name[:1].isascii() or not name[:1].isalpha():
            return end
        sep = _FLAG_SEPARATOR.match(text, end)
        if sep is None or not secret_named(name):
            return end
        if sep.group() != "=" and text.startswith(("-", "\\n", "\\r"), sep.end()):
            return end  # the next flag, or the end of the line: a flag without a value
        where = _value(text, sep.end(), self.lines, bare=_BARE_ARG, key_start=start)
        if where is None or not _redactable(text, *where):
            return end
        self.edits.append((*where, REDACTED, "argument"))
        return where[1]

    def key(self, start: int, end: int) -> int:
        """`name: value`, `name=value`, `"name": "value"`, or an env var name after `name:`."""
        text = self.text
        quote = _quote_before(text, start)
        after = end + len(quote) if quote and text.startswith(quote, end) else end
        sep = _SEPARATOR.match(text, after)
        name = text[start:end]
        if sep is None:
            return self.env_entry(start, end)
        if name.lower() in _HEADER_NAMES or not secret_named(name):
            return end
        key_start = start - len(quote)
        where = _value(text, sep.end(), self.lines, bare=_BARE, key_start=key_start)
        if where is None or not _redactable(text, *where):
            return end
        self.edits.append((*where, REDACTED, "named-value"))
        return where[1]

    def env_entry(self, start: int, end: int) -> int:
        """`{name: NGC_API_KEY, value: v}` in YAML, JSON or Go: the value after the name."""
        text = self.text
        before = _NAME_KEY_BEFORE.search(text, max(0, start - 40), start)
        if before is None or not secret_named(text[start:end]):
            return end
        stop = min(len(text), end + _ENV_PAIR)
        value = _VALUE_KEY.search(text, end, stop)
        if value is None or _NAME_KEY.search(text, end, value.start()):
            return end  # no value (valueFrom), or it is the next entry's
        where = _value(text, value.end(), self.lines, bare=_BARE, key_start=value.start())
        if where is not None and _redactable(text, *where):
            self.edits.append((*where, REDACTED, "named-value"))
        return end


def _names(text: str, counts: Counts) -> str:
    """Values under a credential's name: flags, `key: value` pairs in any syntax, YAML blocks
    under the key, env entries."""
    scan = _NameScan(text)
    done = 0
    for at in _find_all(text.translate(_ASCII_LOWER), _TRIGGERS):
        if at < done or (token := _token_at(text, at)) is None:
            continue
        start, end = token
        if text.startswith("-", start):
            done = scan.flag(start, end)
        elif text[start].isalpha() or text[start] in "_.":
            done = scan.key(start, end)
        else:
            done = end
    return _apply(text, scan.edits, counts)


def _redact(text: str, counts: Counts, depth: int = 0) -> str:
    text = _private_keys(text, counts)
    text = _urls(text, counts)
    text = _headers(text, counts)
    text = _shapes(text, counts)
    text = _bearer(text, counts)
    text = _encoded(text, counts, depth)
    text = _query(text, counts)
    return _names(text, counts)


# Strings of API objects repeat (images, commands, env of 20,000 pods): each is scanned once.
_CACHED = 4096  # longest string cached


@functools.lru_cache(maxsize=65536)
def _redact_cached(text: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    counts: Counts = Counter()
    out = _redact(text, counts)
    return out, tuple(counts.items())


def redact_text(text: str) -> tuple[str, Counts]:
    """`text` with every credential found by shape or by name replaced by REDACTED, and how many
    of each kind (see KINDS)."""
    if len(text) <= _CACHED:
        out, items = _redact_cached(text)
        return out, Counter(dict(items))
    counts: Counts = Counter()
    return _redact(text, counts), counts


# ----------------------------------------------------------------------------- objects

# Metadata nobody reads in a bug report and that may carry a whole object with its values.
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


_FLAG_ALONE = re.compile(r"--?([A-Za-z][\w.\-]{0,63})")


def flag_name(arg: str) -> str | None:
    """The name of a command-line flag without a value (`--password` -> `password`), else None."""
    match = _FLAG_ALONE.fullmatch(arg)
    return match.group(1) if match else None


def _scalar_value(value: Any) -> bool:
    """A value to redact under a credential's name: a string that is no placeholder, a number."""
    if isinstance(value, str):
        return not placeholder(value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _walk(obj: Any, counts: Counts) -> Any:
    if isinstance(obj, str):
        text, found = redact_text(obj)
        counts.update(found)
        return text
    if isinstance(obj, list):
        items: list[Any] = []
        secret_flag = False  # the previous item was `--password`: this one is its value
        for item in obj:
            if (
                secret_flag
                and isinstance(item, str)
                and not item.startswith("-")
                and _scalar_value(item)
            ):
                items.append(REDACTED)
                counts["argument"] += 1
                secret_flag = False
                continue
            name = flag_name(item) if isinstance(item, str) else None
            secret_flag = name is not None and secret_named(name)
            items.append(_walk(item, counts))
        return items
    if not isinstance(obj, dict):
        return obj
    secret_object = obj.get("kind") == "Secret" and obj.get("apiVersion") == "v1"
    # An env entry (or any name/value pair) whose name is a credential's: {name: X_TOKEN, value: v}.
    named = obj.get("name")
    pair_secret = "value" in obj and isinstance(named, str) and secret_named(named)
    out: dict[Any, Any] = {}
    for key, value in obj.items():
        if key == "managedFields":
            continue
        if key == "annotations" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in DROPPED_ANNOTATIONS}
        if secret_object and key in ("data", "stringData") and isinstance(value, dict):
            out[key] = dict.fromkeys(value, REDACTED)
            counts["secret-data"] += len(value)
            continue
        by_name = (key == "value" and pair_secret) or (isinstance(key, str) and secret_named(key))
        if by_name and _scalar_value(value):
            out[key] = REDACTED
            counts["named-value"] += 1
            continue
        out[key] = _walk(value, counts)
    return out


def redact_value(obj: Any) -> tuple[Any, Counts]:
    """A copy of an API object (or any JSON-like value) without managedFields, last-applied
    annotations, Secret data and credentials: values under a credential's name (env vars,
    fields, annotation keys, the value after a `--password` item in args), and every string
    through `redact_text`. The counts are per kind (see KINDS)."""
    counts: Counts = Counter()
    return _walk(obj, counts), counts
