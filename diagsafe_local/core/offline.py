"""Offline by policy: `run --offline` (DIAGSAFE_OFFLINE=1; the default of the jobs `submit` and `watch --submit`
start) sets the hubs' offline variables for the run and every process it starts, and guards this process's
sockets: a connection (or a name lookup) to a host that is neither loopback nor one of the run's configured API
endpoints is refused with `NetworkRefused`, naming the host and the setting.

The guard wraps Python's `socket.getaddrinfo` and `socket.socket.connect` / `connect_ex` (what
`socket.create_connection`, urllib, httpx, requests and asyncio connect through); Unix sockets and loopback
addresses pass. It is a guard against our own and our libraries' slips, not a sandbox: the network namespace (`unshare -n`) or
the node's firewall is that.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from diagsafe_local.core.errors import DiagsafeError, RunFailed

ENV = "DIAGSAFE_OFFLINE"
SETTING = f"--offline, {ENV}=1"
HUB_SETTINGS = {  # the hubs' and libraries' own switches: no downloads, no update checks, no telemetry
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "WANDB_MODE": "offline",
}
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class NetworkRefused(RunFailed, PermissionError):
    """A connection the offline policy does not allow (exit 3); an OSError, so a library meets it as it would an
    unreachable network."""


def endpoint_hosts(urls: Iterable[str]) -> frozenset[str]:
    """The host names of API endpoints' base URLs, lower-cased."""
    return frozenset(host.lower() for url in urls if (host := urlsplit(url).hostname))


class Guard:
    """Which hosts and addresses this process may connect to: loopback, the endpoints' hosts and what they
    resolved to."""

    def __init__(self, hosts: frozenset[str]) -> None:
        self.hosts = hosts
        self.addresses = {host for host in hosts if _ip(host) is not None}  # endpoints given by address

    def check_host(self, host: Any) -> None:
        """Refuse looking up `host` unless it is loopback or an endpoint's."""
        if host is None:
            return
        name = _name(host)
        if name in LOOPBACK_NAMES or name in self.hosts or _loopback(name):
            return
        raise _refused(name)

    def resolved(self, host: Any, found: list[Any]) -> None:
        """Remember the addresses an endpoint's host resolved to, so that connecting to them passes."""
        if host is not None and _name(host) in self.hosts:
            self.addresses.update(str(info[4][0]) for info in found)

    def check_address(self, family: int, address: Any) -> None:
        """Refuse connecting to `address` unless it is a Unix socket, loopback or an endpoint's address."""
        if family not in (socket.AF_INET, socket.AF_INET6):
            return
        host = str(address[0]).split("%", 1)[0]
        if host in self.addresses or _loopback(host):
            return
        self.check_host(host)  # a name rather than an address (a socket connects to it through getaddrinfo)


_guards: list[Guard] = []  # the guards in force in this process (one, or none)


def active() -> bool:
    """Whether this process runs offline: its sockets guarded (within `offline`)."""
    return bool(_guards)


def _name(host: str | bytes) -> str:
    """A host as looked up: lower case, no trailing dot."""
    return (host.decode() if isinstance(host, bytes) else str(host)).lower().rstrip(".")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    ip = _ip(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and ip.is_loopback


def _refused(host: str) -> NetworkRefused:
    return NetworkRefused(
        f"network connection to '{host}' refused: the run is offline ({SETTING}), which allows loopback and the "
        "run's configured API endpoints only; give the endpoint as a target's or the judge's base_url, or run "
        "without --offline"
    )


def require_local(model: str, revision: str | None, what: str = "model") -> None:
    """Refuse (exit 2), before anything loads, a model that is neither on disk nor in the Hugging Face cache:
    offline, a hub id resolves from the cache or not at all."""
    from pathlib import Path

    if Path(model).expanduser().exists():
        return
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    marker = "adapter_config.json" if what == "LoRA adapter" else "config.json"
    try:
        cached = try_to_load_from_cache(model, marker, revision=revision)
    except ValueError:  # not a hub id either
        cached = None
    if not isinstance(cached, str):
        raise DiagsafeError(
            f"{what} '{model}' is neither a local directory nor in the Hugging Face cache ({HF_HUB_CACHE}), and the "
            f"run is offline ({SETTING}): download it once where the network is (`hf download {model}`, same "
            "HF_HOME) or give its directory"
        )


@contextmanager
def offline(endpoints: Iterable[str]) -> Iterator[None]:
    """Within: the hubs' offline variables set (inherited by every process started), and this process's sockets
    guarded to loopback and the hosts of `endpoints` (API base URLs). Both restored on leaving."""
    guard = Guard(endpoint_hosts(endpoints))
    settings = {**HUB_SETTINGS, ENV: "1"}
    before_env = {name: os.environ.get(name) for name in settings}
    hub = sys.modules.get("huggingface_hub.constants")  # read its variables at import: tell it too
    before_hub = getattr(hub, "HF_HUB_OFFLINE", None)
    getaddrinfo, connect, connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        guard.check_host(host)
        found = getaddrinfo(host, *args, **kwargs)
        guard.resolved(host, found)
        return found

    def guarded_connect(self: socket.socket, address: Any) -> None:
        guard.check_address(self.family, address)
        connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        guard.check_address(self.family, address)
        return connect_ex(self, address)

    os.environ.update(settings)
    _guards.append(guard)
    if hub is not None:
        hub.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
    socket.getaddrinfo = guarded_getaddrinfo
    socket.socket.connect = guarded_connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        _guards.remove(guard)
        socket.getaddrinfo = getaddrinfo
        socket.socket.connect, socket.socket.connect_ex = connect, connect_ex  # type: ignore[method-assign]
        for name, value in before_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if hub is not None:
            hub.HF_HUB_OFFLINE = before_hub  # type: ignore[attr-defined]
