"""What kubesim exposes on its machine: credential files readable by their owner only, and, without
authentication, answers only to requests addressed to a loopback name (DNS rebinding)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim_helpers import KUBECTL, kubectl, needs_kubectl
from waiting import within

import kubesim
from kubesim.auth import loopback
from kubesim.controllers import volumes


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def no_chmod_after_create(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credential files must be created with their mode: a chmod by path comes too late."""

    chmod = os.chmod

    def refuse(path: Any, mode: int, *args: Any, **kwargs: Any) -> None:
        if not os.path.isdir(path):
            raise AssertionError(f"chmod after the file was created: {path}")
        chmod(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "chmod", refuse)


# ----- credential files -------------------------------------------------------------------------


@pytest.mark.parametrize("authentication", [True, False], ids=["authenticating", "no-auth"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "world-readable-file"])
async def test_kubesim_serve_writes_its_admin_kubeconfig_owner_only(
    tmp_path: Path, authentication: bool, existing: bool
) -> None:
    config = tmp_path / "kubeconfig"
    if existing:  # a kubeconfig left from an earlier run, readable by everyone
        config.write_text("old\n")
        config.chmod(0o644)
    exe = str(Path(sys.executable).parent / "kubesim")
    args = ["serve", "--kubeconfig-out", str(config)]
    with umask(0o022):  # the usual umask: files are created 0644 unless asked otherwise
        proc = await asyncio.create_subprocess_exec(
            exe,
            *args,
            *([] if authentication else ["--no-authentication"]),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    try:
        await within(proc.stdout.readline(), "the served URL")
        assert mode(config) == 0o600, oct(mode(config))
        assert yaml.safe_load(config.read_text())["users"][0]["user"]["token"]  # the secret
    finally:
        proc.terminate()
        assert await within(proc.wait(), "kubesim serve to exit") == 0


async def test_every_credential_file_kubesim_writes_is_created_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_chmod_after_create: None
) -> None:
    loaded: dict[str, int] = {}
    load = ssl.SSLContext.load_cert_chain

    def record(self: ssl.SSLContext, certfile: Any, keyfile: Any = None, **kw: Any) -> None:
        loaded.update(cert=mode(Path(certfile)), key=mode(Path(keyfile)))
        load(self, certfile, keyfile, **kw)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", record)
    with umask(0o022):
        # The admin kubeconfig, in a temporary directory and where asked; the serving key.
        async with kubesim.Cluster(authentication=True) as sim:
            assert mode(sim.kubeconfig_path) == 0o600
            assert loaded == {"cert": 0o600, "key": 0o600}
            # Kubeconfigs for other users (tests, the demo's operator and pods).
            other = sim.auth.write_kubeconfig(sim.auth.token_for("wes"), tmp_path / "a" / "wes")
            assert mode(other) == 0o600
        async with kubesim.Cluster(kubeconfig_path=tmp_path / "admin") as sim:
            assert mode(tmp_path / "admin") == 0o600
        # Secret keys and tokens in pod volumes: created with the pod's mode, not widened first.
        volumes.write_atomic(tmp_path / "vol", {"token": (b"t", 0o600), "ca.crt": (b"c", 0o644)})
        assert mode(tmp_path / "vol" / "token") == 0o600
        assert mode(tmp_path / "vol" / "ca.crt") == 0o644


# ----- Host headers without authentication -------------------------------------------------------


async def raw_get(port: int, host: str | None, path: str = "/api/v1/namespaces") -> tuple[int, str]:
    """One GET with exactly this Host header (or none: then HTTP/1.0, since HTTP/1.1 requires
    one and aiohttp answers 400 itself); (status, head and body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    version = "1.1" if host is not None else "1.0"
    head = f"GET {path} HTTP/{version}\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    writer.write((head + "Connection: close\r\n\r\n").encode())
    data = await within(reader.read(), "kubesim's answer")
    writer.close()
    return int(data.split(b" ", 2)[1]), data.decode()


LOOPBACK = ["localhost", "localhost:{port}", "LocalHost:{port}", "127.0.0.1", "127.0.0.1:{port}",
            "[::1]", "[::1]:{port}", "::1", "127.0.0.1:1", "127.0.0.2:{port}",
            "[::ffff:127.0.0.1]:{port}"]  # fmt: skip
NOT_LOOPBACK = [
    "evil.example",  # what a rebinding page's requests carry
    "evil.example:{port}",
    "127.0.0.1.nip.io:{port}",  # a name that resolves to 127.0.0.1
    "localhost.evil.example:{port}",
    "kubernetes:{port}",
    "10.0.0.1:{port}",  # not loopback
    "[::2]:{port}",
    "",
    "127.0.0.1:http",  # malformed
    "[::1",
    "[::1]x",
    None,  # no Host at all
]


@pytest.fixture
async def open_sim() -> Any:
    async with kubesim.Cluster() as sim:  # authorization "open", no authentication
        yield sim


@pytest.mark.parametrize("host", LOOPBACK)
async def test_without_authentication_loopback_host_names_are_answered(
    open_sim: kubesim.Cluster, host: str
) -> None:
    status, answer = await raw_get(open_sim.port, host.format(port=open_sim.port))
    assert status == 200, answer
    assert '"kind":"NamespaceList"' in answer


@pytest.mark.parametrize("host", NOT_LOOPBACK)
async def test_without_authentication_other_host_names_are_refused_with_the_fix(
    open_sim: kubesim.Cluster, host: str | None
) -> None:
    value = host.format(port=open_sim.port) if host is not None else None
    for path in ("/api/v1/namespaces", "/api", "/version", "/healthz"):
        status, answer = await raw_get(open_sim.port, value, path)
        assert status == 403, (path, answer)
        assert "Content-Type: text/plain" in answer  # what kubectl prints as it is
        named = f"Host {value!r}" if value is not None else "no Host header"
        assert f"\r\n\r\nforbidden: {named}: this kubesim runs without authentication" in answer
        assert "localhost, 127.0.0.1, [::1] or another loopback address (any port)" in answer
        assert f"Connect to {open_sim.url} or http://localhost:<port>" in answer


async def test_a_loopback_bound_address_is_answered_and_authentication_lifts_the_check() -> None:
    async with kubesim.Cluster(host="127.0.0.2") as sim:
        reader, writer = await asyncio.open_connection("127.0.0.2", sim.port)
        writer.write(f"GET /version HTTP/1.1\r\nHost: 127.0.0.2:{sim.port}\r\n\r\n".encode())
        assert (await within(reader.readline(), "the status line")).startswith(b"HTTP/1.1 200")
        writer.close()
    # With authentication the bearer token is what counts (and HTTPS: no page can rebind it).
    async with kubesim.Cluster(authentication=True) as sim:
        assert sim.tls is not None
        context = sim.tls.client_context()
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port, ssl=context)
        writer.write(
            f"GET /api/v1/namespaces HTTP/1.1\r\nHost: evil.example\r\n"
            f"Authorization: Bearer {sim.auth.admin_token}\r\n\r\n".encode()
        )
        assert (await within(reader.readline(), "the status line")).startswith(b"HTTP/1.1 200")
        writer.close()


def test_host_values_parse_to_their_names_and_only_loopback_ones_pass() -> None:
    assert loopback.host_name("LOCALHOST:6443") == "localhost"
    assert loopback.host_name("[::1]:6443") == "::1"
    assert loopback.host_name("::1") == "::1"
    assert loopback.host_name("[::1]") == "::1"
    for bad in ("", ":80", "a:b", "[::1", "[::1]:", "[::1]80"):
        assert loopback.host_name(bad) is None, bad
    for name in ("localhost", "127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert loopback.is_loopback(name), name
    for name in ("localhost.", "0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "vm", "a.b"):
        assert not loopback.is_loopback(name), name


def loopback_alias() -> str | None:
    """A name other than localhost that this machine's hosts file resolves to 127.0.0.1 (as a
    rebinding attacker's name would), or None."""
    for name in (socket.gethostname(), "localhost.localdomain"):
        if name.lower() == "localhost":
            continue
        with contextlib.suppress(OSError):
            if {a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)} == {"127.0.0.1"}:
                return name
    return None


@needs_kubectl
async def test_kubectl_by_a_name_that_resolves_to_loopback_is_refused_with_the_message(
    open_sim: kubesim.Cluster, tmp_path: Path
) -> None:
    assert (await kubectl(open_sim, "get", "namespace", "default", "-o", "name")).strip() == (
        "namespace/default"
    )
    alias = loopback_alias()
    if alias is None:
        pytest.skip("no name besides localhost resolves to 127.0.0.1 on this machine")
    config = tmp_path / "by-name"
    config.write_text(open_sim.kubeconfig_path.read_text().replace("127.0.0.1", alias))
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL), "--kubeconfig", str(config), "get", "namespaces",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await within(proc.communicate(), "kubectl")
    assert proc.returncode == 1, out
    text = out.decode()
    assert "Error from server (Forbidden)" in text, text
    assert f"Host '{alias}:{open_sim.port}'" in text, text
    assert "without authentication" in text
