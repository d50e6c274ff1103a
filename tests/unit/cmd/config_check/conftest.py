"""Fixtures shared by the start-up check's tests."""
from __future__ import annotations

import pytest

from tests.tls import Authority


@pytest.fixture
def tls_files(tmp_path) -> dict[str, str]:
    """A CA, and a client's certificate and key it signed, as PEM files."""
    authority = Authority.make(tmp_path / "tls", "test-ca")
    client = authority.issue(tmp_path / "tls", "agent")
    return {"ca": str(authority.certificate), "cert": str(client.certificate),
            "key": str(client.key)}
