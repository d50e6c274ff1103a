"""What the tracker and the move steps check of a call before they decide
anything: its uuids, the move it names, and whether it retries an earlier
call that asked the same."""
from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Container

from compute_agent.claims.model import Migration, RequestDigest
from compute_agent.exception import InvalidRequest, RetryMismatch


def check_uuid(value: object, field_name: str) -> str:
    if isinstance(value, str):
        try:
            return str(uuid_lib.UUID(value))
        except ValueError:
            pass
    raise InvalidRequest(field_name, value, "must be a UUID")


def check_move_of(m: Migration, instance_uuid: str) -> Migration:
    """``m``, once it is checked to move the instance named: every move step
    asks this before anything else, for a move named with another
    instance's uuid is not this one's."""
    instance_uuid = check_uuid(instance_uuid, "instance_uuid")
    if m.instance_uuid != instance_uuid:
        raise InvalidRequest("instance_uuid", instance_uuid,
                             f"migration {m.uuid} moves instance {m.instance_uuid}")
    return m


def check_one_consumer(uuid: str, field_name: str, taken: Container[str],
                       taken_by: str) -> None:
    """An instance and a move never share a uuid on a host: each is a
    consumer of its own in Placement, and the store keys both by it. A
    call whose ``field_name`` names what is ``taken`` here as ``taken_by``
    is refused."""
    if uuid in taken:
        raise InvalidRequest(field_name, uuid, f"is {taken_by} on this host; an "
                             "instance and a move never share a uuid")


def check_retry(recorded: RequestDigest | None, asked: RequestDigest, uuid: str,
                what: str) -> None:
    """A call naming a record that an earlier call made is that call's
    retry, answered from the record, only when it asks the same; else
    RetryMismatch names the fields that differ. A record made before
    requests were recorded (store schema 6) cannot tell: it is answered
    as before, as its retry."""
    if recorded is None:
        return
    fields = recorded.differing(asked)
    if fields:
        raise RetryMismatch(uuid, fields, what)
