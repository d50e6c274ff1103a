"""TLS material a test makes with ``openssl``: a certificate authority of
its own, and certificates it signs for a server (the names a client checks
it by) or for a client. Nothing here is trusted by the machine."""
from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Long enough for any test run, short enough that nothing made here is
# worth keeping.
DAYS = 2
# An EC key: made in a millisecond, where RSA 2048 takes 50 ms or more.
KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                   timeout=30)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its unencrypted PEM key."""

    certificate: Path
    key: Path


def subject_alt_names(names: list[str]) -> str:
    """subjectAltName's value: each name an IP address or a DNS name, as a
    TLS client matches the host it connected to against them."""
    entries = []
    for name in names:
        try:
            entries.append(f"IP:{ipaddress.ip_address(name)}")
        except ValueError:
            entries.append(f"DNS:{name}")
    return ",".join(entries)


@dataclass(frozen=True)
class Authority:
    """A certificate authority: ``certificate`` is what a peer trusts (a
    CA file)."""

    certificate: Path
    key: Path

    @classmethod
    def make(cls, directory: Path, name: str) -> Authority:
        directory.mkdir(parents=True, exist_ok=True)
        certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
        openssl("req", "-x509", *KEY, "-keyout", key, "-out", certificate,
                "-days", DAYS, "-subj", f"/CN={name}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return cls(certificate, key)

    def issue(self, directory: Path, name: str, names: list[str] | None = None) -> KeyPair:
        """A certificate for ``name``, signed by this authority: a server's
        when ``names`` (the host names and addresses it answers to) are
        given, a client's otherwise."""
        directory.mkdir(parents=True, exist_ok=True)
        certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
        request, extensions = directory / f"{name}.csr", directory / f"{name}.ext"
        usage = "serverAuth" if names else "clientAuth"
        extensions.write_text(
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            f"extendedKeyUsage={usage}\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
            + (f"subjectAltName={subject_alt_names(names)}\n" if names else ""))
        openssl("req", "-new", *KEY, "-keyout", key, "-out", request, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", request, "-CA", self.certificate,
                "-CAkey", self.key, "-CAcreateserial", "-out", certificate,
                "-days", DAYS, "-extfile", extensions)
        return KeyPair(certificate, key)
