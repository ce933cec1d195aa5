"""Docker's `daemon.json`: the NVIDIA runtimes, the default runtime, CDI (pure).

`runtimes.<name> = {"path": <binary>, "args": []}`, `default-runtime` only with set-as-default,
`features.cdi = true` when CDI is on. JSON keeps no comments, so what we replace is remembered
with the backup (`prior`) and the file is rewritten (4-space indent, as upstream) only when its
meaning changes; every key we do not own keeps its value.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.container_toolkit import edits, runtimes
from gpu_operator.agents.container_toolkit.edits import CONFIG, Edit, EditError

ABSENT = "<absent>"


@dataclass(frozen=True)
class Options:
    handlers: tuple[runtimes.Handler, ...]
    enable_cdi: bool = False
    config: str = "/etc/docker/daemon.json"


class Docker:
    """The Docker editor (see the module docstring)."""

    def __init__(self, options: Options) -> None:
        self.o = options

    @property
    def roles(self) -> tuple[str, ...]:
        return (CONFIG,)

    def names(self) -> dict[str, str]:
        return {CONFIG: self.o.config}

    def _load(self, data: bytes | None) -> dict[str, Any]:
        text = edits.decode(data, self.o.config)
        if not text.strip():
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise EditError(f"{self.o.config}: not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise EditError(f"{self.o.config}: expected a JSON object at the top level")
        for key, kind in (("runtimes", dict), ("features", dict), ("default-runtime", str)):
            if key in value and not isinstance(value[key], kind):
                raise EditError(f"{self.o.config}: {key!r} must be a {kind.__name__}")
        return value

    @staticmethod
    def _dump(value: Mapping[str, Any]) -> bytes:
        return (json.dumps(value, indent=4) + "\n").encode()

    def prior(self, files: edits.Files) -> dict[str, Any]:
        value = self._load(files.get(CONFIG))
        current = value.get("runtimes") or {}
        return {
            "default-runtime": value.get("default-runtime", ABSENT),
            "features.cdi": (value.get("features") or {}).get("cdi", ABSENT),
            "runtimes": {h.name: current[h.name] for h in self.o.handlers if h.name in current},
        }

    def apply(self, files: edits.Files, prior: Mapping[str, Any]) -> Edit:
        value = self._load(files.get(CONFIG))
        new = copy.deepcopy(value)
        table = new.setdefault("runtimes", {})
        changes: list[str] = []
        for h in self.o.handlers:
            entry = {"path": h.binary, "args": []}
            if table.get(h.name) != entry:
                changes.append(
                    f"{'added' if h.name not in table else 'restored'} runtime "
                    f"{h.name} ({h.binary})"
                )
                table[h.name] = entry
        chosen = next((h.name for h in self.o.handlers if h.default), None)
        if chosen is not None and new.get("default-runtime") != chosen:
            new["default-runtime"] = chosen
            changes.append(f"made {chosen} the default runtime")
        if self.o.enable_cdi and (new.get("features") or {}).get("cdi") is not True:
            new.setdefault("features", {})["cdi"] = True
            changes.append("enabled CDI (features.cdi = true)")
        body = files.get(CONFIG) if new == value else self._dump(new)
        return Edit({CONFIG: body}, tuple(changes), f"{self.o.config}")

    def revert(self, files: edits.Files, prior: Mapping[str, Any]) -> dict[str, bytes | None]:
        value = self._load(files.get(CONFIG))
        new = copy.deepcopy(value)
        ours = {h.name: h.binary for h in self.o.handlers}
        table = new.get("runtimes") or {}
        before = dict(prior.get("runtimes") or {})
        for name, binary in ours.items():
            if (table.get(name) or {}).get("path") == binary:
                if name in before:
                    table[name] = before[name]
                else:
                    table.pop(name, None)
        if "runtimes" in new and not table:
            del new["runtimes"]
        if new.get("default-runtime") in ours:
            was = prior.get("default-runtime", ABSENT)
            if was == ABSENT:
                del new["default-runtime"]
            else:
                new["default-runtime"] = was
        if "features.cdi" in prior and isinstance(new.get("features"), dict):
            was = prior["features.cdi"]
            if was == ABSENT:
                new["features"].pop("cdi", None)
                if not new["features"]:
                    del new["features"]
            else:
                new["features"]["cdi"] = was
        if new == value:
            return {CONFIG: files.get(CONFIG)}
        return {CONFIG: self._dump(new) if new else None}
