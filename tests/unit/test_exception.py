"""The agent's typed errors: their messages, and their arguments, which
are what crosses RPC and what the caller rebuilds each error from."""
from __future__ import annotations

import sys

from compute_agent.claims.model import MigrationRole
from compute_agent.exception import LiveMigrationRefused


def test_a_refusal_naming_its_side_by_role_crosses_rpc_as_before():
    # The side goes over the wire as the plain string it always was, so
    # older callers rebuild the same error with the same message.
    from oslo_messaging._drivers import common as wire

    from compute_agent.messaging import ALLOWED_EXMODS
    message = "live migration of instance inst refused on the destination: vf 0000:81:00.1"
    try:
        raise LiveMigrationRefused("inst", MigrationRole.DESTINATION, ["vf 0000:81:00.1"])
    except LiveMigrationRefused as e:
        assert str(e) == message and type(e.side) is str
        sent = wire.serialize_remote_exception(sys.exc_info())
    assert '"args": ["inst", "destination", ["vf 0000:81:00.1"]]' in sent
    rebuilt = wire.deserialize_remote_exception(sent, ALLOWED_EXMODS)
    assert type(rebuilt).__name__ == "LiveMigrationRefused_Remote"
    assert isinstance(rebuilt, LiveMigrationRefused)
    assert rebuilt.side == "destination"
    assert str(rebuilt).startswith(message)
