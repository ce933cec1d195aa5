"""Which `Host:` headers a kubesim without authentication answers: loopback names only.

Without authentication every request runs as the admin, so the server must answer only clients on
this machine. Binding to 127.0.0.1 keeps other machines out, but not a web page in a local
browser: its site's name can be made to resolve to 127.0.0.1 (DNS rebinding), and the browser
then sends the page's requests, with the site's name in `Host:`, to kubesim. kubectl, helm and
every other local client name the server `localhost` or by a loopback address, so those are the
names accepted: `localhost` and any loopback IP literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z),
which covers a server bound to 127.0.0.2; an address literal cannot be rebound. Any port.
"""

from __future__ import annotations

import ipaddress

ACCEPTED = "localhost, 127.0.0.1, [::1] or another loopback address"


def host_name(value: str) -> str | None:
    """The name in a `Host:` value (`name`, `name:port`, `[v6]`, `[v6]:port`, bare `::1`),
    lower-cased and without brackets; None when the value is malformed."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return value[1:end].lower()
    if value.count(":") > 1:  # an IPv6 address without brackets (and so without a port)
        return value.lower()
    name, sep, port = value.partition(":")
    if not name or (sep and not port.isdigit()):
        return None
    return name.lower()


def is_loopback(name: str) -> bool:
    """`localhost` or a loopback IP address (an IPv4-mapped one included)."""
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class RefusedHost(Exception):
    """A request addressed by a name that is not a loopback one: 403 with a plain-text body, the
    one kind of error body kubectl shows whatever it asked for (it reports a JSON Status on
    discovery, its first request, as "unknown")."""


def refusal(host: str | None, url: str) -> str | None:
    """Why a request with `Host: host` is refused by the server at `url`; None when accepted."""
    if host is None:
        shown = "no Host header"
    else:
        name = host_name(host)
        if name is not None and is_loopback(name):
            return None
        shown = f"Host {host!r}"
    return (
        f"{shown}: this kubesim runs without authentication (every request acts as the admin), "
        f"so it answers only requests addressed to {ACCEPTED} (any port), against DNS "
        f"rebinding. Connect to {url or 'http://127.0.0.1:<port>'} or http://localhost:<port>, "
        "or serve with authentication (the default of `kubesim serve`)"
    )
