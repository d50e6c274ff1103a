"""compute-agent's body: configuration, the agent, its servers, the wait for
SIGTERM. Entered through compute_agent.cmd.agent, which catches SIGHUP before this
module's imports run."""
from __future__ import annotations

import faulthandler
import gc
import signal
import sys
import threading
import time

from oslo_config import cfg
from oslo_log import log as logging

from compute_agent.cmd.common import (
    CommandHelp,
    exit_config_error,
    exit_store_error,
    load_config,
    print_output,
    setup_logging,
    tolerate_closed_stdout,
)
from compute_agent.cmd.config_check.whole import metrics_port_free
from compute_agent.daemon.composition import BROKER_PROBE_TIMEOUT_SECONDS, compose
from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.one_agent_run import check_one_agent_per_host
from compute_agent.daemon.probes import Phase
from compute_agent.daemon.reload_signal import ReloadSignal
from compute_agent.daemon.service import Agent, CycleOutcome
from compute_agent.daemon.supervisor import (
    EXIT_THREAD_DIED,
    SIGNAL_LOOK_SECONDS,
    Supervisor,
    exit_process,
)
from compute_agent.daemon.systemd import notify, watchdog_from_environment
from compute_agent.exception import ConfigError
from compute_agent.rpc import broker, host_server
from compute_agent.rpc.host_server import HostServer
from compute_agent.rpc.in_flight import Call
from compute_agent.store import lock
from compute_agent.store.errors import StateDirectoryInUse, StateDirectoryUnusable, StoreError, StoreRefused

LOG = logging.getLogger(__name__)
# A start that waits this long for the broker says so.
BROKER_WAIT_NOTICE_SECONDS = 5.0
# How long the RPC server's stop may take, once its calls in flight are
# answered, before the daemon stops without it: an idle daemon stops
# within 2 s of SIGTERM whatever the broker does.
SERVER_STOP_SECONDS = 1.0

PROG = "compute-agent"
HELP = CommandHelp(
    prog=PROG, usage=f"{PROG} --config-file F [--once]",
    description="The compute-node agent: keeps this host's resource-provider tree "
    "in Placement, claims the host's devices for instances and serves its RPC "
    "API until SIGTERM; --once runs one update cycle and exits.")

cli_opts = [
    cfg.BoolOpt("once", default=False,
                help="Run exactly one update cycle, then exit: one line on stdout "
                     "saying what it did, exit 0; on failure the line, with the "
                     "reason, on stderr, exit 1."),
]


def once_summary(outcome: CycleOutcome, requests: int, seconds: float) -> str:
    """What one cycle did, in one line."""
    cost = f"{requests} Placement requests, {seconds:.2f} s"
    result = outcome.result
    if not outcome.ok or result is None:
        return f"cycle failed ({cost}): {outcome.reason}"
    providers = 0 if result.tree is None else len(result.tree)
    return (f"cycle ok: {providers} providers in Placement, "
            f"{result.writes} writes, {len(result.warnings)} warnings, {cost}")


def run_once(agent: Agent) -> int:
    """One cycle, its summary; 0 when it succeeded."""
    started = time.monotonic()
    agent.driver.init_host()
    try:
        outcome = agent.run_cycle()
    finally:
        agent.driver.cleanup()
    line = once_summary(outcome, agent.sync.client.requests_sent,
                        time.monotonic() - started)
    if not outcome.ok:
        print(f"{PROG}: {line}", file=sys.stderr)
        return 1
    print_output(line)
    return 0


def main(reload_signal: ReloadSignal, argv=None) -> int:
    """The daemon, with ``reload_signal`` already catching SIGHUP."""
    tolerate_closed_stdout()
    try:
        conf = load_config(sys.argv[1:] if argv is None else argv, cli_opts,
                           placement_required=True, command_help=HELP)
        setup_logging(conf)
    except ConfigError as e:
        return exit_config_error(e)
    # Every option's value at debug level, as OpenStack services log them;
    # secret ones (passwords, transport_url) as "****".
    conf.log_opt_values(LOG, logging.DEBUG)
    # The broker's outage is the loop's one line each way (compute_agent/rpc/broker.py).
    broker.quiet_reconnect_lines()
    # Before the agent, which tells its probes the threads it saw die.
    supervisor = Supervisor()
    try:
        agent = checked_agent(conf, supervisor)
    except ConfigError as e:
        return exit_config_error(e)
    except (StateDirectoryInUse, StateDirectoryUnusable, StoreRefused, StoreError,
            AnotherAgentServesHost) as e:
        return exit_store_error(e)
    if reload_signal.deliver_to(agent):
        LOG.info("SIGHUP during start-up: the first cycle reads Placement afresh")
    if conf.once:
        try:
            return run_once(agent)
        except AnotherAgentServesHost as e:
            return exit_store_error(e)
    return serve(conf, agent, supervisor)


def checked_agent(conf: cfg.ConfigOpts, supervisor: Supervisor) -> Agent:
    """The agent, once everything that must hold before anything is
    written holds. Raises ConfigError, or the store's and the one-agent
    check's errors, with their one line."""
    if not conf.once:
        # What only the serving daemon needs: its metrics port, and a
        # broker that takes its login.
        metrics_port_free(conf)
        broker.refuse_rejected_login(conf, BROKER_PROBE_TIMEOUT_SECONDS)
    # Held until the process ends: before anything in the state
    # directory is read, so two agents never serve one store.
    lock.acquire(conf.state_path)
    # Before the store or compute_id is made: a mistyped state_path is
    # refused with nothing written.
    start = check_one_agent_per_host(conf, ask_the_bus=not conf.once)
    # The state directory is this host's (compute_agent/daemon/renamed_host.py),
    # unless Placement is still to tell the name an older store belongs to.
    learning = start.pending is not None and start.pending.learns_name
    return compose(conf, start=start, dead_threads=supervisor.dead_threads,
                   host_name=None if learning else conf.host)


def serve(conf: cfg.ConfigOpts, agent: Agent, supervisor: Supervisor) -> int:
    """Start the agent and its RPC servers, serve until SIGTERM or a
    thread's death, then stop them in order; the exit code."""
    supervisor.install()
    # A store removed or replaced under the agent: nothing more is
    # acknowledged, and the daemon stops with exit 2 (compute_agent/store/store.py).
    agent.manager.tracker.store.on_moved(supervisor.refuse)

    def on_term(signum, frame):
        LOG.info("Signal %d: stopping", signum)
        supervisor.request_stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # What every thread is doing, to stderr (the journal), without stopping:
    # nova's Guru Meditation signal, for a daemon that does not stop or answer.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:
        agent.start(watchdog_from_environment())
    except ConfigError as e:  # [metrics] listen cannot be served
        agent.stop()
        return exit_config_error(e)
    except AnotherAgentServesHost as e:  # found by the first cycle
        agent.stop()
        return exit_store_error(e)
    try:
        rpc = start_server(conf, agent, supervisor)
    except Exception as e:
        refusal = server_refusal(conf, e)
        if refusal is None:
            raise
        agent.stop()
        return exit_config_error(refusal)
    if rpc is None:
        # Stopped while the broker was awaited: no call was ever taken, and
        # the thread still waiting on the broker cannot be stopped.
        agent.stop()
        LOG.info("compute-agent stopped before it served RPC")
        exit_process(0)
    if agent.broker_watch is not None:
        agent.broker_watch.serving(rpc)
    # What start-up made (modules, config, the host's pools, the store's
    # rows) lives as long as the process: keep it out of the collector's
    # full passes, each of which would stall every call in flight (about
    # 40 ms for 70,000 objects on a 2-vCPU host).
    gc.freeze()
    if not supervisor.wake.is_set():
        # Start-up reconciliation is done and RPC's queues are declared; not
        # when a signal or a thread's death came during start-up.
        agent.move_to(Phase.SERVING)
        notify("READY=1")
        LOG.info("compute-agent running as host %s", conf.host)
    supervisor.wait()
    return stop(supervisor, agent, rpc, conf.graceful_shutdown_timeout)


def server_refusal(conf: cfg.ConfigOpts, error: Exception) -> ConfigError | None:
    """The one line for what the broker refused the RPC server's start for
    good, None for another failure: the login (the broker was down at the
    start's check, and refuses it now), or the host's queues, which it
    holds with another type or arguments than the config asks."""
    if broker.refuses_credentials(error):
        return broker.credentials_refusal(conf)
    return broker.declare_refusal(conf, error)


def start_server(conf: cfg.ConfigOpts, agent: Agent, supervisor: Supervisor
                 ) -> HostServer | None:
    """The host's RPC server (compute_agent/rpc/host_server.py), started.
    oslo.messaging waits for the broker for as long as it is away; the wait
    is said after BROKER_WAIT_NOTICE_SECONDS, and a stop request (SIGTERM)
    ends it: None then. Raises what starting it raised."""
    rpc = host_server.make_server(conf, agent)
    started = threading.Event()
    failure: list[BaseException] = []

    def start() -> None:
        try:
            # A declare the driver gives up is raised here, and said once.
            with broker.driver_lines_quiet(*broker.GIVE_UP_LINES):
                rpc.start()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            failure.append(e)
        finally:
            started.set()

    threading.Thread(target=start, name="rpc-start", daemon=True).start()
    waited = 0.0
    while not started.wait(SIGNAL_LOOK_SECONDS):
        if supervisor.wake.is_set():
            return None
        waited += SIGNAL_LOOK_SECONDS
        if waited == BROKER_WAIT_NOTICE_SECONDS:
            LOG.warning("Not serving RPC yet: waiting for the message broker at %s "
                        "(SIGTERM stops the wait)", broker.shown_hosts(conf))
    if failure:
        raise failure[0]
    return rpc


def drain(rpc: HostServer, bound: float) -> tuple[Call, ...]:
    """The graceful stop's first step: no API call taken from now on (the
    heartbeat still answered), and those taken waited for until answered,
    ``bound`` seconds at most; the calls the bound cut, each said."""
    count = rpc.in_flight.close()
    LOG.info("stopping: %d calls in flight, waiting up to %g s", count, bound)
    cut = rpc.in_flight.wait(bound)
    for call in cut:
        LOG.warning("Call %s of instance %s cut by graceful_shutdown_timeout (%g s): "
                    "the next start resumes or rolls it back", call.method,
                    call.instance_uuid or "-", bound)
    return cut


def stop_server(rpc: HostServer) -> bool:
    """Whether the server stopped (oslo.messaging's stop() and wait()),
    its calls in flight answered already (drain), within
    SERVER_STOP_SECONDS. A listener whose connection is being made again
    (the broker away) sees its stop only once the driver's attempt ends,
    up to rabbit_interval_max (30 s) later, and a dead one never: it is
    left behind, and takes nothing more."""

    def stop_and_wait() -> None:
        rpc.stop()
        rpc.wait()

    stopping = threading.Thread(target=stop_and_wait, name="rpc-stop", daemon=True)
    stopping.start()
    stopping.join(SERVER_STOP_SECONDS)
    if not stopping.is_alive():
        return True
    LOG.warning("The RPC listener did not stop within %g s: stopping without it",
                SERVER_STOP_SECONDS)
    return False


def stop(supervisor: Supervisor, agent: Agent, rpc: HostServer, drain_bound: float) -> int:
    """Take no more calls, answer those in flight within ``drain_bound``
    seconds, stop the RPC server, then the agent; the exit code."""
    agent.move_to(Phase.STOPPING)
    if supervisor.deaths:
        supervisor.exit_unless_stopped_in_time()
    else:
        notify("STOPPING=1")
    # Calls in flight finish before the store closes.
    if drain(rpc, drain_bound):
        # A call cut: its thread still runs, and the store must not close
        # under it. The process ends as after a kill, which the store's
        # records survive: the next start resumes or rolls back each
        # call it finds open (docs/operations.md#signals).
        exit_process(exit_code(supervisor))
    stopped = stop_server(rpc)
    agent.stop()
    code = exit_code(supervisor)
    if not stopped:
        # The listener left behind would hold the interpreter's exit.
        exit_process(code)
    return code


def exit_code(supervisor: Supervisor) -> int:
    if supervisor.deaths:
        supervisor.report()  # any that died on the way out
        return EXIT_THREAD_DIED
    if supervisor.refusal is not None:  # found by a later cycle, or the store gone
        return exit_store_error(supervisor.refusal)
    LOG.info("compute-agent stopped")
    return 0
