"""User data that turns a fresh cloud instance into a gpufed spoke.

Templates use `{{ name }}` placeholders (shell scripts are full of `$`, so string.Template and
str.format do not fit). Every value is checked against a conservative character set, so it
needs no quoting in either the shell or a systemd unit.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

#: EC2 rejects user data over 16 KiB (before base64).
MAX_USER_DATA_BYTES = 16 * 1024

# No quotes, spaces, `$`, `%` (systemd specifier), backslashes or shell metacharacters.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@=+,-]+$")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")

DEFAULT_TEMPLATE = """#!/bin/bash
# gpufed cloud burst spoke {{ burst_id }} (rendered by burst.providers.userdata)
set -euo pipefail
install -d -m 0755 /opt/gpufed
if [ ! -x /opt/gpufed/venv/bin/gpufed ]; then
  python3 -m venv /opt/gpufed/venv
  /opt/gpufed/venv/bin/pip install --quiet {{ package }}
fi
{{ creds_file }}cat > /etc/systemd/system/gpufed-spoke.service <<'UNIT'
[Unit]
Description=gpufed spoke {{ burst_id }}
After=network-online.target
Wants=network-online.target

[Service]
ExecStart={{ command }}
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
chmod 0644 /etc/systemd/system/gpufed-spoke.service
systemctl daemon-reload
systemctl enable --now gpufed-spoke.service
"""


@dataclass(frozen=True, slots=True)
class SpokeBoot:
    """What a burst instance needs to join the hub as a cloud spoke."""

    burst_id: str
    region: str
    nats_url: str
    creds: str | None = field(default=None, repr=False)
    labels: Mapping[str, str] = field(default_factory=dict)
    price_per_gpu_hour: float = 0.0
    package: str = "gpufed[nvml]"
    gpufed_bin: str = "/opt/gpufed/venv/bin/gpufed"
    creds_path: str = "/etc/gpufed/nats.creds"
    # PEM of the CA the hub's NATS certificate is signed by (a private CA); None: the system's.
    nats_ca: str | None = field(default=None, repr=False)
    ca_path: str = "/etc/gpufed/nats-ca.crt"
    # Instance metadata to watch for a spot interruption notice (spot instances only).
    interruption_imds: str | None = None

    def command(self) -> str:
        """The `gpufed spoke` command line the instance runs."""
        parts = [
            self.gpufed_bin,
            "spoke",
            "--id",
            self.burst_id,
            "--region",
            self.region,
            "--kind",
            "cloud",
            "--nats-url",
            self.nats_url,
            *(["--nats-creds", self.creds_path] if self.creds is not None else []),
            *(["--nats-ca", self.ca_path] if self.nats_ca is not None else []),
            "--inventory",
            "nvml",
            "--runtime",
            "local",
            "--price",
            f"{self.price_per_gpu_hour:g}",
        ]
        for key, value in sorted(self.labels.items()):
            parts += ["--label", f"{key}={value}"]
        if self.interruption_imds:
            parts += ["--interruption-imds", self.interruption_imds]
        for part in parts:
            _check_safe(part)
        return " ".join(parts)


def render_user_data(template: str, boot: SpokeBoot) -> str:
    """Fill `template` for `boot`; raises ValueError for unknown placeholders, unsafe values
    or a result over EC2's 16 KiB limit.

    Placeholders: burst_id, region, nats_url, package (shell-quoted), command (the full
    `gpufed spoke ...` line) and creds_file (the lines writing the instance's NATS credential
    to `creds_path`, mode 0600, and the NATS server's CA, if any, to `ca_path`; the command
    line only names the files).
    """
    values = {
        "creds_file": _creds_file(boot),
        "burst_id": boot.burst_id,
        "region": boot.region,
        "nats_url": boot.nats_url,
        "package": shlex.quote(boot.package),
        "command": boot.command(),
    }
    used = set(_PLACEHOLDER.findall(template))
    unknown = sorted(name for name in used if name not in values)
    if unknown:
        raise ValueError(f"user data template has unknown placeholders: {', '.join(unknown)}")
    if (boot.creds is not None or boot.nats_ca is not None) and "creds_file" not in used:
        raise ValueError("user data template has no {{ creds_file }}: the spoke could not join")
    rendered = _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)
    size = len(rendered.encode())
    if size > MAX_USER_DATA_BYTES:
        raise ValueError(f"user data is {size} bytes; EC2 accepts at most {MAX_USER_DATA_BYTES}")
    return rendered


_CREDS_LINE = re.compile(r"^[A-Za-z0-9._=*\- ]*$")


_PEM_LINE = re.compile(r"^[A-Za-z0-9+/= -]*$")


def _creds_file(boot: SpokeBoot) -> str:
    out = ""
    if boot.creds is not None:
        lines = boot.creds.strip("\n").split("\n")
        if not all(_CREDS_LINE.match(line) and line != "CREDS" for line in lines):
            raise ValueError("NATS credential has characters outside a creds file's")  # no echo
        out += _file(boot.creds_path, "\n".join(lines), "CREDS")
    if boot.nats_ca is not None:
        lines = boot.nats_ca.strip("\n").split("\n")
        if not all(_PEM_LINE.match(line) and line != "PEM" for line in lines):
            raise ValueError("NATS CA is not a PEM certificate")
        out += _file(boot.ca_path, "\n".join(lines), "PEM")
    return out


def _file(path: str, body: str, end: str) -> str:
    """Shell lines writing `body` to `path`, mode 0600, in a 0700 folder."""
    _check_safe(path)
    directory = path.rsplit("/", 1)[0] or "/"
    return (
        f"install -d -m 0700 {directory}\n"
        f"(umask 077; cat > {path} <<'{end}'\n{body}\n{end}\n)\n"
        f"chmod 0600 {path}\n"
    )


def _check_safe(value: str) -> None:
    if not _SAFE_VALUE.match(value):
        # Never echo the value.
        raise ValueError("user data value has characters outside [A-Za-z0-9._:/@=+,-]")
