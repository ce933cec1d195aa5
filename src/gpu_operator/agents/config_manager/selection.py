"""Which named config a node gets: the label, else the default, else the fallback strategies.

Pure: the available names come in, a `Selection` or a `SelectionError` with a message a user can
act on comes out (upstream's wording, plus what is available and where the name came from).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NAMED = "named"
SINGLE = "single"
EMPTY = "empty"
FALLBACKS = (NAMED, SINGLE, EMPTY)
# The config the `named` fallback looks for.
NAMED_FALLBACK_CONFIG = "default"


class SelectionError(ValueError):
    """No config can be chosen; the message says why and what is available."""


@dataclass(frozen=True)
class Selection:
    """The chosen config (`None`: the empty config, `/dev/null`) and why it was chosen."""

    name: str | None
    reason: str

    @property
    def display(self) -> str:
        return "the empty config" if self.name is None else f"config {self.name!r}"


def config_names(entries: Iterable[tuple[str, bool]]) -> list[str]:
    """Config names from directory entries `(name, is_dir)`: files only, without the `..*`
    entries of a mounted ConfigMap (its timestamped directory and `..data` link)."""
    return sorted(name for name, is_dir in entries if not is_dir and not name.startswith(".."))


def parse_fallbacks(text: str) -> list[str]:
    """`FALLBACK_STRATEGIES`: a comma-separated list of named, single and empty."""
    strategies = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [s for s in strategies if s not in FALLBACKS]
    if unknown:
        raise SelectionError(
            f"FALLBACK_STRATEGIES: unknown fallback strategy {unknown[0]!r} "
            f"(expected a comma-separated list of {', '.join(FALLBACKS)})"
        )
    return strategies


def _available(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def select(
    label_value: str | None,
    names: Sequence[str],
    *,
    label: str,
    default: str = "",
    fallbacks: Sequence[str] = (),
    source: str = "the config directory",
) -> Selection:
    """Choose a config: the node label's value, else `default`, else the first fallback that
    applies (`named`: a config called "default", `single`: the only config, `empty`: none)."""
    if not names:
        # As upstream: with nothing to choose from even the empty fallback is refused, since an
        # empty ConfigMap is almost certainly a mistake.
        raise SelectionError(f"no configuration files available in {source}")
    if label_value:
        if label_value not in names:
            raise SelectionError(
                f"node label {label}={label_value} names a config that does not exist in "
                f"{source} (available: {_available(names)})"
            )
        return Selection(label_value, f"node label {label}={label_value}")
    if default:
        if default not in names:
            raise SelectionError(
                f"DEFAULT_CONFIG {default!r} names a config that does not exist in {source} "
                f"(available: {_available(names)})"
            )
        return Selection(default, f"no {label} label; DEFAULT_CONFIG")
    for strategy in fallbacks:
        if strategy == NAMED and NAMED_FALLBACK_CONFIG in names:
            return Selection(NAMED_FALLBACK_CONFIG, f"no {label} label; fallback {NAMED}")
        if strategy == SINGLE and len(names) == 1:
            return Selection(names[0], f"no {label} label; fallback {SINGLE}")
        if strategy == EMPTY:
            return Selection(None, f"no {label} label; fallback {EMPTY}")
    tried = ", ".join(fallbacks) or "none configured"
    raise SelectionError(
        f"no {label} label, no DEFAULT_CONFIG, and no fallback strategy applies "
        f"(tried: {tried}; available: {_available(names)})"
    )
