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
import itertools
import posixpath
from collections.abc import Callable, Mapping
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
    return name.endswith(".tmpl") or tt.has_template_lines(text)


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
    """A copy of the CRI plugin's section (to change)."""
    return _mapping(tt.lookup(data, ("plugins", plugin)))


def _cri_view(data: Mapping[str, Any], plugin: str) -> Mapping[str, Any]:
    """The CRI plugin's section, to read (not copied: it can be most of a big config)."""
    found = tt.lookup(data, ("plugins", plugin))
    return found if isinstance(found, Mapping) else {}


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


def _overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` merged over `base` into a new tree that shares what neither changes (no deep copy
    of `base`, which can be most of a big config)."""
    out = dict(base)
    for k, v in top.items():
        below = out.get(k)
        out[k] = _overlay(below, v) if isinstance(v, Mapping) and isinstance(below, Mapping) else v
    return out


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
        """Our settings on the config (see the module docstring). Linear in the config's size:
        it is scanned into statements once and parsed whole once (`_gate`, or `_fast_drop_in`)."""
        o = self.o
        text = edits.decode(files.get(CONFIG), o.config)
        try:
            stripped = tt.strip_ours(text, o.config)
            base = _Config(stripped, o.config)
            template = is_template(o.config, stripped)
            version = base.root_data().get("version")
            if o.drop_in and not template and version in (2, 3) and not isinstance(version, bool):
                return self._fast_drop_in(files, text, base, version)
            base_data = base.data()
            source_data = self._source(files) or base_data
            defined = base_data if tt.has_content(base.stmts) else source_data
            version = detect_version(defined, stripped, o.config, template)
            plugin = CRI_PLUGIN[version]
            settings = _settings(_cri_view(source_data, plugin), o, version)
            if version >= 2 and o.drop_in and not template:
                out, summary, drop_in_tree = self._drop_in(
                    files, base, source_data, version, plugin, settings
                )
                notes: tuple[str, ...] = ()
            else:
                out, notes = self._in_place(
                    base, files.get(CONFIG) is None, version, plugin, settings, template
                )
                summary = f"config version {version}, edited in place ({o.config})"
                drop_in_tree = None
            after = self._gate(files, out, text, base, drop_in_tree)
            kept = drop_in_tree is not None  # the drop-in way edits top-level statements only
            before = None if after is None else self._before(text, base, after, kept)
            changes = self._changes(files, out, before, after, plugin)
        except tt.TomlTextError as err:
            raise EditError(str(err)) from None
        return Edit(out, tuple(changes), summary, notes)

    def _source(self, files: edits.Files) -> dict[str, Any] | None:
        """The settings source's tree (RUNTIME_CONFIG_SOURCE `file=`), when there is one."""
        data = files.get(SOURCE)
        if data is None:
            return None
        name = self.o.source or self.o.config
        return tt.parse(edits.decode(data, name), name)

    def _fast_drop_in(self, files: edits.Files, text: str, base: _Config, version: int) -> Edit:
        """A config that states version 2 or 3, with a drop-in: only its top-level statements
        are edited (`imports`), so it is parsed whole once, after the edit (the gate), and that
        tree gives the CRI plugin section (which the edit does not touch)."""
        o = self.o
        plugin = CRI_PLUGIN[version]
        config = self._with_import(base, files.get(CONFIG) is None, version)
        tree = self._parsed(config, text, base)
        source = self._source(files) or tree
        settings = _settings(_cri_view(source, plugin), o, version)
        drop_in, summary, drop_in_tree = self._drop_in_file(source, version, plugin, settings)
        out: dict[str, bytes | None] = {CONFIG: config.encode(), DROP_IN: drop_in}
        after = {CONFIG: tree, DROP_IN: drop_in_tree}
        before = self._before(text, base, after, True)
        changes = self._changes(files, out, before, after, plugin)
        return Edit(out, tuple(changes), summary)

    def _parsed(self, config: str, text: str, base: _Config) -> dict[str, Any]:
        """The new config parsed whole (the gate: never write a file the runtime cannot read);
        an error names the file's own problem where it has one."""
        try:
            return tt.parse(config, self.o.config)
        except tt.TomlTextError:
            tt.parse(text, self.o.config)  # the file's own error, at its own line numbers
            if not _paths(tt.parse(base.text, self.o.config).get("imports", [])):
                raise EditError(f"{self.o.config}: imports must be an array of paths") from None
            raise

    def _gate(
        self,
        files: edits.Files,
        out: Mapping[str, bytes | None],
        text: str,
        base: _Config,
        drop_in_tree: dict[str, Any] | None,
    ) -> dict[str, dict[str, Any]] | None:
        """Never write a file the runtime cannot read: when anything is to be written (and the
        runtime restarted, which reads every file whole), the config we hand it is parsed whole
        (our drop-in is written from a tree, `drop_in_tree`). The trees, or None when nothing
        changes."""
        if all(out.get(role) == files.get(role) for role in out):
            return None
        trees: dict[str, dict[str, Any]] = {}
        for role, data in out.items():
            name = self.names().get(role, role)
            if role == DROP_IN and drop_in_tree is not None:
                trees[role] = drop_in_tree
                continue
            decoded = edits.decode(data, name)
            trees[role] = (
                self._parsed(decoded, text, base) if role == CONFIG else tt.parse(decoded, name)
            )
        return trees

    def _before(
        self, text: str, base: _Config, after: Mapping[str, Mapping[str, Any]], kept: bool
    ) -> dict[str, Any]:
        """What the change sentences need of the config as it was read: its CRI plugin sections
        and imports. When the edit kept everything from the first table on (`kept`, the drop-in
        way) and so did our earlier edits, the new config's tree gives the sections and the
        top-level statements the rest, without another parse."""
        read = base if text == base.text else _Config(text, self.o.config)
        plugins = after.get(CONFIG, {}).get("plugins")
        if not kept or plugins is None or read.body() != base.body():
            return dict(read.data())
        return {**read.root_data(), "plugins": plugins}

    def _drop_in(
        self,
        files: edits.Files,
        base: _Config,
        source: Mapping[str, Any],
        version: int,
        plugin: str,
        settings: dict[str, Any],
    ) -> tuple[dict[str, bytes | None], str, dict[str, Any]]:
        drop_in, summary, tree = self._drop_in_file(source, version, plugin, settings)
        config = self._with_import(base, files.get(CONFIG) is None, version)
        return {CONFIG: config.encode(), DROP_IN: drop_in}, summary, tree

    def _drop_in_file(
        self, source: Mapping[str, Any], version: int, plugin: str, settings: dict[str, Any]
    ) -> tuple[bytes, str, dict[str, Any]]:
        """Our drop-in (written from a tree by `tt.dumps`, so valid by construction), the
        summary, and the tree."""
        o = self.o
        cri = _cri_view(source, plugin) if version == 2 else {}
        doc = {"version": version, "plugins": {plugin: _overlay(cri, settings)}}
        header = DROP_IN_HEADER + (V2_COPY_NOTE if version == 2 else "")
        drop_in = (header + "\n" + tt.dumps(doc)).encode()
        summary = f"config version {version}: drop-in {o.drop_in}, imported by {o.config}" + (
            " (with a copy of the CRI plugin section)" if version == 2 else ""
        )
        return drop_in, summary, doc

    def _with_import(self, base: _Config, created: bool, version: int) -> str:
        pattern = self.import_pattern()
        text = base.text
        nl = tt.newline_of(text)
        root = base.root()
        current = next((s for s in root if s.path == ("imports",)), None)
        if current is not None:
            values = tt.lookup(base.root_data(), ("imports",))
            if not _paths(values):
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
                for s in root
                if s.table == () and s.path == ("version",) and s.kind == "keyval"
            ),
            0,
        )
        return text[:at] + line + text[at:]

    def _in_place(
        self,
        base: _Config,
        created: bool,
        version: int,
        plugin: str,
        settings: dict[str, Any],
        template: bool,
    ) -> tuple[dict[str, bytes | None], tuple[str, ...]]:
        """Our settings as edits of the file's statements, all computed on one reading of it
        and then spliced in (linear in the file's size)."""
        name = self.o.config
        text = base.text
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
        splices = _Splices()
        if created and not template:
            splices.insert(0, tt.marked_statement(f"version = {version}", nl))
        block_tables: dict[str, Any] = {}
        for path, value in scalars:
            self._set_scalar(base, path, value, nl, block_tables, splices)
        runtimes_path = (*cri_path, "containerd", "runtimes")
        for handler, table in settings["containerd"]["runtimes"].items():
            self._take_over(base, (*runtimes_path, handler), nl, splices)
            _merge(block_tables, _nest((*runtimes_path, handler), table))
        text = splices.apply(text)
        if text and not text.endswith("\n"):
            text += nl
        text += tt.block(tt.dumps(block_tables), nl)
        return {CONFIG: text.encode()}, tuple(notes)

    def _set_scalar(
        self,
        base: _Config,
        path: tuple[str, ...],
        value: Any,
        nl: str,
        block: dict[str, Any],
        splices: _Splices,
    ) -> None:
        name = self.o.config
        text = base.text
        stmts = base.stmts
        existing = next((s for s in stmts if s.kind == "keyval" and s.path == path), None)
        if existing is not None:
            if tt.lookup(base.data(), path) == value:
                return
            raw = text[existing.start : existing.comment if existing.comment >= 0 else existing.end]
            key_part = tt.key_text(raw.rstrip("\r\n"))
            line = tt.marked_statement(
                f"{key_part.rstrip()} = {tt.value(value)}", nl, text[existing.start : existing.end]
            )
            splices.replace(existing.start, existing.end, line)
            return
        table = path[:-1]
        at = next((n for n, s in enumerate(stmts) if s.kind == "table" and s.path == table), None)
        if at is not None:
            header = stmts[at]
            indent = ""
            if at + 1 < len(stmts) and stmts[at + 1].kind == "keyval":
                line_text = text[stmts[at + 1].start : stmts[at + 1].end]
                indent = line_text[: len(line_text) - len(line_text.lstrip())]
            line = tt.marked_statement(f"{indent}{tt.key(path[-1])} = {tt.value(value)}", nl)
            splices.insert(header.end, line)
            return
        dotted = any(
            s.kind == "keyval" and len(s.table) < len(table) and s.path[: len(table)] == table
            for s in stmts
        )
        if dotted or isinstance(tt.lookup(base.data(), table), list):
            raise EditError(
                f"{name}: cannot add {'.'.join(path)}: the table is written as dotted keys or an "
                "array; give it a [table] header or use a drop-in"
            )
        _merge(block, _nest(path, value))

    def _take_over(self, base: _Config, path: tuple[str, ...], nl: str, splices: _Splices) -> None:
        """Move a table the file already has (and its sub-tables) out of the way: each run of its
        statements becomes one placeholder line holding the original text."""
        n = len(path)
        text = base.text
        removed: list[tt.Statement] = []
        inside = False
        for s in base.stmts:
            if s.kind in ("table", "array-table"):
                inside = s.path[:n] == path
            elif s.kind == "keyval" and not inside and s.path[:n] == path:
                raise EditError(
                    f"{self.o.config}: {'.'.join(path)} is written as dotted keys; "
                    "give it a [table] header so the toolkit can replace it"
                )
            if inside and s.kind != "template":
                removed.append(s)
        run_start = -1
        for k, s in enumerate(removed):
            if run_start < 0:
                run_start = s.start
            if k + 1 == len(removed) or removed[k + 1].start != s.end:
                splices.replace(run_start, s.end, tt.moved_placeholder(text[run_start : s.end], nl))
                run_start = -1

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

    def _owned(
        self, config: Mapping[str, Any], drop_in: Mapping[str, Any], plugin: str
    ) -> dict[str, Any]:
        """Our settings as the runtime would see them in these files (their trees; the drop-in's
        values over the config's, as containerd merges an import)."""

        def seen(*path: str) -> Any:
            low = tt.lookup(config, ("plugins", plugin, *path))
            top = tt.lookup(drop_in, ("plugins", plugin, *path))
            if isinstance(low, Mapping) and isinstance(top, Mapping):
                return _overlay(low, top)
            return low if top is None else top

        view: dict[str, Any] = {}
        for h in self.o.handlers:
            view[f"runtime handler {h.name}"] = seen("containerd", "runtimes", h.name)
        view["enable_cdi"] = seen("enable_cdi")
        view["default runtime"] = seen("containerd", "default_runtime_name")
        if self.o.drop_in:
            imports = config.get("imports")
            view["imports"] = isinstance(imports, list) and self.import_pattern() in imports
        return view

    def _changes(
        self,
        before: edits.Files,
        after: Mapping[str, bytes | None],
        config_before: Mapping[str, Any] | None,
        trees: Mapping[str, Mapping[str, Any]] | None,
        plugin: str,
    ) -> list[str]:
        """What changed, in sentences (`trees`: the new files parsed, None when none changes;
        `config_before`: the config as read, see `_before`)."""
        if trees is None or config_before is None:
            return []
        if before.get(DROP_IN) == after.get(DROP_IN):
            drop_in_before: Mapping[str, Any] = trees.get(DROP_IN, {})
        else:
            drop_in_before = _readable(
                lambda: tt.parse(edits.decode(before.get(DROP_IN), DROP_IN), DROP_IN)
            )
        old = self._owned(config_before, drop_in_before, plugin)
        new = self._owned(trees.get(CONFIG, {}), trees.get(DROP_IN, {}), plugin)
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


# What the editor reads of a config: the top-level keys it sets and every version's CRI plugin.
TOUCHED = (("version",), ("imports",), *(("plugins", p) for p in CRI_PLUGIN.values()))


class _Config:
    """A config's text, read once: its statements and the part of its meaning we use."""

    def __init__(self, text: str, name: str) -> None:
        self.text = text
        self.name = name
        self._stmts: list[tt.Statement] | None = None
        self._root: list[tt.Statement] | None = None
        self._data: dict[str, Any] | None = None
        self._root_data: dict[str, Any] | None = None

    @property
    def stmts(self) -> list[tt.Statement]:
        if self._stmts is None:
            self._stmts = tt.statements(self.text, self.name)
        return self._stmts

    def root(self) -> list[tt.Statement]:
        """The statements before the first table header (where top-level keys are)."""
        if self._root is None:
            stmts = (
                self._stmts
                if self._stmts is not None
                else tt.statements(self.text, self.name, root_only=True)
            )
            self._root = list(
                itertools.takewhile(lambda s: s.kind not in ("table", "array-table"), stmts)
            )
        return self._root

    def root_data(self) -> dict[str, Any]:
        """The meaning of the top-level statements (scanning only up to the first table)."""
        if self._root_data is None:
            self._root_data = tt.parse_subset(self.text, self.root(), [()], self.name)
        return self._root_data

    def body(self) -> str:
        """The text from the first table on."""
        root = self.root()
        return self.text[root[-1].end if root else 0 :]

    def data(self) -> dict[str, Any]:
        """The top-level keys we set and the CRI plugin sections (see `tt.parse_subset`)."""
        if self._data is None:
            self._data = tt.parse_subset(self.text, self.stmts, TOUCHED, self.name)
        return self._data


class _Splices:
    """Edits of a text at statement boundaries, applied in one pass: insertions (in the order
    given, before a replacement starting at the same place) and replacements."""

    def __init__(self) -> None:
        self._edits: list[tuple[int, int, int, str]] = []  # start, order, end, new text

    def insert(self, at: int, new: str) -> None:
        self._edits.append((at, len(self._edits), at, new))

    def replace(self, start: int, end: int, new: str) -> None:
        self._edits.append((start, 1 << 30, end, new))

    def apply(self, text: str) -> str:
        pieces: list[str] = []
        last = 0
        for start, _order, end, new in sorted(self._edits):
            pieces.append(text[last:start])
            pieces.append(new)
            last = max(last, end)
        pieces.append(text[last:])
        return "".join(pieces)


def _paths(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _readable(read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A file's tree for the change sentences; an unreadable one counts as empty."""
    try:
        return read()
    except (tt.TomlTextError, EditError):
        return {}


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for k in reversed(path):
        out = {k: out}
    return dict(out)
