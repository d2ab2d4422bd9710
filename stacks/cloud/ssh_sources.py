"""Whether this controller can reach the nodes a profile would buy: their security rules let SSH
in only from `sshAllowedCidrs`. A documentation address (the shipped profiles' placeholder) is
refused; so is a list that does not hold this machine's egress address, found the way the
README says (`curl https://checkip.amazonaws.com`). Both before anything is created."""

from __future__ import annotations

import functools
import ipaddress
import os
import urllib.request

from sortie.core.errors import UsageError
from sortie.infra.spec import NAMESPACE, SET_YOUR_ADDRESS, ClusterSpec, placeholder_sources

EGRESS_ENV = "SORTIE_EGRESS_URL"  # where this machine's public address is asked; "off": never
EGRESS_URL = "https://checkip.amazonaws.com"
EGRESS_TIMEOUT_S = 5.0


def refuse_placeholders(spec: ClusterSpec) -> None:
    """A documentation address as an SSH source, in one line with the fix."""
    placeholders = placeholder_sources(spec.ssh_allowed_cidrs)
    if placeholders:
        raise UsageError(
            f"{NAMESPACE}:sshAllowedCidrs: {placeholders[0]} is a documentation address (RFC "
            "5737), the profile's placeholder: no controller is there, and the nodes would "
            f"take SSH from no one else; set your own: {SET_YOUR_ADDRESS}; nothing was created")


@functools.lru_cache(maxsize=4)
def egress_address(url: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """This machine's address as a server on the internet sees it (OSError / ValueError when
    it cannot be had)."""
    with urllib.request.urlopen(url, timeout=EGRESS_TIMEOUT_S) as response:
        return ipaddress.ip_address(response.read(100).decode(errors="replace").strip())


def check_reachable(spec: ClusterSpec) -> list[str]:
    """Refuse (UsageError) SSH sources that cannot be this controller: a placeholder, or a list
    without this machine's egress address. Returns notes: where the address could not be had,
    what was not checked."""
    refuse_placeholders(spec)
    url = os.environ.get(EGRESS_ENV, EGRESS_URL)
    if url == "off":
        return []
    try:
        address = egress_address(url)
    except (OSError, ValueError) as exc:
        return [f"could not find this machine's public address at {url} ({exc}); the nodes "
                f"take SSH only from {', '.join(spec.ssh_allowed_cidrs)}"]
    if not any(address in ipaddress.ip_network(cidr) for cidr in spec.ssh_allowed_cidrs):
        raise UsageError(
            f"{NAMESPACE}:sshAllowedCidrs: this machine reaches the internet as {address} "
            f"(per {url}), which none of {', '.join(spec.ssh_allowed_cidrs)} holds: the nodes "
            f"would refuse its SSH; add it: --set sshAllowedCidrs={address}/32 (or set "
            f"{EGRESS_ENV}=off where this controller reaches the nodes another way); nothing "
            "was created")
    return []
