"""The libvirt connection's retry of a call that met a broken connection:
once, on a fresh connection, and said at DEBUG only, since the outage is
the dependency's one line each way (test_libvirtd_restarted_under_the_
update_loop saw a third line when a cycle's call met the break first)."""
from __future__ import annotations

import logging

import libvirt

from compute_agent.drivers.libvirt.connection import Connection

LOGGER = "compute_agent.drivers.libvirt.connection"


def broken_connection_error() -> libvirt.libvirtError:
    error = libvirt.libvirtError("Cannot recv data: Connection reset by peer")
    error.err = (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_FROM_RPC,
                 "Cannot recv data: Connection reset by peer", libvirt.VIR_ERR_ERROR,
                 None, None, None, 0, 0)
    return error


def test_a_call_that_meets_a_broken_connection_is_retried_once_and_said_at_debug(caplog):
    opened = []

    def open_test_driver(uri: str) -> libvirt.virConnect:
        opened.append(libvirt.open(uri))
        return opened[-1]

    connection = Connection("test:///default", open_fn=open_test_driver)
    calls = []

    def call(conn: libvirt.virConnect) -> str:
        calls.append(conn)
        if len(calls) == 1:
            raise broken_connection_error()
        return conn.getHostname()

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert connection.call(call)
    assert len(opened) == 2 and calls == opened  # the retry ran on a fresh connection
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert [level for level, _ in said] == ["DEBUG"], said
    assert "lost" in said[0][1] and "reconnecting" in said[0][1]
