"""The runtime handlers the toolkit adds, as upstream names them (pure).

`nvidia` -> `<root>/toolkit/nvidia-container-runtime` (the name comes from NVIDIA_RUNTIME_NAME or
CONTAINERD_RUNTIME_CLASS), plus one handler per mode: `nvidia-cdi` -> `...runtime.cdi` and
`nvidia-legacy` -> `...runtime.legacy`. A main name equal to a mode handler's name falls back to
`nvidia`. With set-as-default only the handler named by the main name becomes the default.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

DEFAULT_NAME = "nvidia"
RUNTIME_BINARY = "nvidia-container-runtime"
MODES = ("cdi", "legacy")
# Low-level runtimes whose options a new handler copies, after the config's own default.
LOW_LEVEL = ("runc", "crun")


@dataclass(frozen=True)
class Handler:
    """One runtime handler: the name a RuntimeClass uses and the binary it runs."""

    name: str
    binary: str
    default: bool = False


def handlers(
    runtime_dir: str, name: str = DEFAULT_NAME, set_as_default: bool = False
) -> tuple[Handler, ...]:
    """The three handlers for a toolkit installed in `runtime_dir` (`<root>/toolkit`)."""
    name = name or DEFAULT_NAME
    main = DEFAULT_NAME if name in {f"nvidia-{m}" for m in MODES} else name
    out = [
        Handler(main, posixpath.join(runtime_dir, RUNTIME_BINARY), set_as_default and main == name)
    ]
    for mode in MODES:
        handler = f"nvidia-{mode}"
        out.append(
            Handler(
                handler,
                posixpath.join(runtime_dir, f"{RUNTIME_BINARY}.{mode}"),
                set_as_default and handler == name,
            )
        )
    return tuple(out)


def copy_candidates(default_runtime: str | None) -> tuple[str, ...]:
    """Which existing runtimes a new handler copies its options from, in order: the config's
    default (unless it is an NVIDIA one), then runc, then crun."""
    first = (
        (default_runtime,) if default_runtime and not default_runtime.startswith("nvidia") else ()
    )
    return (*first, *LOW_LEVEL)
