"""compute_agent/messaging.py: the waits on the broker bounded, so that a listener
stops, and a transport closes, soon after it is asked; the agent's errors
keep their types on the wire across the rename of ``agent``."""
from __future__ import annotations

from oslo_config import cfg

from compute_agent import config
from compute_agent.exception import InvalidRequest, NoSuchInstance
from compute_agent.messaging import (
    ALLOWED_EXMODS,
    accept_errors_sent_as_before,
    bound_broker_waits,
    sent_as_before,
)


def rabbit_conf(**rabbit) -> cfg.ConfigOpts:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([], default_config_files=[], default_config_dirs=[])
    for name, value in rabbit.items():
        conf.set_override(name, value, group="oslo_messaging_rabbit")
    return conf


def broker_wait(conf: cfg.ConfigOpts) -> float:
    """oslo.messaging's longest wait on the socket, as impl_rabbit reckons it."""
    rabbit = conf.oslo_messaging_rabbit
    return rabbit.heartbeat_timeout_threshold / rabbit.heartbeat_rate / 2


def test_the_waits_on_the_broker_last_at_most_the_bound():
    conf = rabbit_conf()
    assert broker_wait(conf) == 10  # oslo.messaging's defaults: 60 s, rate 3
    bound_broker_waits(conf, 0.5)
    assert broker_wait(conf) <= 0.5


def test_an_operators_shorter_wait_is_kept():
    conf = rabbit_conf(heartbeat_rate=600)
    bound_broker_waits(conf, 0.5)
    assert conf.oslo_messaging_rabbit.heartbeat_rate == 600


def test_with_heartbeats_off_nothing_is_changed():
    conf = rabbit_conf(heartbeat_timeout_threshold=0)
    bound_broker_waits(conf, 0.5)
    assert conf.oslo_messaging_rabbit.heartbeat_rate == 3


# --- errors on the wire across the rename of agent to compute_agent -------

def sent(error: Exception) -> dict:
    """What oslo.messaging puts on the wire for ``error`` raised by a
    call, after the server has named it as this release does."""
    import json
    import sys

    from oslo_messaging._drivers import common as wire
    try:
        raise sent_as_before(error)
    except Exception:
        return json.loads(wire.serialize_remote_exception(sys.exc_info()))


def rebuilt(data: dict) -> Exception:
    import json

    from oslo_messaging._drivers import common as wire
    accept_errors_sent_as_before()
    return wire.deserialize_remote_exception(json.dumps(data), ALLOWED_EXMODS)


def test_this_agents_error_is_named_as_0_3_0_callers_rebuild_it():
    data = sent(InvalidRequest("destination", "nowhere", "no such host"))
    assert (data["module"], data["class"]) == ("agent.exception", "InvalidRequest")
    assert data["args"] == ["destination", None, "no such host", "'nowhere'"]


def test_an_error_that_is_not_ours_keeps_its_name():
    data = sent(ValueError("x"))
    assert (data["module"], data["class"]) == ("builtins", "ValueError")


def test_an_error_sent_by_a_0_3_0_agent_reaches_this_caller_as_its_type():
    error = rebuilt({"module": "agent.exception", "class": "NoSuchInstance",
                     "message": "m", "tb": [], "args": ["0f0e"], "kwargs": {}})
    assert isinstance(error, NoSuchInstance) and error.args == ("0f0e",)


def test_an_error_sent_under_the_new_name_reaches_this_caller_as_its_type():
    """What the release after this one sends."""
    error = rebuilt({"module": "compute_agent.exception", "class": "NoSuchInstance",
                     "message": "m", "tb": [], "args": ["0f0e"], "kwargs": {}})
    assert isinstance(error, NoSuchInstance)


def test_a_round_trip_keeps_type_arguments_and_message():
    original = InvalidRequest("destination", "nowhere", "no such host")
    message = str(original)
    error = rebuilt(sent(original))
    assert isinstance(error, InvalidRequest)
    assert error.args == ("destination", None, "no such host", "'nowhere'")
    assert str(error).startswith(message)


def test_another_module_named_on_the_wire_is_not_rebuilt():
    error = rebuilt({"module": "agent.config", "class": "Opt", "message": "m", "tb": [],
                     "args": [], "kwargs": {}})
    assert type(error).__name__ == "RemoteError"
