"""A throw-away certificate authority and serving certificate for one kubesim server.

kubectl, helm and every client-go program send bearer tokens only over TLS, so a server that
authenticates must serve HTTPS; the kubeconfig carries the CA so clients verify the server.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kubesim import private_files


class ServingCertificate:
    """A CA and a certificate signed by it for `host` (plus localhost and 127.0.0.1)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        now = dt.datetime.now(dt.UTC)
        lifetime = dt.timedelta(days=365)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubesim-ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName("kubernetes")]
        for address in {host, "127.0.0.1"}:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(address)))
            except ValueError:
                names.append(x509.DNSName(address))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + lifetime)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_pem = ca.public_bytes(serialization.Encoding.PEM)
        self._cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self._key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @property
    def ca_data(self) -> str:
        """The CA as a kubeconfig's `certificate-authority-data` (base64 PEM)."""
        return base64.b64encode(self.ca_pem).decode()

    def server_context(self) -> ssl.SSLContext:
        """The server side: this certificate and key."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # ssl loads certificates only from files; they live for the call only, in a directory
        # only the owner can enter, and the key file is created owner-only.
        with tempfile.TemporaryDirectory(prefix="kubesim-tls-") as tmp:
            cert_file = private_files.write(Path(tmp) / "tls.crt", self._cert_pem + self.ca_pem)
            key_file = private_files.write(Path(tmp) / "tls.key", self._key_pem)
            context.load_cert_chain(cert_file, key_file)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client side that trusts this CA (for aiohttp or httpx clients in tests)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())
