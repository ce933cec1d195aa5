"""The runtime-config guard: the node's original runtime config kept and put back byte for byte
around a toolkit that is not ours (NVIDIA's rewrites the config in place and cannot bring back the
original; on AKS its uninstall leaves the node's containerd config changed).

It runs in the toolkit pod with the toolkit's environment (the same `Settings`): `save`, an init
container, copies every runtime file the toolkit may write (config, drop-in, CRI-O hook) into
`RUNTIME_CONFIG_BACKUP_DIR` (`<ROOT>/runtime-config-guard`) before the toolkit starts, unless a
copy is already there (an earlier pod that did not get to restore: that copy is the original);
`watch`, a native sidecar that Kubernetes stops after the toolkit container, restores on SIGTERM.

Restore, per file: when the file differs from its original only by what NVIDIA's toolkit writes
(runtimes named `nvidia*`, the default runtime, CDI switches, `imports`, a `version` the original
did not have; formatting and comments do not count, since the toolkit re-serialises the file), the
original bytes go back (a file that did not exist is removed). A file someone else changed too is
left alone, and its original stays in the backup directory for a person to decide (a Warning
Event says so). The backup is forgotten once everything is restored.
"""

from __future__ import annotations

import json
import logging
import tomllib
from dataclasses import dataclass, field
from typing import Any

from gpu_operator.agents.container_toolkit import backup, configure, edits, hostfile, runner
from gpu_operator.agents.container_toolkit.settings import Settings

log = logging.getLogger("gpu_operator.agents.container_toolkit.guard")

DIR_NAME = "runtime-config-guard"
# Keys NVIDIA's toolkit sets (containerd, CRI-O, Docker spellings), wherever they are.
NVIDIA_KEYS = frozenset(
    {
        "default_runtime_name",
        "default_runtime",
        "default-runtime",
        "enable_cdi",
        "cdi_spec_dirs",
        "imports",
    }
)


def _roles(s: Settings) -> list[str]:
    roles = [edits.CONFIG]
    if s.drop_in and s.runtime != "docker":
        roles.append(edits.DROP_IN)
    if s.runtime == "crio":
        roles.append(edits.HOOK)
    return roles


def files_of(s: Settings, view: runner.View) -> configure.RuntimeFiles:
    """The runtime files the toolkit may write, as this process sees them."""
    every = runner.runtime_files(s, view)
    return configure.RuntimeFiles(
        {r: every.files[r] for r in _roles(s) if r in every.files}, every.mounts.mounts
    )


def store_of(s: Settings, view: runner.View) -> backup.Store:
    return backup.Store(view(s.backup_dir), s.backup_dir)


def save(s: Settings, view: runner.View) -> list[str]:
    """Copy the runtime files (unless a copy is kept already); what was done, as sentences. The
    guard never stands in the toolkit's way: a copy that cannot be made is reported, not fatal."""
    try:
        return _save(s, view)
    except (OSError, hostfile.IoFailure, edits.EditError, backup.BackupError) as err:
        return [f"cannot save the runtime config ({err}): the toolkit runs without the guard"]


def _save(s: Settings, view: runner.View) -> list[str]:
    store = store_of(s, view)
    state = store.load()
    if state is not None:
        return [
            f"kept the original runtime config saved in {store.name} at {state.saved_at}: the "
            "pod before this one did not restore it"
        ]
    files = files_of(s, view)
    current = files.read()
    state = backup.State(s.runtime)
    said = []
    for role, data in current.items():
        store.save_original(role, data)
        state.files[role] = files.record(role, data)
        said.append(
            f"saved {files.name(role)} ({backup.digest(data)})"
            if data is not None
            else f"noted that {files.name(role)} does not exist"
        )
    store.save(state)
    return [*said, f"in {store.name}"]


def _parse(runtime: str, role: str, data: bytes | None) -> Any:
    if data is None:
        return {}
    text = data.decode()
    if role == edits.HOOK or runtime == "docker":
        return json.loads(text) if text.strip() else {}
    return tomllib.loads(text)


def _strip(value: Any, *, top: bool, keep_version: bool) -> Any:
    """`value` without what NVIDIA's toolkit writes (see the module docstring); empty tables go."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in NVIDIA_KEYS or (top and key == "version" and not keep_version):
                continue
            if key == "runtimes" and isinstance(item, dict):
                item = {k: v for k, v in item.items() if not str(k).startswith("nvidia")}
            if key == "features" and isinstance(item, dict):  # Docker's {"cdi": true}
                item = {k: v for k, v in item.items() if k != "cdi"}
            stripped = _strip(item, top=False, keep_version=keep_version)
            if stripped == {} and isinstance(item, dict):
                continue
            out[key] = stripped
        return out
    if isinstance(value, list):
        return [_strip(v, top=False, keep_version=keep_version) for v in value]
    return value


def equivalent(runtime: str, role: str, now: bytes | None, original: bytes | None) -> bool:
    """Whether `now` differs from `original` only by NVIDIA's toolkit's settings."""
    if role in (edits.DROP_IN, edits.HOOK) and original is None:
        return True  # a file the toolkit created: its own
    try:
        a, b = _parse(runtime, role, now), _parse(runtime, role, original)
    except (ValueError, UnicodeDecodeError):
        return False
    keep = isinstance(b, dict) and "version" in b
    return bool(_strip(a, top=True, keep_version=keep) == _strip(b, top=True, keep_version=keep))


@dataclass
class Restored:
    exact: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.exact)


def restore(s: Settings, view: runner.View) -> Restored:
    """Put the saved originals back where only the toolkit changed them (module docstring); a
    failure is reported in `kept` and leaves the copy in place."""
    out = Restored()
    try:
        _restore(s, view, out)
    except (OSError, hostfile.IoFailure, edits.EditError, backup.BackupError) as err:
        out.kept.append(f"cannot restore the runtime config: {err}")
    return out


def _restore(s: Settings, view: runner.View, out: Restored) -> None:
    store = store_of(s, view)
    state = store.load()
    if state is None:
        return
    files = files_of(s, view)
    current = files.read()
    for role, record in state.files.items():
        if role not in files.files:
            continue
        name = files.name(role)
        original = store.original(role)
        if backup.digest(original) != record.original:
            out.kept.append(
                f"{name}: the saved original in {store.name} is missing or damaged: left as it is"
            )
            continue
        now = current.get(role)
        if now == original:
            continue
        if not equivalent(s.runtime, role, now, original):
            out.kept.append(
                f"{name} was changed by more than the NVIDIA toolkit's settings: left as it is; "
                f"the original is {store.name}/{role}.orig"
            )
            continue
        files.put_back(role, original, record)
        out.exact.append(
            f"restored {name} byte for byte ({record.original})"
            if original is not None
            else f"removed {name} (it did not exist before the toolkit)"
        )
    if not out.kept:
        store.clear()
