"""Connection URLs as they may be logged."""

from __future__ import annotations

import re

_URL_USERINFO = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/@\s:,]*)(?P<password>:[^/@\s,]*)?@"
)


def mask_url(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***` (a lone user part is a
    token, masked too): `nats://hub:***@host:4222`, `nats://***@host:4222`."""

    def masked(m: re.Match[str]) -> str:
        if m["password"] is None:
            return f"{m['scheme']}***@"
        return f"{m['scheme']}{m['user']}:***@"

    return _URL_USERINFO.sub(masked, text)
