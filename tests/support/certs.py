"""Test certificates made at run time with ``cryptography``: a CA and the certificates it signs."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_NOW = datetime.datetime.now(datetime.UTC)


@dataclass
class Issued:
    cert: Path  # the leaf, then the CA (a chain, as servers send it)
    key: Path


class TestCA:
    """A certificate authority in ``directory``; ``ca.pem`` is its bundle for clients."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "Gateway Test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_NOW - datetime.timedelta(days=1))
            .not_valid_after(_NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = directory / "ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, filename: str, *names: str, expired: bool = False) -> Issued:
        """A server certificate for ``names`` (DNS names or IP addresses), valid now unless ``expired``."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        if expired:
            start, end = _NOW - datetime.timedelta(days=20), _NOW - datetime.timedelta(days=10)
        else:
            start, end = _NOW - datetime.timedelta(hours=1), _NOW + datetime.timedelta(days=10)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path = self.directory / f"{filename}.crt"
        key_path = self.directory / f"{filename}.key"
        cert_path.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM) + self.cert.public_bytes(serialization.Encoding.PEM)
        )
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return Issued(cert_path, key_path)


def serial_of(der: bytes) -> int:
    """The serial number of a DER certificate (what a client saw in its handshake)."""
    return x509.load_der_x509_certificate(der).serial_number


def names_of(der: bytes) -> list[str]:
    cert = x509.load_der_x509_certificate(der)
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
