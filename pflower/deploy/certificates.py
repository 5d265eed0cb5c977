"""The certificates and keys of a deployment: a CA, the SuperLink's certificate, one key pair per
SuperNode (for TLS and SuperNode authentication)."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta
from pathlib import Path


def make_pki(out: Path, hosts: list[str], nodes: int) -> None:
    """A CA, a SuperLink certificate valid for ``hosts`` (IPs or names), one EC key pair per node.

    Files: ``ca.crt``, ``server.pem``, ``server.key``, ``keys/node<i>`` and ``keys/node<i>.pub``
    (OpenSSH format, what ``flower-supernode`` and ``flwr supernode register`` read).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)

    def cert(subject: str, key, issuer: str, signer, extensions) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=365))
        )
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(signer, hashes.SHA256())

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = cert("pflower CA", ca_key, "pflower CA", ca_key, [(x509.BasicConstraints(ca=True, path_length=None), True)])
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    server = cert(
        hosts[0], server_key, "pflower CA", ca_key,
        [(x509.SubjectAlternativeName(names), False), (x509.BasicConstraints(ca=False, path_length=None), True),
         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)],
    )  # fmt: skip
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (out / "server.key").write_bytes(pem_key(server_key))
    (out / "server.key").chmod(0o600)
    keys = out / "keys"
    keys.mkdir(exist_ok=True)
    for i in range(nodes):
        node_key(keys / f"node{i}")


def node_key(path: Path) -> None:
    """One SuperNode key pair: ``path`` (private) and ``path.pub``, OpenSSH format, P-384."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
