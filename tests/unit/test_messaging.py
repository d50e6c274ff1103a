"""agent/messaging.py: the waits on the broker bounded, so that a listener
stops, and a transport closes, soon after it is asked."""
from __future__ import annotations

from oslo_config import cfg

from agent import config
from agent.messaging import bound_broker_waits


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
