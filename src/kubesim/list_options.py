"""List and watch options as the real server reads them: WatchList defaulting and validation.

With the WatchList feature (on by default since Kubernetes 1.34), a watch without
`sendInitialEvents` and without `resourceVersionMatch` whose resourceVersion is "" or "0" is
defaulted to `sendInitialEvents=true&resourceVersionMatch=NotOlderThan`; the option rules are then
checked, and a violation is a 422 `ListOptions.meta.k8s.io "" is invalid` Status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubesim import errors
from kubesim.validation import field

if TYPE_CHECKING:
    from kubesim.store import Event, Store

NOT_OLDER_THAN = "NotOlderThan"
EXACT = "Exact"
# The bookmark that ends a watch-list stream's initial events carries this annotation.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class ListOptions:
    """The options of a list or watch request that decide what it starts from."""

    watch: bool
    resource_version: str
    resource_version_match: str
    send_initial_events: bool | None
    allow_bookmarks: bool
    continue_token: str

    @property
    def watch_list(self) -> bool:
        """A watch that streams the current state, then the end-of-initial-events bookmark."""
        # The real cacher sends the annotated bookmark only to watches that asked for bookmarks.
        return bool(self.send_initial_events) and self.allow_bookmarks


def _flag(query: Mapping[str, str], name: str) -> bool | None:
    raw = query.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("true", "1", "t"):
        return True
    if value in ("false", "0", "f", ""):
        return False
    raise errors.bad_request(f'strconv.ParseBool: parsing "{raw}": invalid syntax')


def parse(query: Mapping[str, str], *, watch: bool) -> ListOptions:
    """Read, default and validate list/watch options; raises the real server's errors."""
    options = ListOptions(
        watch=watch,
        resource_version=query.get("resourceVersion", ""),
        resource_version_match=query.get("resourceVersionMatch", ""),
        send_initial_events=_flag(query, "sendInitialEvents"),
        allow_bookmarks=bool(_flag(query, "allowWatchBookmarks")),
        continue_token=query.get("continue", ""),
    )
    options = _defaulted(options)
    problems = _watch_errors(options) if watch else _list_errors(options)
    if problems:
        field.raise_invalid("ListOptions", "meta.k8s.io", "", problems)
    return options


def _defaulted(options: ListOptions) -> ListOptions:
    if options.send_initial_events is not None or options.resource_version_match:
        return options
    if options.watch and options.resource_version in ("", "0"):
        return ListOptions(
            watch=True,
            resource_version=options.resource_version,
            resource_version_match=NOT_OLDER_THAN,
            send_initial_events=True,
            allow_bookmarks=options.allow_bookmarks,
            continue_token=options.continue_token,
        )
    return options


def _watch_errors(options: ListOptions) -> list[field.FieldError]:
    problems: list[field.FieldError] = []
    match = options.resource_version_match
    if options.send_initial_events is not None and match != NOT_OLDER_THAN:
        problems.append(
            field.forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )
        )
    if match:
        if options.send_initial_events is None:
            problems.append(
                field.forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                    "is provided",
                )
            )
        if match != NOT_OLDER_THAN:
            problems.append(field.not_supported("resourceVersionMatch", match, [NOT_OLDER_THAN]))
        if options.continue_token:
            problems.append(
                field.forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            )
    return problems


def _list_errors(options: ListOptions) -> list[field.FieldError]:
    problems: list[field.FieldError] = []
    match = options.resource_version_match
    if match:
        if not options.resource_version:
            problems.append(
                field.forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if options.continue_token:
            problems.append(
                field.forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            )
        if match not in (EXACT, NOT_OLDER_THAN):
            problems.append(
                field.not_supported("resourceVersionMatch", match, [EXACT, NOT_OLDER_THAN, ""])
            )
        if match == EXACT and options.resource_version == "0":
            problems.append(
                field.forbidden(
                    "resourceVersionMatch",
                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
    if options.send_initial_events is not None:
        problems.append(
            field.forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list")
        )
    return problems


# How long the real cacher waits for a watch-list's resourceVersion to be reached.
FRESHNESS_TIMEOUT = 3.0


async def wait_for_resource_version(store: Store, wanted: int) -> None:
    """Wait until the store has reached `wanted`, or fail like the real cacher after 3 s."""
    if store.resource_version >= wanted:
        return
    reached = asyncio.Event()

    def check(_event: Event) -> None:
        if store.resource_version >= wanted:
            reached.set()

    unsubscribe = store.subscribe(check)
    try:
        await asyncio.wait_for(reached.wait(), FRESHNESS_TIMEOUT)
    except TimeoutError:
        raise errors.ApiError(
            504,
            f"Too large resource version: {wanted}, current: {store.resource_version}",
            reason="Timeout",
            details={
                "causes": [
                    {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                ],
                "retryAfterSeconds": 1,
            },
        ) from None
    finally:
        unsubscribe()
