"""compute-agent: the daemon.

    compute-agent --config-file F          run until SIGTERM
    compute-agent --config-file F --once   run one update cycle and exit
"""
from __future__ import annotations

import gc
import signal
import sys
import threading

from oslo_config import cfg
from oslo_log import log as logging

from agent import state_lock
from agent.cmd.common import (exit_config_error, exit_store_error, load_config,
                              setup_logging)
from agent.exception import ConfigError
from agent.heartbeat import make_server as heartbeat_server
from agent.rpc import make_server
from agent.service import Agent, sd_notify
from agent.state import StoreError
from agent.state_lock import StateDirectoryInUse, StateDirectoryUnusable
from agent.store_check import StoreRefused

LOG = logging.getLogger(__name__)

cli_opts = [
    cfg.BoolOpt("once", default=False,
                help="Run exactly one update cycle, then exit: 0 on success, "
                     "1 with a one-line reason otherwise."),
]


def main(argv=None) -> int:
    try:
        conf = load_config(sys.argv[1:] if argv is None else argv, cli_opts,
                           placement_required=True)
        setup_logging(conf)
    except ConfigError as e:
        return exit_config_error(e)
    try:
        # Held until the process ends: before anything in the state
        # directory is read, so two agents never serve one store.
        state_lock.acquire(conf.state_path)
        agent = Agent.from_conf(conf)
    except ConfigError as e:
        return exit_config_error(e)
    except (StateDirectoryInUse, StateDirectoryUnusable, StoreRefused, StoreError) as e:
        return exit_store_error(e)
    if conf.once:
        agent.driver.init_host()
        try:
            outcome = agent.run_cycle()
        finally:
            agent.driver.cleanup()
        if not outcome.ok:
            print(f"compute-agent: {outcome.reason}", file=sys.stderr)
            return 1
        return 0

    stopped = threading.Event()

    def on_term(signum, frame):
        LOG.info("Signal %d: stopping", signum)
        stopped.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, lambda signum, frame: agent.drop_cache())
    agent.start()
    heartbeat = heartbeat_server(conf, agent)
    heartbeat.start()
    server = make_server(conf, agent)
    server.start()
    # What start-up made (modules, config, the host's pools, the store's
    # rows) lives as long as the process: keep it out of the collector's
    # full passes, each of which would stall every call in flight (about
    # 40 ms for 70,000 objects on a 2-vCPU host).
    gc.freeze()
    sd_notify("READY=1")
    LOG.info("compute-agent running as host %s", conf.host)
    while not stopped.wait(3600):
        pass
    sd_notify("STOPPING=1")
    # Calls in flight finish before the store closes.
    # Both stop listening at once; each waits out its own poll.
    server.stop()
    heartbeat.stop()
    server.wait()
    heartbeat.wait()
    agent.stop()
    LOG.info("compute-agent stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
