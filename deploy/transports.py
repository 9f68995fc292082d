"""Every way to reach a device, and a `--device` address turned into a connection.

Importing this module imports each transport, which registers itself
(`deploy.connection.register_transport`): `adb` (`adb:SERIAL`, `deploy.adb`) and `ssh`
(`USER@HOST` or an ~/.ssh/config alias, the form without a prefix, `deploy.ssh`). A third
transport is its own module and one line here. An address whose `WORD:` prefix no transport
reads is a one-line `BadDeviceError` (exit 2), as is a `Reach` field its transport does not take.

Example:
    >>> transport_for("adb:emulator-5554")[0].name, transport_for("pi@raspberrypi.local")[1]
    ('adb', 'pi@raspberrypi.local')
    >>> transport_for("adbb:1234")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bnnexport.deploy.errors.BadDeviceError: 'adbb:1234': no transport reads 'adbb:'; give ...
    >>> open_device("adb:emulator-5554", Reach()).destination
    'adb:emulator-5554'
"""

from __future__ import annotations

import dataclasses
import re

from bnnexport.deploy import adb, ssh  # noqa: F401  (each registers its transport)
from bnnexport.deploy.connection import REACH_FLAGS, Connection, Reach, Transport, forms, transports
from bnnexport.deploy.errors import BadDeviceError

# a URI-like scheme before the first ':' (not ssh's own `ssh://`, nor an IPv6 `fe80::1`)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(?![:/])")


def transport_for(address: str) -> tuple[Transport, str]:
    """The transport that reads `address`, and the address without its prefix."""
    for transport in transports():
        if transport.prefix and address.startswith(transport.prefix):
            return transport, address[len(transport.prefix) :]
    scheme = _SCHEME.match(address)
    if scheme is not None and "@" not in scheme.group(1):
        raise BadDeviceError(
            f"{address!r}: no transport reads '{scheme.group(1)}:'; give {forms()}"
        )
    return next(t for t in transports() if not t.prefix), address


def open_device(address: str, reach: Reach) -> Connection:
    """A connection to the device at `address` (nothing is contacted yet); BadDeviceError for
    an address no transport reads, or options its transport does not take."""
    transport, rest = transport_for(address)
    refused = sorted(reach.given() - transport.takes)
    if refused:
        flags = ", ".join(REACH_FLAGS.get(name, name) for name in refused)
        verb = "does" if len(refused) == 1 else "do"
        raise BadDeviceError(f"{flags} {verb} not apply to {transport.form} ({address})")
    if reach.remote_tmp is None:
        reach = dataclasses.replace(reach, remote_tmp=transport.remote_tmp)
    return transport.open(rest, reach)


def device_help() -> str:
    """What `--device` takes, one sentence per transport, for --help."""
    return " ".join(f"{t.form}: {t.summary}." for t in transports())
