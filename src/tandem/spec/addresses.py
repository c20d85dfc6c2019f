"""What an address in a recipe or cluster may be: an IPv4 or IPv6 address, or a host name.

A host name follows RFC 1123: dot-separated labels of letters, digits and dashes, each at most
63 characters, neither starting nor ending with a dash, 253 characters in all. A name made only
of digits and dots (``10.0.0.300``) is a mistyped IPv4 address, never a host name.
"""

from __future__ import annotations

import errno
import ipaddress
import re

from tandem.errors import FieldFault

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_ip(value: str) -> bool:
    """True for an IPv4 or IPv6 address (no brackets, no port)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def is_loopback(value: str) -> bool:
    """``localhost`` or a loopback IP (127.0.0.0/8, ::1): reached only from the host itself."""
    return value == "localhost" or (is_ip(value) and ipaddress.ip_address(value).is_loopback)


def is_host_name(value: str) -> bool:
    """True for an RFC 1123 host name that is not a mistyped IPv4 address."""
    name = value.removesuffix(".")
    if not name or len(name) > 253:
        return False
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        return False
    return all(_LABEL.fullmatch(label) for label in labels)


def check_address(value: str, *, names: bool = True) -> str:
    """``value`` when it is an IP address (or, with ``names``, a host name); else ValueError."""
    value = value.strip()
    if is_ip(value) or (names and is_host_name(value)):
        return value
    if value and all(part.isdigit() for part in value.split(".")):
        raise FieldFault(
            f"'{value}' is not an IPv4 address", hint="write four numbers 0-255, e.g. 10.0.0.1"
        )
    what = "an IP address or a host name" if names else "an IP address"
    raise FieldFault(
        f"'{value}' is not {what}",
        hint="write e.g. 10.0.0.1, fd00::1" + (" or node1.example.com" if names else ""),
    )


def port_fault(exc: BaseException, port: int) -> str | None:
    """The fix for a bind refused for its port (in use or privileged); None: the address's fault."""
    return {
        errno.EADDRINUSE: f"pick a free port (`ss -ltnp 'sport = :{port}'` shows who holds it)",
        errno.EACCES: "pick a port above 1023 (the ones below need root)",
    }.get(getattr(exc, "errno", None) or 0)
