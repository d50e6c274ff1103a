"""compute-agent-ctl: an operator's view of, and hand on, a host's agent,
over the same RPC API conductors use (compute_agent.rpcapi).

    compute-agent-ctl --config-file F [--timeout S] COMMAND HOST ... [--json]

    host-info HOST                     what the agent on HOST reports
    tree HOST                          its provider tree, as it last saw Placement
    show HOST INSTANCE                 an instance: spec, devices, moves
    build HOST --spec FILE             FILE: {"instance_uuid", "spec", "allocations"}
                                       (etc/compute-agent/instance-spec.example.json)
    delete HOST INSTANCE
    prep-resize, live-migration-check
                 HOST --instance U --migration M --spec FILE
                                       FILE: {"spec", "allocations"} (destination claims)
    resize, finish-resize, confirm-resize, revert-resize,
    live-migration-post, live-migration-rollback, live-migration-source-rollback
                 HOST --instance U --migration M
    rebuild      HOST --instance U --migration M --spec FILE
                                       one evacuation step (rebuild_instance 1.0)
    hosts                              every host: up/down, last seen, instances
    evacuate SOURCE [--target HOST] [--force] [--parallel N]
                                       rebuild every instance of a down host
    live-migrate INSTANCE --target HOST [--migration UUID]
                                       move a running instance to HOST, live
                                       (again with --migration: resume it)

Output is short and human by default, the agent's answer as JSON with
--json. A refused or failed call is one line on stderr and exit 1; a bad
configuration is exit 2. With --json an error is one object on stdout,
{"error": ..., "exit_code": ...}, with the same exit code.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from oslo_config import cfg

from compute_agent.cmd.common import (
    CommandHelp,
    exit_config_error,
    json_requested,
    load_config,
    print_output,
    process_age,
    report_error,
    setup_logging,
    tolerate_closed_stdout,
)
from compute_agent.cmd.errors import SpecFileError
from compute_agent.conductor.evacuation import DEFAULT_PARALLEL, Evacuator
from compute_agent.conductor.live_migration import LiveMigrator
from compute_agent.exception import AgentError, ConfigError
from compute_agent.messaging import bound_broker_waits, messaging, name_reply_queues_at_random
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.rpc import broker
from compute_agent.rpc import schemas as rpc_schemas
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import BrokerUnreachable, NoAnswer
from compute_agent.rpc.heartbeat import Heartbeat
from compute_agent.rpc.outstanding import OutstandingCalls, Overdue
from compute_agent.rpc.sending import Waiting, WaitingFor
from compute_agent.tree.provider_tree import tree_lines

PROG = "compute-agent-ctl"
DEFAULT_TIMEOUT = 60.0
# What the command keeps of --timeout for its exit (its answer printed,
# the connection closed, the interpreter's end): a second on a loaded
# machine went past the bound.
EXIT_SECONDS = 0.5
# The thread that makes the command's calls.
CALL_THREAD = "rpc-call"
# What is left of --timeout for a command's calls, however long it took
# to start.
LEAST_TIMEOUT = 0.1
# Each call ends within its timeout whatever the broker does
# (compute_agent/rpc/sending.py); should one not, the command ends this long
# after that call's timeout all the same.
BROKER_GRACE = 0.5
# How long closing the transport may take (compute_agent.messaging.bound_broker_waits):
# unbounded, --timeout 5 took 10 s. For a process this short, the heartbeat
# every REPLY_POLL * 2 s it costs is nothing.
REPLY_POLL = 0.25
# How long the command's first login to the broker (the check that it
# takes this host's TLS and credentials) waits for a host that does not
# answer at all; the calls then wait for such a broker as for any other.
BROKER_LOGIN_SECONDS = 5.0
EXAMPLE_SPEC = "etc/compute-agent/instance-spec.example.json"
DEMO_SPEC = ".demo/instance-spec.json"
HELP = CommandHelp(
    prog=PROG, usage=f"{PROG} --config-file F [--timeout S] COMMAND HOST ... [--json]",
    description="An operator's view of, and hand on, the compute-agent of a host, "
    "over the RPC API conductors use: what it reports, its tree and instances, "
    "builds, deletes and move steps. The commands are listed after the options; "
    "'COMMAND --help' says what each takes.")


# --- human output -----------------------------------------------------------

def _assignment_rows(rows: list[dict]) -> list[str]:
    return [f"  {a['resource_class']} x{a['amount']}  device {a['device_id']}  "
            f"provider {a['provider_uuid']}  {a['owner']}  {a['state']}"
            + (f"  migration {a['migration_uuid']}" if a.get("migration_uuid") else "")
            for a in rows]


def _instance(i: dict) -> list[str]:
    spec = i.get("spec") or {}
    lines = [f"instance {i['uuid']}  {spec.get('name', '?')}  {spec.get('vcpus', '?')} "
             f"vCPU  {spec.get('memory_mb', '?')} MB  "
             f"{'running' if i.get('running') else 'not running'}"]
    lines += [f"assignments: {len(i['assignments'])}"] + _assignment_rows(i["assignments"])
    lines += [f"  migration {m['uuid']}  {m['kind']}  {m['role']}  {m['state']}"
              for m in i.get("migrations", [])]
    return lines


HOST_INFO_ORDER = ("host", "root_uuid", "rpc_version", "instances", "assignments",
                   "providers")


def _host_info(info: dict) -> list[str]:
    keys = [k for k in HOST_INFO_ORDER if k in info]
    keys += sorted(set(info) - set(keys))
    return [f"{k.replace('_', ' ')}: {info[k]}" for k in keys]


def in_placement_terms(providers: list[dict]) -> list[dict]:
    """The agent's tree by Placement's field names; an agent older than
    ``parent_provider_uuid`` names it ``parent_uuid``."""
    out = []
    for p in providers:
        p = dict(p)
        parent = p.pop("parent_uuid", None)
        p.setdefault("parent_provider_uuid", parent)
        out.append(p)
    return out


def _result(r: dict) -> list[str]:
    """Whatever a state-changing call answers: an instance, or what a step
    did (the assignments it claimed or released, the devices it chose, its
    state), one line per field."""
    if "assignments" in r and "spec" in r:
        return _instance(r)
    lines = []
    for key, value in r.items():
        label = {"uuid": "instance", "migration_uuid": "migration"}.get(key, key)
        if key == "instance":
            lines += _instance(value) if value else ["instance: gone from this host"]
        elif key == "devices":
            lines += [f"devices: {len(value)}"] + [
                f"  {d['kind']}  {d['device_id']}  assignment {d['assignment_id']}"
                for d in value]
        elif isinstance(value, list):  # assignments, released
            lines += [f"{label}: {len(value)}"] + _assignment_rows(value)
        else:
            lines.append(f"{label.replace('_', ' ')}: {value}")
    return lines


# --- commands ---------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    help: str
    call: Callable[..., Any]  # (api, args) -> result; (api, args, conf) for a conductor's
    # The result as the command's call gives it: each its own shape.
    render: Callable[[Any], list[str]] = _result
    # A conductor's command: it also reads Placement and the heartbeats.
    conductor: bool = False


# --- the conductor's commands: hosts and evacuate ----------------------------

# Seconds a progress read waits for a destination's answer.
POLL_TIMEOUT = 2.0


@contextmanager
def _evacuator(api, conf, parallel: int = DEFAULT_PARALLEL) -> Iterator[Evacuator]:
    """A host that has not answered within --timeout is shown down when
    --timeout is shorter than service_down_time: the command ends within
    its timeout. An evacuation's destination asks the source again, with
    service_down_time, before it rebuilds anything. Its heartbeat's and
    progress's clients closed after, their reply queues deleted (were left
    for oslo.messaging's 30 minutes)."""
    heartbeat = Heartbeat(conf, min(conf.service_down_time, conf.timeout),
                          outstanding=api.outstanding, on_wait=tell_waiting)
    poll = ComputeAgentAPI(conf, timeout=min(conf.timeout, POLL_TIMEOUT),
                           outstanding=api.outstanding)
    try:
        yield Evacuator(PlacementClient(adapter_from_conf(conf)), api, heartbeat, poll,
                        parallel)
    finally:
        heartbeat.close()
        poll.close()


def _when(epoch: float | None) -> str:
    """A down host's last answer is recorded nowhere (Evacuator.hosts)."""
    return "unknown" if epoch is None else time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                         time.gmtime(epoch))


def _hosts_lines(hosts: list[dict]) -> list[str]:
    return [f"{h['host']}  {h['state']}  last seen {_when(h['last_seen'])}  "
            f"instances {h['instances']}" for h in hosts]


def _outcome_line(o: dict) -> str:
    where = f" on {o['destination']}" if o.get("destination") else ""
    why = f": {o['error']}" if o.get("error") else ""
    return f"instance {o['instance']}  {o['state']}{where}{why}"


def _evacuation_lines(r: dict) -> list[str]:
    """The closing line; each instance's lines were shown as it progressed."""
    done = [o for o in r["instances"] if o["state"] == "running"]
    if not r["instances"]:
        return [f"nothing to evacuate on {r['source']}"]
    return [f"{r['source']}: {len(done)} of {len(r['instances'])} instances running "
            "elsewhere"]


# Instances one ctl evacuates at once, at most: each is a thread and an RPC
# call outstanding on the destination's executor.
MAX_PARALLEL = 32


def parallel_count(text: str) -> int:
    """--parallel N: an integer from 1 to MAX_PARALLEL."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number from 1 to {MAX_PARALLEL}")
    return n


def migration_uuid(text: str) -> str:
    """--migration UUID: a uuid, made canonical (the agents' form)."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a uuid") from None


def _hosts(api, a, conf):
    with _evacuator(api, conf) as evacuator:
        return evacuator.hosts()


def _evacuate(api, a, conf):
    def progress(o) -> None:
        if not a.json:
            print_output(_outcome_line(asdict(o)))
    # Leave the main thread's deadline room to print what was reached.
    deadline = time.monotonic() + max(conf.timeout - 1, 0.1)
    with _evacuator(api, conf, a.parallel) as evacuator:
        return evacuator.evacuate(a.agent_host, a.target, a.force, progress,
                                  deadline).as_dict()


# --- the conductor's commands: live-migrate ------------------------------------

def _live_migrate(api, a, conf):
    # Chosen here, so that a run that ends without an answer can name it
    # (resume_hint).
    a.migration = a.migration or str(uuid.uuid4())
    return LiveMigrator(PlacementClient(adapter_from_conf(conf)), api).live_migrate(
        a.instance, a.target, a.migration)


def resume_hint(a) -> str:
    """What to run when a live migration ended without an answer."""
    if a.name != "live-migrate" or not a.migration:
        return ""
    return (f"; live migration {a.migration} may be under way: run it again with "
            f"--migration {a.migration} to finish or roll it back")


def _live_migration_lines(r: dict) -> list[str]:
    return [f"instance {r['instance']}  live-migrated from {r['source']} to "
            f"{r['destination']}  migration {r['migration']}  "
            f"{'running' if r['running'] else 'not running'}"]


def spec_file_help(fields: tuple[str, ...]) -> str:
    """What a --spec FILE holds, in the schema's own limits."""
    spec = rpc_schemas.SPEC["properties"]
    described = {
        "instance_uuid": '"instance_uuid": the new instance\'s UUID',
        "spec": (f'"spec": {{"name": 1 to {spec["name"]["maxLength"]} printable characters, '
                 f'"vcpus": 1 to {spec["vcpus"]["maximum"]}, '
                 f'"memory_mb": 1 to {spec["memory_mb"]["maximum"]}}}'),
        "allocations": ('"allocations": what the scheduler allocated in Placement, by '
                        'provider: {PROVIDER_UUID: {"resources": {RESOURCE_CLASS: '
                        f'amount}}}}}}, at most {rpc_schemas.MAX_PROVIDERS} providers of '
                        f'{rpc_schemas.MAX_RESOURCE_CLASSES} classes each'),
    }
    return ("FILE: a JSON object with exactly " + "; ".join(described[f] for f in fields)
            + f". Its format: {EXAMPLE_SPEC} (placeholder providers); tools/demo writes "
            f"{DEMO_SPEC}, a build on the demo host.")


def read_spec(path: str, fields: tuple[str, ...]) -> dict:
    """The --spec file: a JSON object with exactly ``fields``."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise SpecFileError(f"spec file {path}: {e.strerror}") from None
    except ValueError as e:
        raise SpecFileError(f"spec file {path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise SpecFileError(f"spec file {path}: must be a JSON object with "
                            f"{', '.join(fields)}")
    for field in fields:
        if field not in data:
            raise SpecFileError(f"spec file {path}: {field}: missing")
    extra = sorted(set(data) - set(fields))
    if extra:
        raise SpecFileError(f"spec file {path}: {extra[0]}: unknown field "
                            f"(expected {', '.join(fields)})")
    return data


BUILD_FIELDS = ("instance_uuid", "spec", "allocations")
MOVE_CLAIM_FIELDS = ("spec", "allocations")


def _build(api, a):
    d = read_spec(a.spec, BUILD_FIELDS)
    return api.build_instance(a.agent_host, d["instance_uuid"], d["spec"], d["allocations"])


def _move_claim(method: str):
    def call(api, a):
        d = read_spec(a.spec, MOVE_CLAIM_FIELDS)
        return getattr(api, method)(a.agent_host, a.migration, a.instance, d["spec"],
                                    d["allocations"])
    return call


def _move(method: str):
    return lambda api, a: getattr(api, method)(a.agent_host, a.migration, a.instance)


COMMANDS: dict[str, Command] = {
    "host-info": Command("What the agent on HOST reports about itself: its root "
                         "provider, RPC version, instances, assignments, providers.",
                         lambda api, a: api.get_host_info(a.agent_host), _host_info),
    "tree": Command("HOST's provider tree, as the agent last saw it in Placement: "
                    "providers, inventories, traits.",
                    lambda api, a: in_placement_terms(api.get_provider_tree(a.agent_host)),
                    tree_lines),
    "show": Command("An instance on HOST: spec, assignments, moves.",
                    lambda api, a: api.get_instance(a.agent_host, a.instance), _instance),
    "build": Command("Claim the devices of the allocations in --spec FILE, then "
                     "define and start the instance on HOST.", _build),
    "delete": Command("Delete an instance on HOST and give its devices back.",
                      lambda api, a: api.delete_instance(a.agent_host, a.instance)),
    "hosts": Command("Every compute host in Placement: up or down by its agent's "
                     "heartbeat, when it last answered (unknown for a down host: "
                     "nothing records it), its instances.",
                     _hosts, _hosts_lines, conductor=True),
    "evacuate": Command("Rebuild every instance of the down host SOURCE elsewhere "
                        "(or on --target HOST), and show each one's progress.",
                        _evacuate, _evacuation_lines, conductor=True),
    "live-migrate": Command(
        "Move the running INSTANCE to --target HOST without stopping it, as a "
        "conductor does (RPC API 1.4): its host is where Placement has it; the "
        "source agent records the move, the allocations pass to the migration, "
        "HOST claims what allocation candidates on its tree offer and creates "
        "the vGPU mdevs, the source migrates the guest with its devices "
        "remapped, HOST settles. A refusal or failure rolls everything back: the "
        "guest runs on where it was. --timeout bounds the whole move.",
        _live_migrate, _live_migration_lines, conductor=True),
}
# Move steps: command -> (rpcapi method, whether it claims from --spec FILE).
MOVES = {
    "prep-resize": ("prep_resize", True),
    "resize": ("resize_instance", False),
    "finish-resize": ("finish_resize", False),
    "confirm-resize": ("confirm_resize", False),
    "revert-resize": ("revert_resize", False),
    "live-migration-check": ("check_can_live_migrate_destination", True),
    "live-migration-post": ("post_live_migration_at_destination", False),
    "live-migration-rollback": ("rollback_live_migration_at_destination", False),
    "live-migration-source-rollback": ("rollback_live_migration_at_source", False),
    "rebuild": ("rebuild_instance", True),
}
# What each move step does, as nova's compute manager names the step.
MOVE_STEP_HELP = {
    "prep-resize": "Resize, on the destination HOST: claim the new flavor's devices "
                   "from --spec FILE.",
    "resize": "Resize, on the source HOST: the migration takes over the "
              "instance's devices and the guest stops.",
    "finish-resize": "Resize, on the destination HOST: the guest runs on its new "
                     "devices.",
    "confirm-resize": "Confirm a resize or live migration on the source HOST: give "
                      "the old devices back.",
    "revert-resize": "Revert a resize, on either HOST: the instance gets its old "
                     "devices back, the new ones are released.",
    "live-migration-check": "Live migration, on the destination HOST: claim devices "
                            "from --spec FILE for the guest's new definition.",
    "live-migration-post": "Live migration done, on the destination HOST: the guest "
                           "runs here on the claimed devices; the move is settled.",
    "live-migration-rollback": "Live migration failed, on the destination HOST: "
                               "release what it claimed.",
    "live-migration-source-rollback": "Live migration failed or abandoned, on the "
                                      "source HOST: end the move (an announced one "
                                      "too); the guest runs on with its devices. Give "
                                      "the allocations back to the instance first.",
    "rebuild": "One evacuation step, on the destination HOST: claim devices from "
               "--spec FILE, build the guest and complete the move (evacuate SOURCE "
               "does every step for every instance).",
}
for _name, (_method, _claims) in MOVES.items():
    COMMANDS[_name] = Command(MOVE_STEP_HELP[_name],
                              _move_claim(_method) if _claims else _move(_method))


def add_parsers(subparsers) -> None:
    for name, command in COMMANDS.items():
        p = subparsers.add_parser(name, help=command.help, description=command.help,
                                  prog=f"{PROG} [--timeout S] {name}")
        # "host" would shadow [DEFAULT] host, which oslo.config refuses.
        if name == "hosts":
            p.set_defaults(agent_host="a host")
        elif name == "live-migrate":
            p.set_defaults(agent_host="the instance's host or --target")
            p.add_argument("instance", metavar="INSTANCE")
            p.add_argument("--target", required=True, metavar="HOST",
                           help="The host to move it to: an up compute host other "
                                "than its own.")
            p.add_argument("--migration", type=migration_uuid, metavar="UUID",
                           help="The move's uuid (default: a new one). That of a "
                                "run whose outcome was unknown resumes it: the "
                                "move is finished or rolled back.")
        else:
            p.add_argument("agent_host", metavar="SOURCE" if name == "evacuate"
                           else "HOST")
        if name == "evacuate":
            p.add_argument("--target", metavar="HOST",
                           help="Rebuild them all on HOST (default: any up host "
                                "with room).")
            p.add_argument("--force", action="store_true",
                           help="Evacuate though SOURCE answers its heartbeat "
                                "(it must be fenced some other way).")
            p.add_argument("--parallel", type=parallel_count, default=DEFAULT_PARALLEL,
                           metavar="N",
                           help=f"Evacuate N instances at once, 1 to {MAX_PARALLEL} "
                                f"(default {DEFAULT_PARALLEL}).")
        if name in ("show", "delete"):
            p.add_argument("instance", metavar="INSTANCE")
        if name in MOVES:
            p.add_argument("--instance", required=True, metavar="UUID")
            p.add_argument("--migration", required=True, metavar="UUID")
        if name == "build":
            p.add_argument("--spec", required=True, metavar="FILE",
                           help=spec_file_help(BUILD_FIELDS))
        if MOVES.get(name, (None, False))[1]:
            p.add_argument("--spec", required=True, metavar="FILE",
                           help=spec_file_help(MOVE_CLAIM_FIELDS)
                           + " The destination's claim: the instance is --instance.")
        p.add_argument("--json", action="store_true",
                       help="The answer as JSON; an error as {\"error\": ...}.")


cli_opts = [
    cfg.FloatOpt("timeout", default=DEFAULT_TIMEOUT, min=0.1, max=86400,
                 help="Seconds the command may wait, from its start, for the "
                      "agents' answers (or the heartbeats': the shorter of this "
                      "and service_down_time); it ends within that, and a second, "
                      "whatever the message broker does."),
    cfg.SubCommandOpt("command", handler=add_parsers, title="commands"),
]


_TOLD: set[tuple[WaitingFor, str]] = set()


def tell_waiting(waiting: Waiting) -> None:
    """What a long call waits for, while it waits: on stderr, so that
    --json's stdout stays one object; said once for each thing waited for
    and method, however many hosts (the heartbeats of every host) wait."""
    if (waiting.what, waiting.method) not in _TOLD:
        _TOLD.add((waiting.what, waiting.method))
        print(f"{PROG}: {waiting.line}", file=sys.stderr, flush=True)


def exit_now(code: int) -> NoReturn:
    """Ends the process although a call's thread still waits on the broker
    (the interpreter would wait for it at exit, for ever while the broker
    does not answer); what was printed is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def fail(message: str, as_json: bool) -> int:
    return report_error(message, 1, as_json, prefix="")


def wait_while_answered(worker: threading.Thread, outstanding: OutstandingCalls,
                        between_calls: float) -> Overdue | None:
    """Until ``worker`` ends (None), or one call has waited BROKER_GRACE
    past its own timeout, or, between calls, ``between_calls`` seconds
    have gone by with none sent. Watched call by call: the calls of an
    evacuation, or the heartbeats of every host, may together take far
    longer than --timeout, each within its own."""
    while worker.is_alive():
        overdue = outstanding.overdue(BROKER_GRACE, between_calls)
        if overdue is not None:
            return overdue
        worker.join(REPLY_POLL)
    return None


def broker_did_not_answer(seconds: float) -> str:
    return (f"the message broker did not answer within {seconds:g}s: is it running, "
            "and is [DEFAULT] transport_url right? (see --debug)")


def first_line(error: Exception) -> str:
    """A remote error's str() carries the agent's traceback after the
    message: the operator gets the message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def main(argv=None) -> int:
    """The command. Run as its own process (no ``argv``): its imports count
    against --timeout, and it ends although a call's thread still waits on
    the broker."""
    if argv is not None:
        return run(argv, already_ran=0.0)
    code = run(sys.argv[1:], already_ran=process_age())
    if any(t.name == CALL_THREAD and t.is_alive() for t in threading.enumerate()):
        # The interpreter would wait for that call at exit, for as long as
        # the broker does not answer.
        exit_now(code)
    return code


def run(argv: list[str], already_ran: float) -> int:
    """The exit code. ``already_ran``: seconds the command took before
    this, counted against its --timeout."""
    tolerate_closed_stdout()
    as_json = json_requested(argv)
    try:
        conf = load_config(argv, cli_opts, command_help=HELP)
        setup_logging(conf)
    except ConfigError as e:
        return exit_config_error(e, as_json)
    if not conf.debug:  # the error is our one line; its retries are noise
        logging.getLogger("oslo.messaging").setLevel(logging.CRITICAL)
    args = conf.command
    command = COMMANDS[args.name]
    asked = conf.timeout
    # The command ends within --timeout of its start, its imports included:
    # every wait below is of what is left.
    conf.set_override("timeout", max(asked - already_ran - EXIT_SECONDS, LEAST_TIMEOUT))
    bound_broker_waits(conf, REPLY_POLL)
    name_reply_queues_at_random(conf)
    api = ComputeAgentAPI(conf, timeout=conf.timeout, on_wait=tell_waiting)
    outcome: dict = {}

    def call():
        try:
            # A broker that refuses this host for good (its TLS, the
            # credentials) is one line and exit 2, as for the daemon, not a
            # wait of --timeout: the driver would try again and again. A
            # wait on the broker to its watchdog; the calls then have what
            # is left of --timeout.
            started = time.monotonic()
            login_timeout = min(conf.timeout, BROKER_LOGIN_SECONDS)
            with api.outstanding.one(login_timeout):
                broker.refuse_rejected_login(conf, login_timeout)
            conf.set_override("timeout", max(conf.timeout - (time.monotonic() - started),
                                             LEAST_TIMEOUT))
            api.timeout = conf.timeout
            outcome["result"] = (command.call(api, args, conf) if command.conductor
                                 else command.call(api, args))
        except Exception as e:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = e

    worker = threading.Thread(target=call, name=CALL_THREAD, daemon=True)
    worker.start()
    # Between calls (a Placement read, a live migration's wait between polls)
    # the operator's --timeout, not what was left of it at the start.
    overdue = wait_while_answered(worker, api.outstanding, asked + BROKER_GRACE)
    error = outcome.get("error")
    # Said in the operator's own --timeout: the watchdog's allowance past
    # it (BROKER_GRACE, the start-up spent) is ours.
    if overdue is not None and overdue.call:
        return fail(broker_did_not_answer(asked) + resume_hint(args), as_json)
    if overdue is not None:
        return fail(f"Placement did not answer within {asked:g}s: is it running, "
                    "and is the [placement] section right? (see --debug)"
                    + resume_hint(args), as_json)
    api.close()
    if isinstance(error, ConfigError):
        return exit_config_error(error, as_json)
    if isinstance(error, BrokerUnreachable):
        return fail(broker_did_not_answer(asked) + resume_hint(args), as_json)
    if isinstance(error, messaging.MessagingTimeout):
        host = error.host if isinstance(error, NoAnswer) else args.agent_host
        return fail(f"no answer from {host} within {asked:g}s: the "
                    "host may be down, or its compute-agent not running or not "
                    "connected to this broker" + resume_hint(args), as_json)
    if isinstance(error, (AgentError, messaging.MessagingException)):
        # Every error an RPC method raises arrives as its own type
        # (compute_agent.exception), VersionCapped is the client's own; the
        # dispatcher's (no such method, unsupported version) as RemoteError.
        return fail(first_line(error), as_json)
    if error is not None:
        raise error
    result = outcome["result"]
    text = (json.dumps(result, indent=2, sort_keys=True) if args.json
            else "\n".join(command.render(result)))
    print_output(text)
    if isinstance(result, dict) and result.get("ok") is False:
        # The answer, on stdout, says which; this line goes to stderr even
        # with --json, so stdout stays one JSON object.
        return fail("not every instance was evacuated (see above)", False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
