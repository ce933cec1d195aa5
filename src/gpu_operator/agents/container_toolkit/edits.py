"""What every runtime editor takes and returns (pure).

An editor reads the runtime's files by role (`config`: the top-level config, `drop-in`: our
drop-in file, `hook`: the CRI-O OCI hook, `source`: where to read the current settings from, when
not the config itself), each as bytes or None when absent, and answers with the files as they must
be and sentences saying what changed. `revert` removes only what is ours. Editors never touch a
section they do not own; where a file holds nothing but ours, reverting deletes it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Files = Mapping[str, bytes | None]

CONFIG = "config"
DROP_IN = "drop-in"
HOOK = "hook"
SOURCE = "source"


class EditError(ValueError):
    """A runtime config the toolkit cannot edit safely (names the file and the reason)."""


@dataclass(frozen=True)
class Edit:
    """The files as they must be (by role; None: absent) and what changed, in sentences."""

    files: dict[str, bytes | None]
    changes: tuple[str, ...] = ()
    # How the runtime is configured, for the log (e.g. "config version 3, drop-in imported").
    summary: str = ""
    # Things the user should know that are not changes (e.g. settings left to k3s).
    notes: tuple[str, ...] = field(default=())


class Editor(Protocol):
    """A runtime's editor: which files it writes, and apply/revert over them."""

    @property
    def roles(self) -> tuple[str, ...]:
        """The files this editor may write (never `source`)."""
        ...

    def names(self) -> Mapping[str, str]:
        """Each role's file as the node knows it (host paths, for messages)."""
        ...

    def apply(self, files: Files, prior: Mapping[str, Any]) -> Edit:
        """Our settings on top of whatever the files hold now (idempotent)."""
        ...

    def revert(self, files: Files, prior: Mapping[str, Any]) -> dict[str, bytes | None]:
        """The files with only our settings removed (`prior`: what we replaced, see `prior`)."""
        ...

    def prior(self, files: Files) -> dict[str, Any]:
        """What the original files held where we write (kept with the backup; JSON-able)."""
        ...


def decode(data: bytes | None, name: str) -> str:
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise EditError(f"{name}: not UTF-8 text ({err})") from None


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """Cyclic garbage collection paused while a big config becomes statements or a tree: the
    collector would walk every object made so far again and again (the cost then grows faster
    than the file), and these objects hold no cycles (reference counting frees them)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
