"""Where torch's collectives would bind on this node (gloo, NCCL's socket transport), checked by
the health gate's quick probe beside the ring test, which connects address to address and so
would pass where training then fails (gloo bound to 127.0.0.1)."""

from __future__ import annotations

import os
import socket

SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_address(name: str) -> str | None:
    """The IPv4 address of interface ``name`` here, None when it has none (or is missing)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def socket_problem(own: str) -> str | None:
    """Why the collectives would not bind where the ring test ran (this node's ``own``
    address), or None: to the interface GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) names, else,
    for gloo, to the address this host's name resolves to. The ring test connects address to
    address and would pass where training then fails (gloo bound to 127.0.0.1: "Connection
    refused" from every peer)."""
    loopback = own.startswith("127.")
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        name = os.environ.get(variable)
        if name and "," not in name and not name.startswith(("^", "=")):  # (one exact name)
            held = interface_address(name)
            if held is None:
                return f"{variable}={name}: no such interface with an IPv4 address here"
            if held != own and not (loopback and held.startswith("127.")):
                return f"{variable}={name} holds {held}, not this node's address {own}"
    if os.environ.get("GLOO_SOCKET_IFNAME") or loopback:
        return None
    try:
        resolved = socket.gethostbyname(socket.gethostname())
    except OSError:
        return f"this host's name ({socket.gethostname()[:60]}) does not resolve: gloo " \
            "finds no address to bind (set GLOO_SOCKET_IFNAME)"
    if resolved.startswith("127."):
        return f"gloo would bind {resolved}, where this host's name resolves, not {own} " \
            "(set GLOO_SOCKET_IFNAME to the interface holding it)"
    return None
