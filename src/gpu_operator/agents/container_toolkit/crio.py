"""CRI-O: the NVIDIA runtime handlers in a drop-in, or the OCI hook (pure).

Config mode (`CRIO_CONFIG_MODE=config`): our drop-in (e.g. `/etc/crio/crio.conf.d/99-nvidia.conf`)
gets `crio.runtime.runtimes.<name>` with the options of CRI-O's default runtime (else runc, else
crun) from the top-level config, `runtime_path` and `runtime_type = "oci"`, and
`crio.runtime.default_runtime` only with set-as-default. CRI-O reads its drop-in directory on its
own and merges keys, so the top-level file is only read, never written; CDI needs no switch.
Hook mode (`hook`, upstream's deprecated mode): the OCI hook file that runs
`nvidia-container-runtime-hook prestart` for every container.
"""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.container_toolkit import edits, runtimes
from gpu_operator.agents.container_toolkit import tomltext as tt
from gpu_operator.agents.container_toolkit.edits import (
    CONFIG,
    DROP_IN,
    HOOK,
    SOURCE,
    Edit,
    EditError,
)

HOOK_BINARY = "nvidia-container-runtime-hook"
HOOK_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DROP_IN_HEADER = (
    "# Written by the GPU operator's toolkit agent (nvidia-container-toolkit); it is removed\n"
    "# when the toolkit is uninstalled.\n"
)


@dataclass(frozen=True)
class Options:
    handlers: tuple[runtimes.Handler, ...]
    mode: str = "config"  # config | hook
    config: str = "/etc/crio/crio.conf"
    drop_in: str = "/etc/crio/crio.conf.d/99-nvidia.conf"
    hook: str = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
    # The toolkit's directory on the host (`<root>/toolkit`), where the hook binary is.
    runtime_dir: str = "/usr/local/nvidia/toolkit"


def hook_spec(executable: str) -> dict[str, Any]:
    """The OCI hook (podman/CRI-O hooks.d format, version 1.0.0) running the NVIDIA hook."""
    folder = posixpath.dirname(executable)
    dirs = list(HOOK_PATH_DIRS) + ([folder] if folder not in HOOK_PATH_DIRS else [])
    return {
        "version": "1.0.0",
        "hook": {
            "path": executable,
            "args": [posixpath.basename(executable), "prestart"],
            "env": ["PATH=" + ":".join(dirs)],
        },
        "when": {"always": True, "commands": [".*"]},
        "stages": ["prestart"],
    }


class Crio:
    """The CRI-O editor (see the module docstring)."""

    def __init__(self, options: Options) -> None:
        if options.mode not in ("config", "hook"):
            raise EditError(f"CRIO_CONFIG_MODE: expected config or hook, not {options.mode!r}")
        self.o = options

    @property
    def roles(self) -> tuple[str, ...]:
        return (HOOK,) if self.o.mode == "hook" else (DROP_IN,)

    def names(self) -> dict[str, str]:
        return {HOOK: self.o.hook} if self.o.mode == "hook" else {DROP_IN: self.o.drop_in}

    def prior(self, files: edits.Files) -> dict[str, Any]:
        return {}

    def apply(self, files: edits.Files, prior: Mapping[str, Any]) -> Edit:
        if self.o.mode == "hook":
            executable = posixpath.join(self.o.runtime_dir, HOOK_BINARY)
            body = (json.dumps(hook_spec(executable), indent=2) + "\n").encode()
            wrote = () if files.get(HOOK) == body else (f"wrote the OCI hook {self.o.hook}",)
            return Edit({HOOK: body}, wrote, f"OCI hook {self.o.hook} (CRIO_CONFIG_MODE=hook)")
        source_role = SOURCE if files.get(SOURCE) is not None else CONFIG
        try:
            data = tt.parse(edits.decode(files.get(source_role), self.o.config), self.o.config)
        except tt.TomlTextError as err:
            raise EditError(str(err)) from None
        found = tt.lookup(data, ("crio", "runtime"))
        runtime: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        listed = runtime.get("runtimes")
        existing: Mapping[str, Any] = listed if isinstance(listed, Mapping) else {}
        default = runtime.get("default_runtime")
        ours: dict[str, Any] = {}
        chosen = next((h.name for h in self.o.handlers if h.default), None)
        if chosen is not None:
            ours["default_runtime"] = chosen
        tables: dict[str, Any] = {}
        for h in self.o.handlers:
            table: dict[str, Any] = {}
            for name in runtimes.copy_candidates(default if isinstance(default, str) else None):
                if isinstance(existing.get(name), Mapping):
                    table = copy.deepcopy(dict(existing[name]))
                    break
            table["runtime_path"] = h.binary
            table["runtime_type"] = "oci"
            tables[h.name] = table
        ours["runtimes"] = tables
        body = (DROP_IN_HEADER + "\n" + tt.dumps({"crio": {"runtime": ours}})).encode()
        changes: list[str] = []
        if files.get(DROP_IN) != body:
            verb = "wrote" if files.get(DROP_IN) is None else "rewrote (its content differed)"
            handlers = ", ".join(f"{h.name} -> {h.binary}" for h in self.o.handlers)
            changes.append(f"{verb} {self.o.drop_in}: runtime handlers {handlers}")
            if chosen is not None:
                changes.append(f"made {chosen} CRI-O's default runtime")
        return Edit({DROP_IN: body}, tuple(changes), f"drop-in {self.o.drop_in}")

    def revert(self, files: edits.Files, prior: Mapping[str, Any]) -> dict[str, bytes | None]:
        return dict.fromkeys(self.roles)
