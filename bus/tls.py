"""TLS for the embedded NATS server: a local CA and a server certificate (`gpufed up --tls`).

Clients verify the server against the CA (`client_context`); nothing here disables checks.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bus.authority import write_secret

_CA_DAYS = 3650
_SERVER_DAYS = 397
#: A CA key signs certificates (and revocation lists), nothing else.
_CA_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: the CA clients trust, and the server's certificate and key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_block(self) -> str:
        """nats-server's `tls { ... }` block for client connections."""
        return (
            "tls {\n"
            f"  cert_file: {json.dumps(str(self.cert_file))}\n"
            f"  key_file: {json.dumps(str(self.key_file))}\n"
            "  timeout: 2\n"
            "}"
        )


def client_context(ca_file: str | Path) -> ssl.SSLContext:
    """An SSL context that trusts `ca_file` and checks the server's name."""
    return ssl.create_default_context(cafile=str(ca_file))


def ensure_local_ca(
    directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> TlsFiles:
    """Create (once) a CA and a server certificate for `hosts` in `directory`; keys 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    if files.ca_file.exists() and files.cert_file.exists() and files.key_file.exists():
        return files
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufed local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    write_secret(files.key_file, key_pem)
    # The CA key signs nothing after this: it is not kept.
    files.cert_file.write_text(cert.public_bytes(pem).decode(), encoding="utf-8")
    files.ca_file.write_text(ca_cert.public_bytes(pem).decode(), encoding="utf-8")
    return files
