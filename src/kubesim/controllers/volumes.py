"""Node host filesystems and pod volumes as real directories, so pod runners read and write files.

Every node gets a root directory (its `/`). A pod's volumes live where the kubelet keeps them,
under the node's `/var/lib/kubelet/pods/<uid>/volumes/`, except `hostPath`, which is the node's
own tree. ConfigMap, Secret, downward API and projected volumes are written the way the kubelet's
atomic writer does: files in a timestamped `..<time>` directory, a `..data` symlink to it that is
swapped in one rename, and one `<name> -> ..data/<name>` link per top-level entry.

Paths are resolved as in a chroot: symlinks are followed inside the root they belong to (absolute
targets restart at that root, `..` stops at it), so nothing a runner writes can lead outside. In a
container path an absolute target inside a non-hostPath volume goes through the container's
mounts again, as it would in the container's mount namespace.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import math
import os
import posixpath
import shutil
import stat
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesim import quantity

CONFIGMAP_KEY = ("", "configmaps")
SECRET_KEY = ("", "secrets")
# What a fresh node has on disk before any pod runs (the kubelet's own directories).
# What a fresh node has on disk before any pod runs: the usual Linux top-level directories (pods
# mount /sys, /proc, /dev, ... with type Directory) and the kubelet's own directories.
NODE_SKELETON = (
    "dev/char",
    "etc",
    "lib/modules",
    "proc",
    "run",
    "sys",
    "sys/devices/system",
    "tmp",
    "usr/bin",
    "var/lib/kubelet/pods",
    "var/lib/kubelet/device-plugins",
    "var/log",
)
DEFAULT_MODE = 0o644
MAX_SYMLINKS = 40
# Volume kinds whose content the kubelet writes (and keeps read-only in containers).
WRITTEN_KINDS = ("configMap", "secret", "downwardAPI", "projected")
PLUGIN_DIRS = {
    "emptyDir": "kubernetes.io~empty-dir",
    "configMap": "kubernetes.io~configmap",
    "secret": "kubernetes.io~secret",
    "downwardAPI": "kubernetes.io~downward-api",
    "projected": "kubernetes.io~projected",
}
SUPPORTED_KINDS = ("hostPath", *PLUGIN_DIRS)

Payload = dict[str, tuple[bytes, int]]


class MountError(Exception):
    """A volume cannot be set up; the text is what the kubelet reports after the volume name."""


class PathNotMounted(FileNotFoundError):
    """A container path that no volumeMount covers (kubesim simulates no image filesystem)."""


def resolve_within(root: Path, path: str, *, absolute: Callable[[str], Path] | None = None) -> Path:
    """`path` (absolute or relative) inside `root`, following symlinks as a chroot would.

    With `absolute`, a symlink whose target is absolute leaves `root`: the rest of the path
    (target first) is handed to it, as a container resolves such links in its own namespace.
    """
    pending = deque(p for p in path.split("/") if p not in ("", "."))
    parts: list[str] = []
    hops = 0
    while pending:
        part = pending.popleft()
        if part == "..":
            if parts:
                parts.pop()
            continue
        candidate = root.joinpath(*parts, part)
        if candidate.is_symlink():
            hops += 1
            if hops > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", str(candidate))
            target = os.readlink(candidate)
            if target.startswith("/") and absolute is not None:
                return absolute("/".join([target.rstrip("/"), *pending]))
            if target.startswith("/"):
                parts = []
            pending.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        parts.append(part)
    return root.joinpath(*parts)


class NodeFilesystems:
    """One root directory per node under `base`, created on first use and removed with the node."""

    def __init__(self, base: Path, os_image: Callable[[str], str] | None = None) -> None:
        self.base = base
        # The node's osImage (`Ubuntu 24.04.1 LTS`), written to its /etc/os-release.
        self.os_image = os_image
        self._ready: set[str] = set()

    def root(self, node: str) -> Path:
        """The node's `/` on this machine."""
        root = self.base / node
        if node not in self._ready:
            for sub in NODE_SKELETON:
                (root / sub).mkdir(parents=True, exist_ok=True)
            if not (root / "var/run").is_symlink():
                (root / "var/run").symlink_to("../run")  # as on current distributions
            release = root / "etc/os-release"
            if self.os_image is not None and not release.exists():
                release.write_text(os_release(self.os_image(node)))
            self._ready.add(node)
        return root

    def resolve(self, node: str, path: str) -> Path:
        """A node path (`/var/lib/kubelet`) on this machine."""
        return resolve_within(self.root(node), path)

    def pod_dir(self, node: str, uid: str) -> Path:
        """Where the kubelet keeps one pod's volumes."""
        return self.root(node) / "var/lib/kubelet/pods" / uid

    def remove(self, node: str) -> None:
        """Forget a node and delete its tree (the machine is gone)."""
        self._ready.discard(node)
        shutil.rmtree(self.base / node, ignore_errors=True)

    def remove_all(self) -> None:
        """Delete every node tree."""
        self._ready.clear()
        shutil.rmtree(self.base, ignore_errors=True)


def os_release(image: str) -> str:
    """An /etc/os-release for an osImage such as `Ubuntu 24.04.1 LTS`."""
    words = image.split()
    name = words[0] if words else "Linux"
    version = next((w for w in words[1:] if w[:1].isdigit()), "")
    version_id = ".".join(version.split(".")[:2])
    return (
        f'PRETTY_NAME="{image}"\nNAME="{name}"\nVERSION_ID="{version_id}"\n'
        f'VERSION="{" ".join(words[1:])}"\nID={name.lower()}\n'
    )


# ----- payloads ---------------------------------------------------------------------------------


def _mode(value: Any, default: int) -> int:
    return int(value) & 0o777 if isinstance(value, int) and not isinstance(value, bool) else default


def _keyed_payload(
    kind: str,
    name: str,
    data: dict[str, bytes] | None,
    items: list[dict[str, Any]] | None,
    optional: bool,
    mode: int,
) -> Payload:
    """Files of a ConfigMap or Secret source, with the kubelet's errors for missing ones."""
    if data is None:
        if optional:
            return {}
        raise MountError(f'{kind} "{name}" not found')
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    payload: Payload = {}
    for item in items:
        key = item.get("key", "")
        if key not in data:
            if optional:
                continue
            if kind == "configmap":
                raise MountError(f"configmap references non-existent config key: {key}")
            raise MountError(f"references non-existent secret key: {key}")
        payload[item.get("path") or key] = (data[key], _mode(item.get("mode"), mode))
    return payload


def configmap_data(obj: dict[str, Any] | None) -> dict[str, bytes] | None:
    """A ConfigMap's keys as bytes (`data` as UTF-8, `binaryData` decoded)."""
    if obj is None:
        return None
    result = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    for key, value in (obj.get("binaryData") or {}).items():
        result[key] = base64.b64decode(value)
    return result


def secret_data(obj: dict[str, Any] | None) -> dict[str, bytes] | None:
    """A Secret's keys as bytes."""
    if obj is None:
        return None
    result = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    for key, value in (obj.get("stringData") or {}).items():
        result[key] = str(value).encode()
    return result


def format_map(values: dict[str, str]) -> str:
    """Labels or annotations as the downward API writes them: sorted `key="value"` lines."""
    return "\n".join(
        f"{key}={json.dumps(values[key], ensure_ascii=False)}" for key in sorted(values)
    )


def downward_value(pod: dict[str, Any], item: dict[str, Any], node_allocatable: Any) -> str:
    """One downward API item's file content."""
    meta = pod["metadata"]
    ref = item.get("fieldRef")
    if ref:
        path = ref.get("fieldPath", "")
        for prefix, source in (
            ("metadata.labels", "labels"),
            ("metadata.annotations", "annotations"),
        ):
            values = meta.get(source) or {}
            if path == prefix:
                return format_map(values)
            if path.startswith(prefix + "['") and path.endswith("']"):
                return str(values.get(path[len(prefix) + 2 : -2], ""))
        simple = {
            "metadata.name": meta.get("name", ""),
            "metadata.namespace": meta.get("namespace", ""),
            "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
            "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
            "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
            "status.podIP": (pod.get("status") or {}).get("podIP", ""),
        }
        if path not in simple:
            raise MountError(f"unsupported fieldPath: {path}")
        return str(simple[path])
    ref = item.get("resourceFieldRef") or {}
    resource = ref.get("resource", "")
    containers = (pod.get("spec") or {}).get("containers") or []
    container = next(
        (c for c in containers if c.get("name") == ref.get("containerName")),
        containers[0] if containers else {},
    )
    section, _, name = resource.partition(".")
    if section not in ("limits", "requests") or not name:
        raise MountError(f"unsupported resource: {resource}")
    resources = container.get("resources") or {}
    value = (resources.get(section) or {}).get(name)
    if value is None and section == "requests":
        value = (resources.get("limits") or {}).get(name)
    if value is None:
        value = node_allocatable.get(name, 0) if section == "limits" else 0
    divisor = quantity.parse(ref.get("divisor") or "1") or 1
    return str(math.ceil(quantity.parse(value) / divisor))


def service_account_token(pod: dict[str, Any], source: dict[str, Any]) -> bytes:
    """A token-shaped stand-in for a projected ServiceAccount token (kubesim signs nothing)."""
    meta = pod["metadata"]
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    issued = int(time.time())

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    claims = {
        "aud": [source.get("audience") or "https://kubernetes.default.svc.cluster.local"],
        "exp": issued + int(source.get("expirationSeconds") or 3607),
        "iat": issued,
        "iss": "https://kubernetes.default.svc.cluster.local",
        "kubernetes.io": {
            "namespace": meta.get("namespace", ""),
            "pod": {"name": meta.get("name", ""), "uid": meta.get("uid", "")},
            "serviceaccount": {"name": account},
        },
        "sub": f"system:serviceaccount:{meta.get('namespace', '')}:{account}",
    }
    return f"{part({'alg': 'none', 'kid': 'kubesim'})}.{part(claims)}.kubesim".encode()


# ----- the atomic writer ------------------------------------------------------------------------


def write_atomic(target: Path, payload: Payload) -> None:
    """Replace a volume's content in one rename of `..data`, as the kubelet's atomic writer does."""
    target.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
    # A fresh directory per version, named as the kubelet's (`..2025_01_31_12_00_00.<random>`).
    version = Path(tempfile.mkdtemp(prefix=f"..{stamp}.", dir=target))
    version.chmod(0o755)
    for rel, (content, mode) in payload.items():
        path = resolve_within(version, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created with its mode (a Secret key or a token is never readable more widely, even
        # for a moment), then set exactly, whatever the umask took away.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(fd, mode)
            out.write(content)
    staging = target / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    staging.symlink_to(version.name)
    os.replace(staging, target / "..data")
    tops = {rel.strip("/").split("/")[0] for rel in payload}
    for top in tops:
        link = target / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in target.iterdir():
        if entry.name.startswith(".."):
            if entry.name not in ("..data", version.name):
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.name not in tops:
            entry.unlink()


# ----- one pod's volumes ------------------------------------------------------------------------


@dataclass
class Volume:
    """One set-up volume: the root its paths resolve in and where its content starts."""

    name: str
    kind: str
    root: Path
    base: str = ""
    payload: Payload | None = None

    @property
    def read_only(self) -> bool:
        return self.kind in WRITTEN_KINDS


class PodVolumes:
    """Sets up a pod's volumes on its node, keeps written ones current, and maps container paths.

    With `materialize=False` only what the kubelet checks happens (hostPath types and directories,
    referenced ConfigMaps and Secrets exist); nothing is written for the pod itself. The kubelet
    uses that for pods without runners, since no program could read the files.
    """

    def __init__(
        self,
        filesystems: NodeFilesystems,
        store: Any,
        pod: dict[str, Any],
        *,
        materialize: bool,
        node_allocatable: dict[str, Any] | None = None,
    ) -> None:
        self.fs = filesystems
        self.store = store
        self.pod = pod
        self.node = pod["spec"]["nodeName"]
        self.namespace = pod["metadata"].get("namespace", "")
        self.uid = pod["metadata"]["uid"]
        self.materialize = materialize
        self.node_allocatable = node_allocatable or {}
        self.specs: dict[str, dict[str, Any]] = {
            v.get("name", ""): v for v in (pod.get("spec") or {}).get("volumes") or []
        }
        self.mounted: dict[str, Volume] = {}
        # (resource, name) of every ConfigMap and Secret the volumes read.
        self.references: set[tuple[str, str]] = set()
        for spec in self.specs.values():
            self.references |= _references(spec)

    @property
    def pod_dir(self) -> Path:
        return self.fs.pod_dir(self.node, self.uid)

    def mount_all(self) -> list[tuple[str, str]]:
        """Set up every volume not yet set up; returns (volume, error) for those that failed."""
        failures = []
        for name, spec in self.specs.items():
            if name in self.mounted:
                continue
            try:
                self.mounted[name] = self._mount(name, spec)
            except MountError as exc:
                failures.append((name, str(exc)))
            except OSError as exc:
                failures.append((name, f"{exc.strerror or exc}: {exc.filename or ''}".strip()))
        return failures

    def _mount(self, name: str, spec: dict[str, Any]) -> Volume:
        kind = next((k for k in spec if k != "name"), "")
        if kind == "hostPath":
            return self._host_path(name, spec["hostPath"] or {})
        if kind not in PLUGIN_DIRS:
            # Volume types kubesim does not simulate (PVCs, CSI, ...) mount as empty directories.
            kind = "emptyDir"
        directory = self.pod_dir / "volumes" / PLUGIN_DIRS[kind] / name
        volume = Volume(name, kind, directory)
        if kind == "emptyDir":
            if self.materialize:
                directory.mkdir(parents=True, exist_ok=True)
            return volume
        payload = self._payload(kind, spec[kind] or {})
        if self.materialize:
            write_atomic(directory, payload)
        volume.payload = payload
        return volume

    def _host_path(self, name: str, source: dict[str, Any]) -> Volume:
        path = source.get("path") or ""
        if not path.startswith("/"):
            raise MountError(f"hostPath {path!r} must be an absolute path")
        root = self.fs.root(self.node)
        target = resolve_within(root, path)
        check_host_path(target, path, source.get("type") or "")
        return Volume(name, "hostPath", root, path)

    def _payload(self, kind: str, source: dict[str, Any]) -> Payload:
        mode = _mode(source.get("defaultMode"), DEFAULT_MODE)
        if kind == "configMap":
            return self._configmap(source, mode)
        if kind == "secret":
            name = source.get("secretName", "")
            data = secret_data(self._get(SECRET_KEY, name))
            return _keyed_payload(
                "secret", name, data, source.get("items"), bool(source.get("optional")), mode
            )
        if kind == "downwardAPI":
            return self._downward(source.get("items") or [], mode)
        payload: Payload = {}
        for projection in source.get("sources") or []:
            if "configMap" in projection:
                payload.update(self._configmap(projection["configMap"] or {}, mode))
            elif "secret" in projection:
                sub = projection["secret"] or {}
                data = secret_data(self._get(SECRET_KEY, sub.get("name", "")))
                payload.update(
                    _keyed_payload(
                        "secret",
                        sub.get("name", ""),
                        data,
                        sub.get("items"),
                        bool(sub.get("optional")),
                        mode,
                    )
                )
            elif "downwardAPI" in projection:
                items = (projection["downwardAPI"] or {}).get("items") or []
                payload.update(self._downward(items, mode))
            elif "serviceAccountToken" in projection:
                sub = projection["serviceAccountToken"] or {}
                token = service_account_token(self.pod, sub)
                payload[sub.get("path") or "token"] = (token, _mode(None, mode))
        return payload

    def _configmap(self, source: dict[str, Any], mode: int) -> Payload:
        name = source.get("name", "")
        data = configmap_data(self._get(CONFIGMAP_KEY, name))
        return _keyed_payload(
            "configmap", name, data, source.get("items"), bool(source.get("optional")), mode
        )

    def _downward(self, items: list[dict[str, Any]], mode: int) -> Payload:
        return {
            item.get("path", ""): (
                downward_value(self.pod, item, self.node_allocatable).encode(),
                _mode(item.get("mode"), mode),
            )
            for item in items
        }

    def _get(self, key: tuple[str, str], name: str) -> dict[str, Any] | None:
        stored = self.store.peek(key, self.namespace, name)
        return stored.obj if stored is not None else None

    # ----- updates --------------------------------------------------------------------------

    def refresh(self, pod: dict[str, Any] | None = None) -> None:
        """Rewrite written volumes whose content changed (a ConfigMap, Secret or the pod's own
        labels and annotations); a source that became unreadable keeps its last content."""
        if pod is not None:
            self.pod = pod
        for volume in self.mounted.values():
            if volume.payload is None:
                continue
            try:
                payload = self._payload(volume.kind, self.specs[volume.name][volume.kind] or {})
            except MountError:
                continue
            if payload == volume.payload:
                continue
            volume.payload = payload
            if self.materialize:
                write_atomic(volume.root, payload)

    def prepare_container(self, container: dict[str, Any], env: dict[str, str]) -> None:
        """Set up a starting container's subPath mounts: written volumes are copied, as the
        kubelet bind-mounts the file itself (later updates do not reach a subPath mount)."""
        if not self.materialize:
            return
        name = container.get("name", "")
        for index, mount in enumerate(container.get("volumeMounts") or []):
            sub = _sub_path(mount, env)
            volume = self.mounted.get(mount.get("name", ""))
            if not sub or volume is None:
                continue
            if volume.read_only:
                source = resolve_within(volume.root, posixpath.join(volume.base, sub))
                target = self.pod_dir / "volume-subpaths" / volume.name / name / str(index)
                shutil.rmtree(target, ignore_errors=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                if source.is_dir():
                    shutil.copytree(source, target, symlinks=True)
                elif source.exists():
                    shutil.copy2(source, target)
            else:
                resolve_within(volume.root, posixpath.join(volume.base, sub)).mkdir(
                    parents=True, exist_ok=True
                )

    # ----- paths ----------------------------------------------------------------------------

    def path(
        self,
        container: dict[str, Any],
        env: dict[str, str],
        path: str,
        *,
        write: bool = False,
        _links: int = 0,
    ) -> Path:
        """A container path on this machine, through the container's volumeMounts. An absolute
        symlink inside a non-hostPath volume (e.g. `/config/config.yaml -> /available-configs/x`
        in an emptyDir) is followed through the mounts again, as in the container's namespace."""
        if _links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
        wanted = posixpath.normpath("/" + path.lstrip("/"))
        best: tuple[int, dict[str, Any]] | None = None
        for index, mount in enumerate(container.get("volumeMounts") or []):
            point = posixpath.normpath(mount.get("mountPath") or "/")
            inside = wanted == point or wanted.startswith(point.rstrip("/") + "/")
            if inside and (best is None or len(point) > len(best[1].get("mountPath") or "")):
                best = (index, {**mount, "mountPath": point})
        if best is None:
            mounts = ", ".join(m.get("mountPath", "") for m in container.get("volumeMounts") or [])
            raise PathNotMounted(
                errno.ENOENT,
                f"container {container.get('name', '')!r} has no volumeMount covering {wanted} "
                f"(kubesim simulates no image filesystem; mounts: {mounts or 'none'})",
                wanted,
            )
        index, mount = best
        volume = self.mounted.get(mount.get("name", ""))
        if volume is None or not self.materialize:
            raise PathNotMounted(
                errno.ENOENT, f"volume {mount.get('name', '')!r} is not set up", wanted
            )
        if write and (volume.read_only or mount.get("readOnly")):
            raise PermissionError(errno.EROFS, "Read-only file system", wanted)
        rest = wanted[len(mount["mountPath"]) :].lstrip("/")
        sub = _sub_path(mount, env)
        if sub and volume.read_only:
            snapshot: Path = (
                self.pod_dir / "volume-subpaths" / volume.name / str(container.get("name", ""))
            ) / str(index)
            if not rest:
                return snapshot
            return resolve_within(snapshot, rest)
        if volume.kind == "hostPath":
            # hostPath keeps chroot semantics at the node's root (node programs rely on it).
            return resolve_within(volume.root, posixpath.join(volume.base, sub, rest))

        def across_mounts(target: str) -> Path:
            return self.path(container, env, target, write=write, _links=_links + 1)

        return resolve_within(
            volume.root, posixpath.join(volume.base, sub, rest), absolute=across_mounts
        )

    def teardown(self) -> None:
        """Remove everything kept for this pod (emptyDirs, written volumes, subPath copies)."""
        if self.materialize:
            shutil.rmtree(self.pod_dir, ignore_errors=True)


def _references(spec: dict[str, Any]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    if spec.get("configMap"):
        found.add(("configmaps", spec["configMap"].get("name", "")))
    if spec.get("secret"):
        found.add(("secrets", spec["secret"].get("secretName", "")))
    for projection in (spec.get("projected") or {}).get("sources") or []:
        if projection.get("configMap"):
            found.add(("configmaps", projection["configMap"].get("name", "")))
        if projection.get("secret"):
            found.add(("secrets", projection["secret"].get("name", "")))
    return found


def _sub_path(mount: dict[str, Any], env: dict[str, str]) -> str:
    if mount.get("subPath"):
        return str(mount["subPath"])
    expression = mount.get("subPathExpr")
    if not expression:
        return ""
    result = str(expression)
    for name, value in env.items():
        result = result.replace(f"$({name})", value)
    return result


def check_host_path(target: Path, path: str, kind: str) -> None:
    """The kubelet's hostPath type check (creating what the *OrCreate types and, like the
    container runtime, an untyped missing path as a directory)."""
    try:
        info: os.stat_result | None = target.stat()
    except FileNotFoundError:
        info = None
    if info is None and kind in ("", "DirectoryOrCreate"):
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        return
    if info is None and kind == "FileOrCreate":
        if not target.parent.is_dir():
            raise MountError(f"open {path}: no such file or directory")
        target.touch(mode=0o644)
        return
    mode = info.st_mode if info is not None else 0
    checks = {
        "DirectoryOrCreate": (stat.S_ISDIR, "a directory"),
        "Directory": (stat.S_ISDIR, "a directory"),
        "FileOrCreate": (stat.S_ISREG, "a file"),
        "File": (stat.S_ISREG, "a file"),
        "Socket": (stat.S_ISSOCK, "a socket file"),
        "CharDevice": (stat.S_ISCHR, "a character device"),
        "BlockDevice": (stat.S_ISBLK, "a block device"),
    }
    if kind == "":
        return
    if kind not in checks:
        raise MountError(f"invalid HostPathType {kind}")
    test, what = checks[kind]
    if info is None or not test(mode):
        raise MountError(f"hostPath type check failed: {path} is not {what}")


def node_allocatable(node: dict[str, Any] | None) -> dict[str, Any]:
    """A node's allocatable map as raw quantities (for downward API limits fallbacks)."""
    status = (node or {}).get("status") or {}
    return dict(status.get("allocatable") or status.get("capacity") or {})
