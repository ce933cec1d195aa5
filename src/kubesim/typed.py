"""What a schema says about each value for structured merges: struct, map, list, scalar or untyped.

Server-side apply (structured-merge-diff) walks an object together with its schema: a struct has
named fields, a map has entries of one element type (granular, or atomic as one leaf), a list is
atomic, a set of scalars, or a map keyed by one or more item fields. The schemas come from the
built-in OpenAPI definitions (`builtin_schemas`) or a CRD's `openAPIV3Schema`; a value the schema
does not describe is "untyped" and treated as the real server's deduced type (maps granular,
lists atomic). Shapes are built lazily and cached per schema dict, so a walk is one dict lookup
per field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubesim import builtin_schemas as bs

STRUCT = 1
MAP = 2
LIST = 3
SCALAR = 4
UNTYPED = 5

ATOMIC = "atomic"
SET = "set"
KEYED = "map"

OBJECT_META = bs.OBJECT_META
# List-map keys whose absence the server fills from the field's `+default` marker (the Go types
# say `+default="TCP"` for ContainerPort.protocol and ServicePort.protocol); the generated
# definitions carry no defaults, so they are listed here.
_KEY_DEFAULTS: dict[str, dict[str, Any]] = {
    "io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.ServicePort": {"protocol": "TCP"},
}

# Used only when a built-in kind has no generated definition: the `patchMergeKey`s of the real
# types (several candidate key sets for `ports`, told apart by the first key), sets of scalars.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "addresses": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey",),
    "ports": ("containerPort", "port"),
}
SET_LISTS = {"finalizers"}
_LEGACY_LIST_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "ports": (("containerPort", "protocol"), ("port", "protocol")),
    "topologySpreadConstraints": (("topologyKey", "whenUnsatisfiable"),),
}
_LEGACY_KEY_DEFAULTS: dict[str, Any] = {"protocol": "TCP"}


class Shape:
    """The schema of one value position, reduced to what merging needs."""

    __slots__ = (
        "_cache",
        "_elem",
        "_extra",
        "_fields",
        "atomic",
        "candidates",
        "key_defaults",
        "keys",
        "kind",
        "legacy",
        "list_type",
    )

    def __init__(
        self,
        kind: int,
        *,
        atomic: bool = False,
        list_type: str = ATOMIC,
        keys: tuple[str, ...] = (),
        key_defaults: Mapping[str, Any] | None = None,
        candidates: tuple[tuple[str, ...], ...] = (),
        fields: Mapping[str, Any] | None = None,
        extra: Any = None,
        elem: Any = None,
        legacy: bool = False,
    ) -> None:
        self.kind = kind
        self.atomic = atomic
        self.list_type = list_type
        self.keys = keys
        self.key_defaults: dict[str, Any] = dict(key_defaults or {})
        self.candidates = candidates
        self.legacy = legacy
        # Field and element schemas stay raw until first use (definitions reference each other).
        self._fields: Mapping[str, Any] = fields or {}
        self._extra = extra
        self._elem = elem
        self._cache: dict[str, Shape] = {}

    def declares(self, name: str) -> bool:
        """Whether `name` is a named field of this struct (named fields are not map entries)."""
        return self.kind == STRUCT and name in self._fields

    def field(self, name: str) -> Shape:
        """The shape of a field (struct) or entry (map); unknown fields are untyped."""
        found = self._cache.get(name)
        if found is not None:
            return found
        if self.kind == STRUCT and name in self._fields:
            found = _shape(self._fields[name])
        elif self.legacy:
            found = _legacy_child(name)
        elif self._extra is not None and self.kind in (STRUCT, MAP):
            found = _shape(self._extra)
        else:
            found = UNTYPED_SHAPE
        self._cache[name] = found
        return found

    def elem(self) -> Shape:
        """The shape of list items."""
        found = self._cache.get("[]")
        if found is None:
            if self._elem is not None:
                found = _shape(self._elem)
            else:
                found = LEGACY_SHAPE if self.legacy else UNTYPED_SHAPE
            self._cache["[]"] = found
        return found

    def list_keys(self, items: list[Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The key fields of a keyed list and the defaults of absent keys."""
        if self.keys or not self.candidates:
            return self.keys, self.key_defaults
        # A name-matched legacy list: the candidate key set whose first key the items carry.
        dicts = [i for i in items if isinstance(i, dict)]
        chosen = self.candidates[0]
        for keys in self.candidates:
            if dicts and all(keys[0] in i for i in dicts):
                chosen = keys
                break
        defaults = {k: v for k, v in _LEGACY_KEY_DEFAULTS.items() if k in chosen[1:]}
        return chosen, defaults


UNTYPED_SHAPE = Shape(UNTYPED)
SCALAR_SHAPE = Shape(SCALAR)
LEGACY_SHAPE = Shape(UNTYPED, legacy=True)

# Schema dicts are long-lived (definitions, CRD versions); the cache keeps each one alive, so an
# id is never reused while its entry exists.
_CACHE: dict[int, tuple[Any, Shape]] = {}


def _shape(schema: Any) -> Shape:
    if isinstance(schema, Shape):
        return schema
    if not isinstance(schema, dict):
        return UNTYPED_SHAPE
    entry = _CACHE.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    shape = _build(schema)
    _CACHE[id(schema)] = (schema, shape)
    return shape


def _extension(schema: Mapping[str, Any], resolved: Mapping[str, Any], name: str) -> Any:
    """An extension from the property schema, else from the definition it refers to."""
    value = schema.get(name)
    return resolved.get(name) if value is None else value


def _build(schema: dict[str, Any]) -> Shape:
    resolved = bs.resolve(schema)
    if _extension(schema, resolved, "x-kubernetes-int-or-string"):
        return SCALAR_SHAPE
    kind = resolved.get("type")
    if isinstance(kind, list):  # ["string", "null"] style types
        kind = next((k for k in kind if k != "null"), None)
    props = resolved.get("properties")
    extra = resolved.get("additionalProperties")
    items = resolved.get("items")
    if kind == "array" or (kind is None and isinstance(items, dict)):
        declared = schema if "x-kubernetes-list-type" in schema else resolved
        semantics = bs.list_semantics_of(declared)
        key_defaults: dict[str, Any] = {}
        if semantics.type == KEYED and isinstance(items, dict):
            item_props = bs.resolve(items).get("properties") or {}
            for key in semantics.keys:
                prop = item_props.get(key)
                if isinstance(prop, dict) and "default" in prop:
                    key_defaults[key] = prop["default"]
            key_defaults.update(_KEY_DEFAULTS.get(bs.ref_name(items) or "", {}))
        return Shape(
            LIST,
            list_type=semantics.type,
            keys=tuple(semantics.keys),
            key_defaults=key_defaults,
            elem=items if isinstance(items, dict) else None,
        )
    if kind == "object" or isinstance(props, dict) or isinstance(extra, dict):
        atomic = _extension(schema, resolved, "x-kubernetes-map-type") == ATOMIC
        preserve = _extension(schema, resolved, "x-kubernetes-preserve-unknown-fields")
        if isinstance(props, dict) and props:
            if isinstance(extra, dict):
                rest: Any = extra
            else:
                rest = UNTYPED_SHAPE if (preserve or extra is True) else None
            return Shape(STRUCT, atomic=atomic, fields=props, extra=rest)
        if isinstance(extra, dict):
            return Shape(MAP, atomic=atomic, extra=extra)
        return Shape(UNTYPED, atomic=atomic)
    if kind in ("string", "integer", "number", "boolean"):
        return SCALAR_SHAPE
    return UNTYPED_SHAPE


def _legacy_child(name: str) -> Shape:
    """Name-based list semantics for built-in kinds without a definition."""
    if name in SET_LISTS:
        return Shape(LIST, list_type=SET, legacy=True)
    candidates = _LEGACY_LIST_KEYS.get(name) or tuple((k,) for k in MERGE_KEYS.get(name, ()))
    if candidates:
        return Shape(LIST, list_type=KEYED, candidates=candidates, legacy=True)
    return LEGACY_SHAPE


_ROOTS: dict[tuple[Any, ...], tuple[Any, Shape]] = {}


def root_shape(group: str, version: str, kind: str, crd_schema: dict[str, Any] | None) -> Shape:
    """The shape of a whole object: the CRD schema or the built-in definition, with ObjectMeta."""
    key = (group, version, kind, id(crd_schema))
    found = _ROOTS.get(key)
    if found is not None and found[0] is crd_schema:
        return found[1]
    if crd_schema is not None:
        base = _shape(crd_schema)
    else:
        definition = bs.schema_for(group, version, kind)
        base = _shape(definition) if definition is not None else LEGACY_SHAPE
    fields: dict[str, Any] = dict(base._fields) if base.kind == STRUCT else {}
    fields["apiVersion"] = SCALAR_SHAPE
    fields["kind"] = SCALAR_SHAPE
    # Custom resources and built-ins alike carry the built-in ObjectMeta.
    fields["metadata"] = bs.definition(OBJECT_META) or LEGACY_SHAPE
    legacy_rest = None if base.legacy else UNTYPED_SHAPE
    extra = base._extra if base.kind == STRUCT else legacy_rest
    shape = Shape(STRUCT, fields=fields, extra=extra, legacy=base.legacy)
    _ROOTS[key] = (crd_schema, shape)
    return shape


def object_shape(obj: Mapping[str, Any], crd_schema: dict[str, Any] | None) -> Shape:
    """The root shape for an object, found from its own apiVersion and kind."""
    api_version = str(obj.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    return root_shape(group, version, str(obj.get("kind") or ""), crd_schema)
