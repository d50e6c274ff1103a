"""The agent's typed errors: their messages, and their arguments, which
are what crosses RPC and what the caller rebuilds each error from."""
from __future__ import annotations

import inspect
import sys

import pytest

from compute_agent import exception
from compute_agent.claims.model import MigrationRole
from compute_agent.exception import (
    AgentError,
    BrokerUnavailable,
    CallFailed,
    ClaimFailed,
    ConfigError,
    DevicesInUse,
    GenerationConflict,
    InternalError,
    InvalidRequest,
    KeystoneUnavailable,
    LiveMigrationFailed,
    LiveMigrationOutcomeUnknown,
    LiveMigrationRefused,
    MoveInProgress,
    NoSuchInstance,
    PlacementError,
    PlacementUnavailable,
    RetryMismatch,
    SourceHostUp,
    StoreUnavailable,
    VersionCapped,
    shown,
)

I, M = "3f1c2a44-5b6d-4e7f-8a9b-0c1d2e3f4a5b", "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"

# One of each error, with the one line it says.
SAID = [
    (ConfigError("[pci] device_spec: not JSON"), "[pci] device_spec: not JSON"),
    (PlacementUnavailable("http://p:8778", "did not answer (connection refused)"),
     "Placement at http://p:8778 did not answer (connection refused)"),
    (KeystoneUnavailable("http://ks/v3", "refused the credentials (401)"),
     "Keystone at http://ks/v3 refused the credentials (401)"),
    (BrokerUnavailable("rabbit://mq:5672/", "did not answer (connection refused)"),
     "the message broker at rabbit://mq:5672/ did not answer (connection refused)"),
    (PlacementError("Placement answered 400 to GET /x: bad", 400, "placement.undefined_code"),
     "Placement answered 400 to GET /x: bad"),
    (GenerationConflict("PUT /x: moved", 409, "placement.concurrent_update"), "PUT /x: moved"),
    (InvalidRequest("spec.vcpus", 0, "must be at least 1"),
     "spec.vcpus: must be at least 1 (value: 0)"),
    (RetryMismatch(I, ["spec.vcpus", "allocations"], f"instance {I} was built with others"),
     f"instance {I} was built with others; this call differs from that one in spec.vcpus, "
     "allocations: it is not its retry, and nothing was changed (another request takes "
     "another uuid)"),
    (ClaimFailed("p", "VGPU", 2, 1), "cannot claim 2 VGPU from provider p: 1 free"),
    (NoSuchInstance(I), f"no such instance: {I}"),
    (MoveInProgress(I, M), f"instance {I} is in move {M}"),
    (SourceHostUp("compute-2", 20.0),
     "source_host: compute-2 is up (its agent answered a heartbeat within 20 s); evacuate "
     "only a down host, or force it"),
    (DevicesInUse(I, ["0000:81:00.1", "0000:81:00.2"]),
     f"instance {I}: its running guest still uses 0000:81:00.1, 0000:81:00.2; nothing "
     "was given back"),
    (CallFailed("build_instance", "boom"), "build_instance: failed: boom"),
    (StoreUnavailable("build_instance", "disk I/O error"),
     "build_instance: the agent's store failed: disk I/O error"),
    (InternalError("build_instance", "'numa_node'"),
     "build_instance: internal error in the agent: 'numa_node'"),
    (VersionCapped("list_instances", "1.1", "1.0"),
     "list_instances needs RPC API 1.1, but [upgrade_levels] compute_agent caps this "
     "client at 1.0"),
    (LiveMigrationRefused(I, MigrationRole.SOURCE, ["vf 0000:81:00.1 is in use", "x"]),
     f"live migration of instance {I} refused on the source: vf 0000:81:00.1 is in use; x"),
    (LiveMigrationFailed(I, M, "aborted", "job cancelled"),
     f"live migration {M} of instance {I} failed: job cancelled; the guest still runs on "
     "the source with its devices"),
    (LiveMigrationFailed(I, M, "outcome_unknown", "connection lost"),
     f"live migration {M} of instance {I} failed: connection lost; where the guest runs is "
     "unknown: look on both hosts before releasing anything"),
    (LiveMigrationOutcomeUnknown(I, M, "src", "dst", "no answer"),
     f"live migration {M} of instance {I}: whether the guest left src is unknown (no "
     "answer); nothing was rolled back: dst keeps its claim and the allocations stay as "
     "they are (the instance's on dst, the migration's on src). Once src answers, run the "
     f"same live migration again with --migration {M}: it finishes the move or rolls it "
     "back"),
]


@pytest.mark.parametrize("error, message", SAID)
def test_each_error_says_one_line_naming_what_it_is_about(error, message):
    assert str(error) == message


@pytest.mark.parametrize("error, message", SAID)
def test_each_error_rebuilt_from_its_arguments_is_the_same_error(error, message):
    """What oslo.messaging does with an error the caller may rebuild."""
    rebuilt = type(error)(*error.args)
    assert (str(rebuilt), rebuilt.args) == (message, error.args)


def test_every_error_of_the_module_is_among_those_checked():
    errors = {cls for _, cls in inspect.getmembers(exception, inspect.isclass)
              if issubclass(cls, AgentError) and cls.__module__ == exception.__name__}
    checked = {type(error) for error, _ in SAID}
    # The base and the dependency's base are raised only as their subclasses.
    assert errors - checked == {AgentError, exception.DependencyUnavailable}


def test_a_value_is_shown_whole_up_to_80_characters_then_cut_with_its_length():
    assert shown("a" * 78) == repr("a" * 78)  # 80 characters with its quotes
    assert shown("a" * 79) == "'" + "a" * 76 + "... (79 characters)"
    assert shown("a" * 100) == "'" + "a" * 76 + "... (100 characters)"
    assert shown(b"\x00" * 100) == repr(b"\x00" * 100)[:77] + "... (100 characters)"
    as_text = repr(list(range(40)))
    assert shown(list(range(40))) == as_text[:77] + f"... ({len(as_text)} characters)"


def test_an_invalid_request_sends_how_its_value_was_shown_not_the_value():
    error = InvalidRequest("spec.name", "x" * 1000, "too long")
    assert error.args == ("spec.name", None, "too long", "'" + "x" * 76 + "... (1000 characters)")
    assert error.value == "x" * 1000


def test_a_retry_mismatch_reads_as_an_invalid_request_naming_what_differs():
    error = RetryMismatch(I, ["spec.vcpus", "method"], "recorded")
    assert isinstance(error, InvalidRequest)
    assert (error.field, error.value, error.reason) == (
        "spec.vcpus, method", I, "not as in the call recorded")


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
