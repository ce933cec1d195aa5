"""Which container images exist: image references read as the kubelet and containerd read them,
the catalog of registries and images kubesim's nodes can pull, and the pull decisions the
simulated kubelet acts on (pure functions: a reference and the catalog in, an outcome out).

Facts followed (Kubernetes 1.35 kubelet, containerd 2.0 with its transfer service):

* The kubelet parses an image with the distribution reference grammar; a name it cannot parse is
  `InvalidImageName` (`Failed to apply default image tag "X": couldn't parse image name "X":
  invalid reference format`), never pulled.
* containerd pulls the normalized reference (`nginx` is `docker.io/library/nginx:latest`) and
  wraps what went wrong: `failed to pull and unpack image "REF": failed to resolve image: WHY`.
  A registry that does not know the tag (or, following the distribution spec, the repository)
  answers 404, which reaches the kubelet as gRPC NotFound (`rpc error: code = NotFound desc =
  ...: REF: not found`); Docker Hub answers an unknown repository with an authorization error,
  and a host that does not resolve fails in DNS; both are gRPC Unknown, whose code the kubelet
  strips from the message.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
# Where pulls of docker.io images go (the name in containerd's request URLs).
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"
_LEGACY_DOCKER_HUB = "index.docker.io"
_OFFICIAL = "library/"
# The nodes' DNS resolver as it shows in a failed lookup (systemd-resolved's stub on Ubuntu).
NODE_RESOLVER = "127.0.0.53:53"
_MAX_PATH = 255

# The distribution reference grammar (github.com/distribution/reference), in Python's syntax.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_HOST = rf"(?:{_DOMAIN_NAME}|\[(?:[a-fA-F0-9:]+)\])"
_DOMAIN_AND_PORT = rf"{_HOST}(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"((?:{_DOMAIN_AND_PORT}/)?{_REMOTE_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII
)
_NAME = re.compile(rf"(?:({_DOMAIN_AND_PORT})/)?({_REMOTE_NAME})", re.ASCII)
_IDENTIFIER = re.compile(r"[a-f0-9]{64}")
# Digest algorithms the kubelet's parser accepts, with their hex lengths.
_DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
_GLOB = re.compile(r"[*?\[]")


class InvalidReference(ValueError):
    """An image name the reference grammar rejects; the message is the parser's."""


@dataclass(frozen=True)
class Reference:
    """A parsed, normalized image reference (tag `latest` when it names neither tag nor
    digest)."""

    domain: str
    path: str
    tag: str = ""
    digest: str = ""

    @property
    def name(self) -> str:
        """The repository: `docker.io/library/nginx`."""
        return f"{self.domain}/{self.path}"

    @property
    def host(self) -> str:
        """The registry's host name without a port."""
        if self.domain.startswith("["):
            return self.domain[1 : self.domain.index("]")]
        return self.domain.rsplit(":", 1)[0] if ":" in self.domain else self.domain

    def __str__(self) -> str:
        """The reference containerd pulls: a digest wins over a tag, as its parser keeps it."""
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or 'latest'}"


def _split_domain(name: str) -> tuple[str, str]:
    """Docker's rule for where the registry ends: a first component with a dot, a colon or
    capitals, or `localhost`, is a host; anything else is a Docker Hub repository."""
    first, slash, rest = name.partition("/")
    if not slash:
        return DOCKER_HUB, _OFFICIAL + name
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remote = first, rest
    else:
        domain, remote = DOCKER_HUB, name
    if domain == _LEGACY_DOCKER_HUB:
        domain = DOCKER_HUB
    if domain == DOCKER_HUB and "/" not in remote:
        remote = _OFFICIAL + remote
    return domain, remote


def _check_digest(digest: str) -> None:
    algorithm, _, encoded = digest.partition(":")
    length = _DIGEST_LENGTHS.get(algorithm)
    if length is None:
        raise InvalidReference("unsupported digest algorithm")
    if len(encoded) != length:
        raise InvalidReference("invalid checksum digest length")
    if not re.fullmatch(r"[a-f0-9]+", encoded):
        raise InvalidReference("invalid checksum digest format")


@functools.lru_cache(maxsize=4096)
def parse(image: str) -> Reference:
    """Parse an image name as the kubelet does (the distribution reference grammar with Docker
    Hub normalization); raises InvalidReference with the parser's message. Remembered per name
    (a rollout starts the same few images on thousands of nodes; errors are not remembered)."""
    if _IDENTIFIER.fullmatch(image):
        raise InvalidReference(
            f"invalid repository name ({image}), cannot specify 64-byte hexadecimal strings"
        )
    domain, remainder = _split_domain(image)
    remote = remainder.split(":", 1)[0]
    if remote.lower() != remote:
        raise InvalidReference(
            f"invalid reference format: repository name ({remote}) must be lowercase"
        )
    full = f"{domain}/{remainder}"
    match = _REFERENCE.fullmatch(full)
    if match is None:
        lowered = full.lower()
        if lowered != full and _REFERENCE.fullmatch(lowered):
            raise InvalidReference("repository name must be lowercase")
        raise InvalidReference("invalid reference format")
    name = _NAME.fullmatch(match.group(1))
    # The grammar may read an odd host (`a_b.example`) as part of the path; the host is then
    # still the first component, as Docker's split above says.
    path = name.group(2) if name is not None and name.group(1) else remainder.split("@")[0]
    path = path.rsplit(":", 1)[0] if ":" in path.rsplit("/", 1)[-1] else path
    if len(path) > _MAX_PATH:
        raise InvalidReference(f"repository name must not be more than {_MAX_PATH} characters")
    digest = match.group(3) or ""
    if digest:
        _check_digest(digest)
    tag = match.group(2) or ("" if digest else "latest")
    return Reference(domain, path, tag, digest)


def invalid_name_message(image: str, error: InvalidReference) -> str:
    """The kubelet's message for an image it cannot parse (Event `InspectFailed`, waiting
    reason `InvalidImageName`)."""
    return (
        f'Failed to apply default image tag "{image}": couldn\'t parse image name "{image}": '
        f"{error}"
    )


# ----- the catalog ------------------------------------------------------------------------------

# Tags a default entry accepts besides its listed ones: `latest` and anything that reads like a
# version (`1.27`, `v0.20.0`, `580.95.05-ubuntu22.04`), so that other releases of a real image
# pull while a made-up word does not.
VERSION_TAGS = ("latest", "[0-9]*", "v[0-9]*")

# Real public images, by repository, with the named tags each has besides VERSION_TAGS: what the
# chart and its values, the demo, the examples and the tests use, and what people type into
# `kubectl run`. Their registries resolve; other hosts do not (see DEFAULT_REGISTRIES).
DEFAULT_IMAGES: dict[str, tuple[str, ...]] = {
    # NVIDIA's GPU Operator release and its operands (nvcr.io, NGC's public catalog).
    "nvcr.io/nvidia/gpu-operator": ("main-latest",),
    "nvcr.io/nvidia/driver": (),
    "nvcr.io/nvidia/k8s/container-toolkit": (),
    "nvcr.io/nvidia/k8s-device-plugin": (),
    "nvcr.io/nvidia/k8s/dcgm-exporter": (),
    "nvcr.io/nvidia/cloud-native/dcgm": (),
    "nvcr.io/nvidia/cloud-native/k8s-driver-manager": (),
    "nvcr.io/nvidia/cloud-native/k8s-mig-manager": (),
    "nvcr.io/nvidia/cloud-native/gpu-operator-validator": (),
    "nvcr.io/nvidia/cloud-native/nvidia-fs": (),
    "nvcr.io/nvidia/cloud-native/gdrdrv": (),
    "nvcr.io/nvidia/cloud-native/vgpu-device-manager": (),
    "nvcr.io/nvidia/cloud-native/nvidia-sandbox-device-plugin": (),
    "nvcr.io/nvidia/cloud-native/k8s-cc-manager": (),
    "nvcr.io/nvidia/cloud-native/k8s-kata-manager": (),
    "nvcr.io/nvidia/kubevirt-gpu-device-plugin": (),
    "nvcr.io/nvidia/dra-driver-nvidia-gpu": (),
    "nvcr.io/nvidia/k8s-dra-driver-gpu": (),
    "nvcr.io/nvidia/gpu-feature-discovery": (),
    "nvcr.io/nvidia/k8s/cuda-sample": (),
    "nvcr.io/nvidia/cuda": (),
    # This project's operator image, and Node Feature Discovery (the chart's sub-chart).
    "ghcr.io/gpu-operator-py/gpu-operator": (),
    "registry.k8s.io/nfd/node-feature-discovery": (),
    # Kubernetes' own images.
    "registry.k8s.io/pause": (),
    "registry.k8s.io/kube-apiserver": (),
    "registry.k8s.io/kube-controller-manager": (),
    "registry.k8s.io/kube-scheduler": (),
    "registry.k8s.io/kube-proxy": (),
    "registry.k8s.io/etcd": (),
    "registry.k8s.io/coredns/coredns": (),
    "registry.k8s.io/metrics-server/metrics-server": (),
    "registry.k8s.io/kube-state-metrics/kube-state-metrics": (),
    "registry.k8s.io/ingress-nginx/controller": (),
    "registry.k8s.io/e2e-test-images/agnhost": (),
    "registry.k8s.io/e2e-test-images/busybox": (),
    "registry.k8s.io/sig-storage/csi-node-driver-registrar": (),
    # Docker Hub's official images most manifests and `kubectl run` lines use.
    "docker.io/library/busybox": ("musl", "glibc", "uclibc", "stable", "unstable"),
    "docker.io/library/alpine": ("edge",),
    "docker.io/library/nginx": ("stable*", "mainline*", "alpine*", "perl", "bookworm*"),
    "docker.io/library/ubuntu": ("jammy*", "noble*", "focal*", "oracular*", "rolling", "devel"),
    "docker.io/library/debian": ("bookworm*", "bullseye*", "trixie*", "stable*", "sid*"),
    "docker.io/library/fedora": ("rawhide",),
    "docker.io/library/rockylinux": (),
    "docker.io/library/almalinux": (),
    "docker.io/library/amazonlinux": (),
    "docker.io/library/python": ("alpine*", "slim*", "bookworm*"),
    "docker.io/library/golang": ("alpine*", "bookworm*"),
    "docker.io/library/node": ("lts*", "current*", "alpine*", "slim*"),
    "docker.io/library/eclipse-temurin": (),
    "docker.io/library/redis": ("alpine*", "bookworm*"),
    "docker.io/library/postgres": ("alpine*", "bookworm*"),
    "docker.io/library/mysql": ("lts*", "oracle*"),
    "docker.io/library/mariadb": ("lts*",),
    "docker.io/library/mongo": (),
    "docker.io/library/memcached": ("alpine*",),
    "docker.io/library/rabbitmq": ("management*", "alpine*"),
    "docker.io/library/httpd": ("alpine*",),
    "docker.io/library/haproxy": ("lts*", "alpine*"),
    "docker.io/library/traefik": (),
    "docker.io/library/registry": (),
    "docker.io/library/hello-world": ("linux",),
    "docker.io/nvidia/cuda": (),
    "docker.io/curlimages/curl": (),
    "docker.io/bitnami/kubectl": (),
    "docker.io/grafana/grafana": (),
    "docker.io/prom/prometheus": (),
    "docker.io/hashicorp/http-echo": (),
    "quay.io/prometheus/prometheus": (),
    "quay.io/prometheus/node-exporter": (),
    "quay.io/kubevirt/virt-launcher": (),
    "quay.io/kubevirt/virt-handler": (),
}

# Public registries that resolve even where the catalog lists none of their images (a pull from
# them fails with `not found`, not with a DNS error).
DEFAULT_REGISTRIES = (
    "docker.io",
    "nvcr.io",
    "registry.k8s.io",
    "quay.io",
    "ghcr.io",
    "gcr.io",
    "mcr.microsoft.com",
    "public.ecr.aws",
    "registry.gitlab.com",
)


@dataclass(frozen=True)
class CatalogEntry:
    """Images that exist: a registry host, a repository path and a tag, each a shell-style
    glob; no tags means every tag and digest."""

    host: str
    path: str
    tags: tuple[str, ...] = ()

    def knows_repository(self, ref: Reference) -> bool:
        return fnmatch.fnmatchcase(ref.domain, self.host) and fnmatch.fnmatchcase(
            ref.path, self.path
        )

    def has(self, ref: Reference) -> bool:
        if not self.knows_repository(ref):
            return False
        if not self.tags or ref.digest:
            # A digest kubesim cannot check: every digest of a repository it knows exists.
            return True
        return any(fnmatch.fnmatchcase(ref.tag, t) for t in self.tags)


def entry(pattern: str) -> CatalogEntry:
    """A catalog entry from `[HOST/]PATH[:TAG]`, normalized as an image name is (`nginx` is
    `docker.io/library/nginx`). Each part may be a glob (`registry.local/*` is every image
    there; a first component with a glob character is a host, so `*/*` is every image
    anywhere); without a tag every tag and digest exists. Raises ValueError naming the
    pattern."""
    text = pattern.strip()
    if not text or "@" in text or any(c.isspace() for c in text):
        raise ValueError(
            f"image pattern {pattern!r}: expected [HOST/]PATH[:TAG] (globs allowed, no digest)"
        )
    first, slash, rest = text.partition("/")
    if slash and _GLOB.search(first):
        host, remainder = first, rest
    else:
        host, remainder = _split_domain(text)
    path, colon, tag = remainder.rpartition(":") if ":" in remainder else (remainder, "", "")
    if colon and "/" in tag:  # a colon inside the path (never valid), not a tag separator
        path, tag = remainder, ""
    if not path or (colon and not tag):
        raise ValueError(f"image pattern {pattern!r}: empty repository or tag")
    if path != path.lower() and not _GLOB.search(path):
        raise ValueError(f"image pattern {pattern!r}: repository names are lowercase")
    return CatalogEntry(host, path, (tag,) if tag else ())


@dataclass(frozen=True)
class PullFailure:
    """Why containerd could not pull an image: its gRPC code and message."""

    code: str
    detail: str

    @property
    def message(self) -> str:
        """What the kubelet reports (Event `Failed`, waiting message of ErrImagePull): the
        runtime's error, without the code when it is Unknown, as the kubelet strips it."""
        if self.code == "Unknown":
            return self.detail
        return f"rpc error: code = {self.code} desc = {self.detail}"


class ImageCatalog:
    """The registries kubesim's nodes reach and the images in them (`Cluster.images`)."""

    def __init__(
        self,
        images: Iterable[str] = (),
        *,
        registries: Iterable[str] = DEFAULT_REGISTRIES,
        defaults: bool = True,
    ) -> None:
        self.entries: list[CatalogEntry] = []
        self.registries: set[str] = set()
        # image -> pull's answer, until the catalog changes (thousands of nodes pull the same
        # few images).
        self._pulls: dict[str, PullFailure | None] = {}
        if defaults:
            for repository, tags in DEFAULT_IMAGES.items():
                host, _, path = repository.partition("/")
                self.entries.append(CatalogEntry(host, path, (*VERSION_TAGS, *tags)))
        self.add_registry(*registries)
        self.add(*images)

    def add(self, *patterns: str) -> None:
        """Make images exist (see `entry` for the patterns); their registries resolve."""
        self.entries.extend(entry(p) for p in patterns)
        self._pulls.clear()

    def add_registry(self, *hosts: str) -> None:
        """Make registry hosts (`registry.local`, `10.0.0.5:5000`) resolve, with no images."""
        for host in hosts:
            name = host.strip().rstrip("/")
            if not name or "/" in name or any(c.isspace() for c in name):
                raise ValueError(f"registry {host!r}: expected a host name, optionally :port")
            self.registries.add(DOCKER_HUB if name == _LEGACY_DOCKER_HUB else name)
        self._pulls.clear()

    def reachable(self, ref: Reference) -> bool:
        """Whether the reference's registry answers (its host resolves)."""
        if ref.domain in self.registries:
            return True
        return any(fnmatch.fnmatchcase(ref.domain, e.host) for e in self.entries)

    def pull(self, image: str) -> PullFailure | None:
        """What pulling `image` gives: None when it exists, otherwise containerd's failure
        (`image` must parse; see `parse`)."""
        try:
            return self._pulls[image]
        except KeyError:
            found = self._pulls[image] = pull_failure(parse(image), self)
            return found


def _manifest_url(ref: Reference) -> str:
    endpoint = DOCKER_HUB_ENDPOINT if ref.domain == DOCKER_HUB else ref.domain
    scheme = "http" if ref.host == "localhost" else "https"
    return f"{scheme}://{endpoint}/v2/{ref.path}/manifests/{ref.digest or ref.tag}"


def _unreachable(ref: Reference) -> str:
    """The dial error for a registry nothing answers: a name that does not resolve, or an
    address where nothing listens."""
    host = ref.host
    after_host = ref.domain.rsplit("]", 1)[-1]
    port = after_host.rpartition(":")[2] if ":" in after_host else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host == "localhost" or address is not None:
        ip = "127.0.0.1" if address is None else str(address)
        shown = f"[{ip}]" if ":" in ip else ip
        target = f"{shown}:{port or ('80' if host == 'localhost' else '443')}"
        return f"dial tcp {target}: connect: connection refused"
    return f"dial tcp: lookup {host} on {NODE_RESOLVER}: no such host"


def pull_failure(ref: Reference, catalog: ImageCatalog) -> PullFailure | None:
    """The pull decision: None when the catalog has the image; otherwise what containerd
    answers (unreachable registry, unknown repository, unknown tag)."""
    if any(e.has(ref) for e in catalog.entries):
        return None
    prefix = f'failed to pull and unpack image "{ref}": failed to resolve image: '
    if not catalog.reachable(ref):
        why = f'failed to do request: Head "{_manifest_url(ref)}": {_unreachable(ref)}'
        return PullFailure("Unknown", prefix + why)
    known = any(e.knows_repository(ref) for e in catalog.entries)
    if ref.domain == DOCKER_HUB and not known:
        return PullFailure(
            "Unknown",
            prefix + "pull access denied, repository does not exist or may require "
            "authorization: server message: insufficient_scope: authorization failed",
        )
    return PullFailure("NotFound", f"{prefix}{ref}: not found")


# ----- the kubelet's image step -----------------------------------------------------------------


@dataclass(frozen=True)
class ImageStep:
    """What the kubelet does about a container's image before creating it."""

    # "present": use the node's copy; "pull": pull it; "invalid": InvalidImageName;
    # "never": ErrImageNeverPull (not on the node, policy Never).
    action: str
    # The node's name for the image (normalized reference), "" for an invalid one.
    key: str = ""
    message: str = ""


def image_step(image: str, policy: str, present: Iterable[str]) -> ImageStep:
    """The kubelet's decision for one container start: parse the name, then the pull policy
    against what the node has (`Always` pulls, `IfNotPresent` pulls what is missing, `Never`
    never pulls)."""
    try:
        key = str(parse(image))
    except InvalidReference as error:
        return ImageStep("invalid", "", invalid_name_message(image, error))
    on_node = key in (present if isinstance(present, set | frozenset) else set(present))
    if policy == "Never":
        if on_node:
            return ImageStep("present", key)
        return ImageStep(
            "never", key, f'Container image "{image}" is not present with pull policy of Never'
        )
    if policy != "Always" and on_node:
        return ImageStep("present", key)
    return ImageStep("pull", key)


def next_backoff(previous: float | None, since_last: float, initial: float, cap: float) -> float:
    """The image pull back-off after a failed pull (client-go's flowcontrol.Backoff, as the
    kubelet uses it): the initial delay, doubling per failure up to the cap, starting over when
    the last failure is older than twice the cap."""
    if previous is None or since_last > 2 * cap:
        return min(initial, cap)
    return min(previous * 2, cap)
