"""Flags and readings the `gpufed` service commands (hub, spoke, burst, region-streams) share: NATS
connection flags whose secrets come from files or the environment, never argv."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpufed.secretfile import read_secret_file


def given(**options: object) -> dict[str, object]:
    """The options set on the command line; the others keep the settings' defaults."""
    return {name: value for name, value in options.items() if value is not None}


def add_nats_flags(p: argparse.ArgumentParser) -> None:
    """--nats-url, --nats-creds, --nats-ca: secrets only as files or environment, never argv."""
    p.add_argument(
        "--nats-url",
        default=os.environ.get("GPUFED_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS URL (default $GPUFED_NATS_URL or nats://127.0.0.1:4222); a URL with a "
        "password belongs in $GPUFED_NATS_URL, not on the command line",
    )
    p.add_argument(
        "--nats-url-file",
        type=Path,
        default=env_path("GPUFED_NATS_URL_FILE"),
        help="read the NATS URL (one with a password) from this file, e.g. a mounted Secret",
    )
    p.add_argument(
        "--nats-creds",
        type=Path,
        default=env_path("GPUFED_NATS_CREDS"),
        help="NATS user credentials file (.creds, mode 0600; default $GPUFED_NATS_CREDS)",
    )
    p.add_argument(
        "--nats-ca",
        type=Path,
        default=env_path("GPUFED_NATS_CA"),
        help="CA file the NATS server's certificate is checked against (tls:// URLs)",
    )


def nats_url(args: argparse.Namespace) -> str:
    """--nats-url, or what --nats-url-file holds when given."""
    return read_secret(args.nats_url_file, "--nats-url-file") or str(args.nats_url)


def check_nats_files(args: argparse.Namespace) -> None:
    """--nats-creds and --nats-ca, read as the NATS client will read them: a ValueError naming
    the flag and the file when one cannot be read or holds no credential. Found only at
    connect, a missing file was retried twice a second for ever and a file without a seed
    ended in a traceback."""
    from bus import jwt

    if args.nats_creds is not None:
        text = read_secret_file(args.nats_creds, "--nats-creds")
        try:
            jwt.creds_jwt(text)
            jwt.creds_seed(text)
        except jwt.JwtError:
            raise ValueError(
                f"--nats-creds: not a NATS credentials file (a user JWT and its seed): "
                f"{args.nats_creds}"
            ) from None
    if args.nats_ca is not None:
        read_secret_file(args.nats_ca, "--nats-ca")


def read_secret(path: Path | None, flag: str) -> str | None:
    """The stripped text of a secret file (None without one); exits naming the flag."""
    if path is None:
        return None
    try:
        return read_secret_file(path, flag)
    except ValueError as exc:
        raise SystemExit(f"gpufed: {exc}") from None


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def pair(item: str) -> tuple[str, str]:
    """KEY=VALUE (a --label) as a pair; ValueError naming the flag otherwise."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--label wants KEY=VALUE, got {item!r}")
    return key, value
