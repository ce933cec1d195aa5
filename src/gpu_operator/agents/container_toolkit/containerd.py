"""containerd's config: the NVIDIA runtime handlers, the default runtime, CDI (pure).

Config versions name the CRI plugin differently: 1 `cri`, 2 `io.containerd.grpc.v1.cri`,
3 `io.containerd.cri.v1.runtime`. Each handler goes under `plugins.<cri>.containerd.runtimes.<name>`
with the options of the config's default runtime (else runc, else crun) and `options.BinaryName`
(version 1 also `options.Runtime`); `default_runtime_name` only with set-as-default; `enable_cdi`
on the CRI plugin when CDI is on.

Where the settings go:
- versions 2 and 3 with a drop-in path: our own file (e.g. `/etc/containerd/conf.d/99-nvidia.toml`)
  and one entry in the top-level `imports`. containerd 1.x (config version 2) replaces a plugin's
  whole section with an imported one, so for version 2 the drop-in carries a copy of the CRI
  plugin section (re-copied whenever the top-level one changes); containerd 2.x merges imported
  sections deeply, so for version 3 the drop-in holds only our settings.
- version 1, k3s/RKE2 templates (`config.toml.tmpl`, Go template lines kept as they are), or no
  drop-in path: in place, as a marked block at the end plus marked lines (see `tomltext`).
  In a template the base template owns the CRI table: only the handler tables are added.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_operator.agents.container_toolkit import edits, runtimes
from gpu_operator.agents.container_toolkit import tomltext as tt
from gpu_operator.agents.container_toolkit.edits import CONFIG, DROP_IN, SOURCE, Edit, EditError

CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# containerd's own default when there is no config (upstream writes version 2 then).
DEFAULT_VERSION = 2
DEFAULT_RUNTIME_TYPE = "io.containerd.runc.v2"
DROP_IN_HEADER = (
    "# Written by the GPU operator's toolkit agent (nvidia-container-toolkit); it is removed\n"
    "# when the toolkit is uninstalled. Edit the top-level config instead.\n"
)
V2_COPY_NOTE = (
    "# containerd 1.x replaces a plugin's whole section with an imported one: the CRI plugin\n"
    "# section of the top-level config is copied here (and re-copied when it changes).\n"
)


@dataclass(frozen=True)
class Options:
    """What to configure and where (host paths are as the node sees them)."""

    handlers: tuple[runtimes.Handler, ...]
    enable_cdi: bool = False
    runtime_type: str = DEFAULT_RUNTIME_TYPE
    annotation_prefixes: tuple[str, ...] = ()
    # The drop-in's path on the host (its directory is what `imports` names); None: in place.
    drop_in: str | None = None
    config: str = "/etc/containerd/config.toml"
    source: str | None = None


def is_template(name: str, text: str) -> bool:
    return name.endswith(".tmpl") or any(tt.is_template_line(line) for line in text.splitlines())


def detect_version(data: Mapping[str, Any], text: str, name: str, template: bool) -> int:
    """The config version: its `version`, else what its CRI plugin key says, else containerd's
    rule (a config without `version` is version 1; no config at all gets version 2)."""
    version = data.get("version")
    if version is not None:
        if not isinstance(version, int) or isinstance(version, bool) or version not in CRI_PLUGIN:
            raise EditError(f"{name}: version must be 1, 2 or 3, not {version!r}")
        return version
    plugins = data.get("plugins")
    if isinstance(plugins, Mapping):
        for v in (3, 2, 1):
            if CRI_PLUGIN[v] in plugins:
                return v
    if template:
        return 3 if posixpath.basename(name).startswith("config-v3") else DEFAULT_VERSION
    return 1 if text.strip() else DEFAULT_VERSION


def _mapping(value: Any) -> dict[str, Any]:
    return copy.deepcopy(dict(value)) if isinstance(value, Mapping) else {}


def handler_table(
    handler: runtimes.Handler,
    existing: Mapping[str, Any],
    default: str | None,
    o: Options,
    version: int,
) -> dict[str, Any]:
    """A handler's table: a copy of the runtime it is modelled on, with our binary."""
    table: dict[str, Any] = {}
    for name in runtimes.copy_candidates(default):
        if isinstance(existing.get(name), Mapping):
            table = _mapping(existing[name])
            break
    if not table:
        table = {"runtime_type": o.runtime_type, "privileged_without_host_devices": False}
    if o.annotation_prefixes:
        current = table.get("container_annotations")
        extra = [a for a in current if isinstance(a, str)] if isinstance(current, list) else []
        table["container_annotations"] = [f"{p}*" for p in o.annotation_prefixes] + extra
    options = _mapping(table.get("options"))
    options["BinaryName"] = handler.binary
    if version == 1:
        options["Runtime"] = handler.binary
    table["options"] = options
    return table


def _cri(data: Mapping[str, Any], plugin: str) -> dict[str, Any]:
    return _mapping(tt.lookup(data, ("plugins", plugin)))


def _settings(cri: Mapping[str, Any], o: Options, version: int) -> dict[str, Any]:
    """Our settings as a CRI plugin tree: handler tables, default runtime, enable_cdi."""
    containerd = _mapping(cri.get("containerd"))
    existing = _mapping(containerd.get("runtimes"))
    default = containerd.get("default_runtime_name")
    default = default if isinstance(default, str) else None
    tree: dict[str, Any] = {}
    if o.enable_cdi:
        tree["enable_cdi"] = True
    ours: dict[str, Any] = {}
    chosen = next((h.name for h in o.handlers if h.default), None)
    if chosen is not None:
        ours["default_runtime_name"] = chosen
    ours["runtimes"] = {h.name: handler_table(h, existing, default, o, version) for h in o.handlers}
    tree["containerd"] = ours
    return tree


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


class Containerd:
    """The containerd editor (see the module docstring)."""

    def __init__(self, options: Options) -> None:
        self.o = options

    @property
    def roles(self) -> tuple[str, ...]:
        return (CONFIG, DROP_IN) if self.o.drop_in else (CONFIG,)

    def names(self) -> dict[str, str]:
        out = {CONFIG: self.o.config}
        if self.o.drop_in:
            out[DROP_IN] = self.o.drop_in
        return out

    def import_pattern(self) -> str:
        assert self.o.drop_in is not None
        return posixpath.join(posixpath.dirname(self.o.drop_in), "*.toml")

    def prior(self, files: edits.Files) -> dict[str, Any]:
        return {}  # every in-file change carries its own revert (marker comments)

    # -- apply ---------------------------------------------------------------------------------

    def apply(self, files: edits.Files, prior: Mapping[str, Any]) -> Edit:
        o = self.o
        text = edits.decode(files.get(CONFIG), o.config)
        try:
            base = tt.strip_ours(text, o.config)
            template = is_template(o.config, base)
            base_data = tt.parse(base, o.config)
            source_bytes = files.get(SOURCE)
            source_name = o.source or o.config
            source_data = (
                tt.parse(edits.decode(source_bytes, source_name), source_name)
                if source_bytes is not None
                else base_data
            )
            version = detect_version(base_data or source_data, base, o.config, template)
            plugin = CRI_PLUGIN[version]
            settings = _settings(_cri(source_data, plugin), o, version)
            if version >= 2 and o.drop_in and not template:
                out, summary = self._drop_in(files, base, source_data, version, plugin, settings)
                notes: tuple[str, ...] = ()
            else:
                out, notes = self._in_place(
                    base, files.get(CONFIG) is None, version, plugin, settings, template
                )
                summary = f"config version {version}, edited in place ({o.config})"
            for role, data in out.items():  # never write a file the runtime cannot read
                tt.parse(edits.decode(data, role), self.names().get(role, role))
        except tt.TomlTextError as err:
            raise EditError(str(err)) from None
        return Edit(out, tuple(self._changes(files, out, version, plugin)), summary, notes)

    def _drop_in(
        self,
        files: edits.Files,
        base: str,
        source: Mapping[str, Any],
        version: int,
        plugin: str,
        settings: dict[str, Any],
    ) -> tuple[dict[str, bytes | None], str]:
        o = self.o
        assert o.drop_in is not None
        cri = _cri(source, plugin) if version == 2 else {}
        doc = {"version": version, "plugins": {plugin: _merge(cri, settings)}}
        header = DROP_IN_HEADER + (V2_COPY_NOTE if version == 2 else "")
        drop_in = (header + "\n" + tt.dumps(doc)).encode()
        config = self._with_import(base, files.get(CONFIG) is None, version)
        summary = f"config version {version}: drop-in {o.drop_in}, imported by {o.config}" + (
            " (with a copy of the CRI plugin section)" if version == 2 else ""
        )
        return {CONFIG: config.encode(), DROP_IN: drop_in}, summary

    def _with_import(self, text: str, created: bool, version: int) -> str:
        pattern = self.import_pattern()
        nl = tt.newline_of(text)
        stmts = tt.statements(text, self.o.config)
        current = next((s for s in stmts if s.table == () and s.path == ("imports",)), None)
        if current is not None:
            values = tt.lookup(tt.parse(text, self.o.config), ("imports",))
            if not isinstance(values, list):
                raise EditError(f"{self.o.config}: imports must be an array of paths")
            if pattern in values:
                return text
            was = text[current.start : current.end]
            line = tt.marked_statement(f"imports = {tt.value([*values, pattern])}", nl, was)
            return text[: current.start] + line + text[current.end :]
        line = tt.marked_statement(f"imports = {tt.value([pattern])}", nl)
        if created or not text.strip():
            return tt.marked_statement(f"version = {version}", nl) + line + text
        at = next(
            (
                s.end
                for s in stmts
                if s.table == () and s.path == ("version",) and s.kind == "keyval"
            ),
            0,
        )
        return text[:at] + line + text[at:]

    def _in_place(
        self,
        text: str,
        created: bool,
        version: int,
        plugin: str,
        settings: dict[str, Any],
        template: bool,
    ) -> tuple[dict[str, bytes | None], tuple[str, ...]]:
        name = self.o.config
        nl = tt.newline_of(text)
        cri_path = ("plugins", plugin)
        notes: list[str] = []
        scalars: list[tuple[tuple[str, ...], Any]] = []
        if settings.get("enable_cdi"):
            scalars.append(((*cri_path, "enable_cdi"), True))
        default = settings["containerd"].get("default_runtime_name")
        if default is not None:
            scalars.append(((*cri_path, "containerd", "default_runtime_name"), default))
        if template and scalars:
            notes.append(
                f"{name} is a template whose base owns the CRI plugin table: enable_cdi and the "
                "default runtime are left to k3s/RKE2 (its --default-runtime flag)"
            )
            scalars = []
        if created and not template:
            text = tt.marked_statement(f"version = {version}", nl) + text
        block_tables: dict[str, Any] = {}
        for path, value in scalars:
            text = self._set_scalar(text, path, value, nl, block_tables)
        runtimes_path = (*cri_path, "containerd", "runtimes")
        for handler, table in settings["containerd"]["runtimes"].items():
            text = self._take_over(text, (*runtimes_path, handler), nl)
            _merge(block_tables, _nest((*runtimes_path, handler), table))
        if text and not text.endswith("\n"):
            text += nl
        text += tt.block(tt.dumps(block_tables), nl)
        return {CONFIG: text.encode()}, tuple(notes)

    def _set_scalar(
        self, text: str, path: tuple[str, ...], value: Any, nl: str, block: dict[str, Any]
    ) -> str:
        name = self.o.config
        stmts = tt.statements(text, name)
        data = tt.parse(text, name)
        existing = next((s for s in stmts if s.kind == "keyval" and s.path == path), None)
        if existing is not None:
            if tt.lookup(data, path) == value:
                return text
            raw = text[existing.start : existing.comment if existing.comment >= 0 else existing.end]
            key_part = tt.key_text(raw.rstrip("\r\n"))
            line = tt.marked_statement(
                f"{key_part.rstrip()} = {tt.value(value)}", nl, text[existing.start : existing.end]
            )
            return text[: existing.start] + line + text[existing.end :]
        table = path[:-1]
        header = next((s for s in stmts if s.kind == "table" and s.path == table), None)
        if header is not None:
            after = [s for s in stmts if s.start >= header.end]
            indent = ""
            if after and after[0].kind == "keyval":
                line_text = text[after[0].start : after[0].end]
                indent = line_text[: len(line_text) - len(line_text.lstrip())]
            line = tt.marked_statement(f"{indent}{tt.key(path[-1])} = {tt.value(value)}", nl)
            return text[: header.end] + line + text[header.end :]
        dotted = any(
            s.kind == "keyval" and len(s.table) < len(table) and s.path[: len(table)] == table
            for s in stmts
        )
        if dotted or isinstance(tt.lookup(data, table), list):
            raise EditError(
                f"{name}: cannot add {'.'.join(path)}: the table is written as dotted keys or an "
                "array; give it a [table] header or use a drop-in"
            )
        _merge(block, _nest(path, value))
        return text

    def _take_over(self, text: str, path: tuple[str, ...], nl: str) -> str:
        """Move a table the file already has (and its sub-tables) out of the way: each run of its
        statements becomes one placeholder line holding the original text."""
        n = len(path)
        stmts = tt.statements(text, self.o.config)
        removed: list[tt.Statement] = []
        inside = False
        for s in stmts:
            if s.kind in ("table", "array-table"):
                inside = s.path[:n] == path
            elif s.kind == "keyval" and not inside and s.path[:n] == path:
                raise EditError(
                    f"{self.o.config}: {'.'.join(path)} is written as dotted keys; "
                    "give it a [table] header so the toolkit can replace it"
                )
            if inside and s.kind != "template":
                removed.append(s)
        out: list[str] = []
        last = 0
        run_start = -1
        for n, s in enumerate(removed):
            if run_start < 0:
                run_start = s.start
            if n + 1 == len(removed) or removed[n + 1].start != s.end:
                out.append(text[last:run_start])
                out.append(tt.moved_placeholder(text[run_start : s.end], nl))
                last, run_start = s.end, -1
        out.append(text[last:])
        return "".join(out)

    # -- revert --------------------------------------------------------------------------------

    def revert(self, files: edits.Files, prior: Mapping[str, Any]) -> dict[str, bytes | None]:
        text = edits.decode(files.get(CONFIG), self.o.config)
        try:
            stripped = tt.strip_ours(text, self.o.config)
        except tt.TomlTextError as err:
            raise EditError(str(err)) from None
        out: dict[str, bytes | None] = {
            CONFIG: None
            if files.get(CONFIG) is None or (not stripped.strip() and text.strip())
            else stripped.encode()
        }
        if self.o.drop_in:
            out[DROP_IN] = None
        return out

    # -- what changed --------------------------------------------------------------------------

    def _owned(self, files: edits.Files, version: int, plugin: str) -> dict[str, Any]:
        """Our settings as the runtime would see them in these files."""
        view: dict[str, Any] = {}
        trees = []
        for role in (CONFIG, DROP_IN):
            try:
                data = tt.parse(edits.decode(files.get(role), role), role)
            except (tt.TomlTextError, EditError):
                data = {}
            trees.append(data)
        merged = _merge(copy.deepcopy(trees[0]), trees[1])
        cri = _cri(merged, plugin)
        containerd = _mapping(cri.get("containerd"))
        runtimes_now = _mapping(containerd.get("runtimes"))
        for h in self.o.handlers:
            view[f"runtime handler {h.name}"] = runtimes_now.get(h.name)
        view["enable_cdi"] = cri.get("enable_cdi")
        view["default runtime"] = containerd.get("default_runtime_name")
        if self.o.drop_in and version >= 2:
            imports = trees[0].get("imports")
            view["imports"] = isinstance(imports, list) and self.import_pattern() in imports
        return view

    def _changes(
        self, before: edits.Files, after: Mapping[str, bytes | None], version: int, plugin: str
    ) -> list[str]:
        old = self._owned(before, version, plugin)
        new = self._owned(after, version, plugin)
        out: list[str] = []
        for h in self.o.handlers:
            k = f"runtime handler {h.name}"
            if new[k] != old[k]:
                verb = "added" if old[k] is None else "restored"
                out.append(f"{verb} runtime handler {h.name} (BinaryName {h.binary})")
        if new["enable_cdi"] != old["enable_cdi"]:
            out.append("set enable_cdi = true on the CRI plugin")
        if new["default runtime"] != old["default runtime"] and new["default runtime"]:
            out.append(f"made {new['default runtime']} the default runtime")
        if new.get("imports") and not old.get("imports"):
            out.append(f"added {self.import_pattern()} to the imports of {self.o.config}")
        for role, name in self.names().items():
            if after.get(role) == before.get(role):
                continue
            if before.get(role) is None:
                out.append(f"wrote {name}")
            elif role == DROP_IN:
                out.append(f"rewrote {name} (its content differed from ours)")
            elif not out:
                out.append(f"rewrote our sections of {name}")
        return out


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for k in reversed(path):
        out = {k: out}
    return dict(out)
