"""compute-agent-manage: operator commands.

    compute-agent-manage --config-file F tree [--json]
        The tree the agent would report now beside Placement's, what
        differs, and each class the host is unhealed for with the consumers
        that hold it (compute_agent/reports/tree.py). Read-only, beside a running
        agent. Exit 0 in step, 1 differences or unhealed, 2 when the store,
        the hypervisor or Placement could not be read.
    compute-agent-manage --config-file F audit [--json]
        Compare the store, the hypervisor's guests and Placement's
        allocations; change nothing. Exit 1 when anything is inconsistent,
        2 (unknown) when the store, the hypervisor or Placement could not
        be read.
    compute-agent-manage --config-file F status [--json]
        Whether libvirt, Keystone, Placement and the message broker answer
        now, the store's schema and integrity, the age of the last
        successful cycle, unhealed classes and the audit (compute_agent/reports/status.py
        judges). Read-only, beside a running agent. Exit 0 healthy, 1
        warnings, 2 broken.
    compute-agent-manage --config-file F rebuild-store (--dry-run | --yes)
        With the agent stopped and its store lost (missing or empty): make
        it again from the guests' metadata and Placement's allocations
        (compute_agent/store/rebuild.py says what that covers). Refuses, writing
        nothing, when anything cannot be mapped; never touches a store
        that is there. Exit 1 when refused, 2 when the agent runs.
    compute-agent-manage --config-file F accept-store
        With the agent stopped: take the store as it is for this host's
        latest, after an older copy was put back on purpose (the start
        refuses a store behind the host's record of its commits). Says
        what it accepts. Exit 2 when there is no sound store to accept or
        the agent runs.
    compute-agent-manage --config-file F rename-host NEW
        With the agent stopped, after the host was renamed on purpose and
        [DEFAULT] host set to NEW: record NEW as the host the state
        directory belongs to (compute_agent/store/renaming.py); the next
        start renames the root provider in Placement. Exit 1 when NEW is
        not [DEFAULT] host, or another agent serves NEW or the old name
        (Placement's roots, the bus; what cannot be asked refuses), 2 when
        there is no sound store or the agent runs.
    compute-agent-manage --config-file F heal [--dry-run] [--json] [--yes]
        With the agent stopped: move the allocations a change of model left
        on old providers, and end every reserved-until-healed hold, in one
        POST /reshaper. Asks first on a terminal unless --yes. Exit 1 when
        it refuses, 2 when the agent runs. With --dry-run: the plan, or
        "nothing to heal"; read-only, beside a running agent.
    compute-agent-manage --config-file F device list|clean|release [ADDRESS] [--yes] [--json]
        One-time-use devices, through the running agent (its RPC API, as
        conductors reach it): ``list`` those used and not clean; ``clean
        ADDRESS`` runs a device's cleaning command again and waits for its
        end (exit 1 when it fails); ``release ADDRESS --yes`` gives back a
        device an operator cleaned by hand. Exit 2 when the agent does not
        answer.
    compute-agent-manage --config-file F upgrade-check [--json]
        With the new version installed and its config, before the service
        restarts: the store's schema can be migrated, the configured model
        leaves the host healed, no move is in flight
        (compute_agent/cmd/upgrade_check.py). Read-only, beside a running agent.
        oslo.upgradecheck's table and exit codes: 0 success, 1 warning,
        2 failure.
    compute-agent-manage --config-file F bus-permissions HOST [--user NAME] [--json]
        The RabbitMQ permissions that let HOST's agent do all it does on
        the bus and no more (compute_agent/rpc/bus_permissions.py), for a
        broker user of HOST's own (NAME, by default HOST), and the
        rabbitmqctl lines that set them on transport_url's virtual host.
        Reads nothing but the config. Exit 2 for a HOST that is not a host
        name, or a transport other than rabbit.

With --json, an error is one object on stdout, {"error": ..., "exit_code":
...}, with the same exit code.
"""
from __future__ import annotations

import enum
import json
import logging
import shlex
import sys
import textwrap
import time
from pathlib import Path

from oslo_config import cfg

from compute_agent.claims.model import UseState
from compute_agent.cmd import upgrade_check
from compute_agent.cmd.common import (
    CONFIG_ERROR_EXIT,
    CommandHelp,
    exit_config_error,
    exit_store_error,
    json_requested,
    load_config,
    print_output,
    report_error,
    setup_logging,
    tolerate_closed_stdout,
)
from compute_agent.cmd.config_check.value_rules import host_name
from compute_agent.cmd.errors import BadValue
from compute_agent.common.pci_address import canonical_address
from compute_agent.compute.reconcile import Report
from compute_agent.daemon.composition import compose, load_driver
from compute_agent.daemon.one_agent_run import PROBE_DEADLINE_SECONDS
from compute_agent.daemon.renamed_host import served_elsewhere
from compute_agent.daemon.service import Agent
from compute_agent.dependencies import Unknown
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import AgentError, ConfigError, shown
from compute_agent.health.rules import UnhealthyProvider, unhealthy_providers
from compute_agent.placement.allocations import tree_allocations
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.reports import run
from compute_agent.reports import status as status_rules
from compute_agent.reports.run import read_beside_agent, tree_report
from compute_agent.reports.tree import TreeVerdict
from compute_agent.rpc import broker
from compute_agent.rpc.bus_permissions import (
    BusPermissions,
    Names,
    anchored,
    bus_permissions,
    queue_naming,
)
from compute_agent.rpc.heartbeat import agent_serving
from compute_agent.store import lock, node_identity
from compute_agent.store.acceptance import accept_store
from compute_agent.store.assignment_id import new_assignment_id
from compute_agent.store.check import StoreFile
from compute_agent.store.errors import RebuildRefused, StateDirectoryInUse, StateDirectoryUnusable, StoreError
from compute_agent.store.inspection import inspect_store, stored_host
from compute_agent.store.rebuild import RebuiltStore, RowSource, plan_rebuild
from compute_agent.store.renaming import rename_host
from compute_agent.store.schema import SCHEMA_VERSION
from compute_agent.store.store import STORE_FILE, create_filled
from compute_agent.tree.host_tree import build_tree
from compute_agent.tree.policy import tree_policy_from_conf
from compute_agent.tree.provider_tree import tree_as_dicts, tree_lines

PROG = "compute-agent-manage"
HELP = CommandHelp(
    prog=PROG, usage=f"{PROG} --config-file F COMMAND [--json] ...",
    description="Operator commands on this host's agent, its store and its "
    "providers in Placement: compare and audit (read-only, beside a running "
    "agent), rebuild a lost store, heal stranded allocations (the agent "
    "stopped). The commands are listed after the options; 'COMMAND --help' "
    "says what each takes.")


def tree(conf: cfg.ConfigOpts) -> int:
    """Read-only, beside a running agent (as audit): no lock, nothing
    created, nothing written to Placement."""
    try:
        report = read_beside_agent(conf, tree_report)
    except (AgentError, StoreError, DriverUnavailable) as e:
        return report_error(e, TreeVerdict.UNKNOWN, conf.command.json, prefix="tree unknown: ")
    if conf.command.json:
        print_output(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print_output("\n".join(
            ["Placement:"] + ["    " + line for line in tree_lines(
                tree_as_dicts(report.placement))]
            + ["Discovered (what the agent would report now):"]
            + ["    " + line for line in tree_lines(tree_as_dicts(report.discovered))]
            + report.describe()))
    return report.verdict


JSON_HELP = 'The report as JSON; an error as {"error": ...}.'


def add_parsers(subparsers) -> None:
    def add(name: str, text: str):
        return subparsers.add_parser(name, help=text, description=text,
                                     prog=f"{PROG} {name}")

    tree = add("tree", "Show the tree the agent would report beside Placement's, "
               "what differs and what is unhealed. Exit 0 in step, 1 differences or "
               "unhealed, 2 unknown.")
    tree.add_argument("--json", action="store_true", help=JSON_HELP)
    audit = add("audit", "Report what the store, the guests and Placement "
                "disagree on; change nothing. Exit 0 consistent, 1 inconsistent, "
                "2 unknown (a source could not be read).")
    audit.add_argument("--json", action="store_true", help=JSON_HELP)
    status = add("status", "Check libvirt, Keystone, Placement, the message broker, "
                 "the store, the update loop, unhealed classes and the audit; "
                 "change nothing. Exit 0 healthy, 1 warnings, 2 broken.")
    status.add_argument("--json", action="store_true", help=JSON_HELP)
    rebuild = add("rebuild-store", "Make a lost store again from the guests' "
                  "metadata and Placement's allocations (the agent stopped).")
    mode = rebuild.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true",
                      help="Show what would be written; write nothing.")
    mode.add_argument("--yes", action="store_true", help="Write it.")
    add("accept-store", "Take the store as it is for this host's latest (an older "
        "copy put back on purpose), the agent stopped; say what is accepted.")
    rename = add("rename-host", "Record NEW, [DEFAULT] host, as the host the state "
                 "directory belongs to, after a rename on purpose (the agent stopped); "
                 "the next start renames the root provider in Placement.")
    rename.add_argument("new_host", metavar="NEW", help="The host's new name, as its "
                        "[DEFAULT] host now says.")
    heal = add("heal", "Move the allocations a change of model left on old "
               "providers to the current ones, in one reshape (the agent stopped).")
    heal.add_argument("--dry-run", action="store_true",
                      help="Print the plan, or 'nothing to heal'; change nothing. "
                      "Read-only: runs beside a running agent.")
    heal.add_argument("--json", action="store_true",
                      help="Print the plan as JSON; an error as {\"error\": ...}.")
    heal.add_argument("--yes", action="store_true", help="Do not ask.")
    device = add("device", "One-time-use devices, through the running agent: list "
                 "those used and not clean, clean one again (its clean_command), or "
                 "release one cleaned by hand (--yes). Exit 1 refused or the cleaning "
                 "failed, 2 the agent does not answer.")
    device.add_argument("action", choices=[a.value for a in DeviceAction],
                        help="list, clean ADDRESS or release ADDRESS --yes")
    device.add_argument("address", nargs="?", metavar="ADDRESS",
                        help="The device's PCI address, dddd:bb:ss.f.")
    device.add_argument("--yes", action="store_true",
                        help="release: the device is clean, give it back.")
    device.add_argument("--json", action="store_true", help=JSON_HELP)
    upgrade = add("upgrade-check", "Before restarting on a new version: can it "
                  "migrate the store, does its model leave the host healed, is any "
                  "move in flight. Exit 0 success, 1 warning, 2 failure.")
    upgrade.add_argument("--json", action="store_true",
                         help="The results as JSON rather than a table.")
    permissions = add("bus-permissions", "Print the RabbitMQ permissions that let "
                      "HOST's agent serve its queues, answer its callers and call "
                      "heartbeats, and nothing more; and the rabbitmqctl lines that "
                      "set them. Exit 2 for a bad HOST.")
    permissions.add_argument("bus_host", metavar="HOST",
                             help="The host's name, as its [DEFAULT] host.")
    permissions.add_argument("--user", metavar="NAME",
                             help="HOST's broker user (default: HOST).")
    permissions.add_argument("--json", action="store_true",
                             help='The permissions as {"configure", "write", "read", '
                             '"topic": [{"exchange", "write", "read"}]}; an error as '
                             '{"error": ...}.')


# audit's exit codes: never "consistent" when a source was not read.
AUDIT_CONSISTENT, AUDIT_INCONSISTENT, AUDIT_UNKNOWN = 0, 1, 2


def audit_report(agent: Agent) -> Report:
    """The reconciliation's findings, fixing nothing. Placement not
    answering is in the report's ``unknown``, with why."""
    try:
        agent.sync.refresh()
    except AgentError as e:
        unknown = str(e)
    else:
        unknown = ""
    report = agent.reconcile(at_start=True, fix=False)
    if report.unknown and unknown:
        report.unknown[:] = [f"{what}: {unknown}" for what in report.unknown]
    return report


def audit(conf: cfg.ConfigOpts) -> int:
    """Read-only, beside a running agent: no lock, nothing created."""
    try:
        report = read_beside_agent(conf, audit_report)
    except (AgentError, StoreError, DriverUnavailable) as e:
        report = Report(unknown=[str(e)])
    if conf.command.json:
        print_output(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print_output("\n".join(
            [f"{f.kind}  {f.subject}  {f.detail}" for f in report.findings]
            + [f"not read: {line}" for what in report.unknown
               for line in what.splitlines()]
            + ["unknown" if report.unknown else "consistent" if report.consistent
               else f"{len(report.findings)} inconsistencies"]))
    if report.unknown:
        return AUDIT_UNKNOWN
    return AUDIT_CONSISTENT if report.consistent else AUDIT_INCONSISTENT


def status(conf: cfg.ConfigOpts) -> int:
    """Read-only, beside a running agent (as audit): each source asked on
    its own, so one that is down leaves the others' facts known."""
    facts = status_rules.judge(status_facts(conf))
    if conf.command.json:
        print_output(json.dumps(facts.as_dict(), indent=2, sort_keys=True))
    else:
        print_output("\n".join(facts.lines()))
    return int(facts.level)


def status_facts(conf: cfg.ConfigOpts) -> status_rules.StatusFacts:
    root_uuid = node_identity.load(conf.state_path)
    keystone, placement = run.placement(conf, root_uuid)
    unhealed: tuple[str, ...] | Unknown
    unhealthy: tuple[UnhealthyProvider, ...] | Unknown
    try:
        report_of_tree, report = read_beside_agent(
            conf, lambda agent: (tree_report(agent), audit_report(agent)))
        unhealed = tuple(sorted({u.resource_class for u in report_of_tree.unhealed}))
        unhealthy = tuple(unhealthy_providers(report_of_tree.placement))
        audit_found = (Unknown("; ".join(report.unknown))
                       if report.unknown else
                       tuple(f"{f.kind} {f.subject}: {f.detail}"
                             for f in report.findings if not f.fixed))
    except (AgentError, StoreError, DriverUnavailable) as e:
        unhealed = audit_found = unhealthy = Unknown(
            str(e).splitlines()[0])
    return status_rules.StatusFacts(
        now=time.time(), cycle_seconds=conf.update_interval + conf.update_jitter,
        code_schema_version=SCHEMA_VERSION,
        hypervisor=run.hypervisor(conf), keystone=keystone,
        placement=placement, broker=run.broker(conf),
        store=run.store(Path(conf.state_path) / STORE_FILE),
        cycle=run.last_cycle(conf.state_path),
        unhealed=unhealed, audit=audit_found, device_health=unhealthy)


def rebuild_store(conf: cfg.ConfigOpts) -> int:
    """Holding the state directory (the agent must be stopped)."""
    lock.acquire(conf.state_path)
    root_uuid = node_identity.load(conf.state_path)
    path = Path(conf.state_path) / STORE_FILE
    if root_uuid is None:
        raise AgentError(f"{conf.state_path}/{node_identity.FILENAME} does not exist: "
                         "no root provider to rebuild the store for")
    found = inspect_store(path)
    if found.file is StoreFile.VALID:
        raise AgentError(f"store {path} is there and valid: it is never overwritten "
                         "(move it aside first if it is behind)")
    if found.file is StoreFile.CORRUPT:
        raise AgentError(f"store {path} is unusable ({found.detail}): move it aside, "
                         "then rebuild")
    driver = load_driver(conf)
    client = PlacementClient(adapter_from_conf(conf))
    try:
        rebuilt = _plan_from_host(conf, driver, client, root_uuid)
    finally:
        driver.cleanup()
    for line in _describe_rebuild(rebuilt):
        print(line)
    if conf.command.dry_run:
        print(f"dry run: {path} not written")
        return 0
    create_filled(path, root_uuid, rebuilt.instances, rebuilt.assignments)
    print(f"{path} rebuilt: {len(rebuilt.instances)} instances, "
          f"{len(rebuilt.assignments)} assignments")
    return 0


def accept(conf: cfg.ConfigOpts) -> int:
    """Holding the state directory (the agent must be stopped)."""
    lock.acquire(conf.state_path)
    accepted = accept_store(Path(conf.state_path) / STORE_FILE)
    print_output(accepted.describe())
    return 0


def rename(conf: cfg.ConfigOpts) -> int:
    """Holding the state directory (the agent must be stopped); NEW must
    be what the config already says, so that the next start serves it,
    and no other agent may serve NEW or the old name (Placement's roots,
    the bus): what cannot be asked refuses."""
    new = conf.command.new_host
    if new != conf.host:
        raise AgentError(f"rename-host {new}: [DEFAULT] host is {conf.host} in the "
                         f"config; set it to {new} there first, nothing was written")
    lock.acquire(conf.state_path)
    path = Path(conf.state_path) / STORE_FILE
    old = stored_host(path).name
    new_roots = frozenset(PlacementClient(adapter_from_conf(conf)).get_roots_named(new))
    answered = set()
    for name in sorted({new, old} - {None}):
        answer = agent_serving(conf, name, PROBE_DEADLINE_SECONDS)
        if isinstance(answer, Unknown):
            raise AgentError(f"rename-host {new}: whether another agent serves host {name} "
                             f"cannot be told: {answer.why}; nothing was written")
        if answer is not None:
            answered.add(name)
    refused = served_elsewhere(new, old, node_identity.load(conf.state_path), new_roots,
                               frozenset(answered))
    if refused:
        raise AgentError(refused)
    print_output(rename_host(path, new).describe())
    return 0


def _plan_from_host(conf: cfg.ConfigOpts, driver, client: PlacementClient,
                    root_uuid: str) -> RebuiltStore:
    """What the guests and Placement say, mapped (store_rebuild)."""
    try:
        built = build_tree(driver.get_host_inventory(),
                           tree_policy_from_conf(conf, root_uuid))
        guests = {u: driver.describe_guest(u) for u in sorted(driver.list_guests())}
    except DriverUnavailable as e:
        raise AgentError(f"the hypervisor did not answer: {e}") from None
    unreadable = [f"guest {u}: its definition cannot be read back" for u, g
                  in guests.items() if g is None]
    if unreadable:
        raise RebuildRefused(unreadable)
    names = {p["name"]: p["uuid"] for p in client.get_tree(root_uuid)}
    return plan_rebuild(guests, tree_allocations(client, root_uuid),
                        RowSource(built.pools_by_uuid(names), driver.boot_id(),
                                 new_assignment_id))


def _describe_rebuild(rebuilt: RebuiltStore) -> list[str]:
    lines = []
    for uuid, spec in sorted(rebuilt.instances.items()):
        lines.append(f"instance {uuid}  {spec['name']}  {spec['vcpus']} vCPU  "
                     f"{spec['memory_mb']} MB")
        lines += [f"  {a.resource_class} x{a.amount}  device {a.device_id}  "
                  f"provider {a.provider_uuid}  assignment {a.id}"
                  for a in rebuilt.assignments if a.instance_uuid == uuid]
    return lines


def heal(conf: cfg.ConfigOpts) -> int:
    from compute_agent.heal.run import run_heal

    args = conf.command
    interactive = sys.stdin.isatty() and sys.stderr.isatty()

    def show(plan) -> None:
        if args.json:
            json.dump(plan.as_dict(), sys.stdout, indent=2, sort_keys=True)
            print()
        else:
            for line in plan.describe():
                print(line)

    def confirm(plan) -> bool:
        show(plan)
        if args.yes or not interactive:
            return True
        return input("Apply this plan? [y/N] ").strip().lower() in ("y", "yes")

    def progress(line: str) -> None:
        if interactive:
            print(line, file=sys.stderr)

    if interactive:
        print("Reading Placement and planning...", file=sys.stderr)
    if args.dry_run:
        # A dry run only reads: beside a running agent, as tree and audit.
        result = read_beside_agent(
            conf, lambda agent: run_heal(agent, dry_run=True, progress=progress))
    else:
        # Heal writes Placement and the store as the agent would: the agent
        # is stopped (or heals itself at start with [heal] on_startup).
        lock.acquire(conf.state_path)
        agent = compose(conf)
        agent.driver.init_host()
        try:
            result = run_heal(agent, confirm=confirm, progress=progress)
        finally:
            agent.driver.cleanup()
            agent.manager.tracker.store.close()
    plan = result.plan
    if plan.empty and not args.json:
        print("nothing to heal")
    elif plan.empty or args.dry_run:
        show(plan)
    summary = (f"{len(plan.moves)} allocations of {len(plan.consumers)} consumers, "
               f"inventories of {len(plan.inventories)} providers")
    if result.store.moved:
        print(f"store: {len(result.store.moved)} assignments moved to the providers "
              "that hold their allocations", file=sys.stderr)
    for unaligned in result.store.unaligned:
        print(f"store row left as it is: {unaligned}", file=sys.stderr)
    if result.applied:
        print(f"healed: {summary}, in one reshape", file=sys.stderr)
    elif not plan.empty and not args.dry_run:
        print("not applied", file=sys.stderr)
    elif args.dry_run and not plan.empty:
        print(f"would heal: {summary}", file=sys.stderr)
    return 0


class DeviceAction(str, enum.Enum):
    LIST = "list"
    CLEAN = "clean"
    RELEASE = "release"


# device clean waits for the cleaning's end this much longer than the
# longest clean_timeout, and asks this often.
CLEAN_WAIT_MARGIN_S = 30.0
CLEAN_POLL_S = 0.2
# What device waits for each answer of the agent.
DEVICE_CALL_TIMEOUT_S = 30.0
AGENT_UNANSWERED = 2


def device_use_line(entry: dict) -> str:
    state = ("held by an instance" if entry["held"] else "being cleaned"
             if entry["cleaning"] else entry["state"].replace("_", " "))
    reason = f" ({entry['reason']})" if entry["reason"] else ""
    return f"{entry['address']}: {state}{reason}"


def device_request(conf: cfg.ConfigOpts) -> tuple[DeviceAction, str | None]:
    """The action and its canonical address, or ConfigError naming what
    is wrong with them, before the agent is asked anything."""
    args = conf.command
    action = DeviceAction(args.action)
    if action is DeviceAction.LIST:
        return action, None
    if args.address is None:
        raise ConfigError(f"device {action.value}: ADDRESS is required")
    try:
        address = canonical_address(args.address)
    except ValueError:
        raise ConfigError(f"device {action.value}: ADDRESS: not a PCI address "
                          f"dddd:bb:ss.f (value: {args.address!r})") from None
    if action is DeviceAction.RELEASE and not args.yes:
        raise ConfigError("device release: gives the device back to scheduling; "
                          "say --yes once it is clean")
    return action, address


def wait_for_cleaning(api, host: str, address: str, deadline: float) -> dict:
    """The device's entry once its cleaning ended: its failure, or
    {"state": "clean"} when it is back."""
    while True:
        entry = next((e for e in api.list_device_uses(host)
                      if e["address"] == address), None)
        if entry is None:
            return {"address": address, "state": "clean", "reason": "",
                    "held": False, "cleaning": False}
        ended = entry["state"] != UseState.USED.value and not entry["cleaning"]
        if ended or time.monotonic() > deadline:
            return entry
        time.sleep(CLEAN_POLL_S)


def device(conf: cfg.ConfigOpts) -> int:
    """Through the running agent, over RPC: nothing is read or written
    around its store."""
    from compute_agent.cmd.ctl import REPLY_POLL, first_line
    from compute_agent.messaging import bound_broker_waits
    from compute_agent.rpc.client import ComputeAgentAPI
    from compute_agent.rpc.errors import BrokerUnreachable, NoAnswer

    as_json = conf.command.json
    try:
        action, address = device_request(conf)
    except ConfigError as e:
        return report_error(e, 1, as_json, prefix="")
    longest = max((s.clean_timeout for s in tree_policy_from_conf(
        conf, node_identity.new_uuid()).device_specs if s.clean_command), default=0)
    if not conf.debug:  # the error is our one line; its retries are noise
        logging.getLogger("oslo.messaging").setLevel(logging.CRITICAL)
    bound_broker_waits(conf, REPLY_POLL)
    api = ComputeAgentAPI(conf, timeout=DEVICE_CALL_TIMEOUT_S)
    try:
        if action is DeviceAction.LIST:
            result: dict | list = api.list_device_uses(conf.host)
        elif action is DeviceAction.RELEASE:
            assert address is not None  # device_request names one but to list
            result = api.release_device(conf.host, address)
        else:
            assert address is not None
            api.clean_device(conf.host, address)
            result = wait_for_cleaning(api, conf.host, address,
                                       time.monotonic() + longest + CLEAN_WAIT_MARGIN_S)
    except (NoAnswer, BrokerUnreachable) as e:
        return report_error(f"the agent of {conf.host} did not answer: is compute-agent "
                            f"running? ({first_line(e)})", AGENT_UNANSWERED, as_json,
                            prefix="")
    except AgentError as e:
        return report_error(first_line(e), 1, as_json, prefix="")
    finally:
        api.close()
    entries = result if isinstance(result, list) else [result]
    if as_json:
        print_output(json.dumps(result, indent=2, sort_keys=True))
    else:
        print_output("\n".join(device_use_line({"reason": "", "held": False,
                                                "cleaning": False, **e})
                               for e in entries) or "no one-time-use device waits")
    failed = (action is DeviceAction.CLEAN and isinstance(result, dict)
              and result["state"] != "clean")
    return 1 if failed else 0


def bus_permissions_request(conf: cfg.ConfigOpts) -> tuple[str, str]:
    """HOST and the virtual host of transport_url, or ConfigError naming
    what is wrong with them."""
    host = conf.command.bus_host
    try:
        host_name(host)
    except BadValue as e:
        raise ConfigError(f"bus-permissions: HOST: {e} (value: {shown(host)})") from None
    hosts = broker.rabbit_hosts(conf)
    if isinstance(hosts, Unknown):
        raise ConfigError("bus-permissions: [DEFAULT] transport_url: not a rabbit:// "
                          "URL; these are RabbitMQ's permissions")
    return host, hosts[0].virtual_host


def bus_permissions_lines(host: str, user: str, vhost: str,
                          permissions: BusPermissions) -> list[str]:
    """What each permission covers, then the rabbitmqctl lines that set them."""
    def covers(what: str, names: tuple[Names, ...]) -> list[str]:
        return [f"  {what}:", textwrap.fill(", ".join(n.shown for n in names), width=79,
                                            initial_indent="    ",
                                            subsequent_indent="    ",
                                            break_on_hyphens=False)]

    lines = [f"The agent of {host}, as broker user {user} on virtual host {vhost}, may",
             *covers("configure (declare, delete)", permissions.configure),
             *covers("write (publish to; bind a queue)", permissions.write),
             *covers("read (consume from; bind to an exchange)", permissions.read)]
    for topic in permissions.topic:
        lines += [*covers(f"publish to exchange {topic.exchange} with the routing key",
                          topic.write),
                  *covers(f"bind to exchange {topic.exchange} with the routing key",
                          topic.read)]
    lines += ["", "rabbitmqctl " + shlex.join(
        ["set_permissions", "-p", vhost, user, *(anchored(names) for names in (
            permissions.configure, permissions.write, permissions.read))])]
    lines += ["rabbitmqctl " + shlex.join(
        ["set_topic_permissions", "-p", vhost, user, topic.exchange, *(
            anchored(names) for names in (topic.write, topic.read))])
        for topic in permissions.topic]
    return lines


def print_bus_permissions(conf: cfg.ConfigOpts) -> int:
    """Reads the config only: runs anywhere an agent's config is."""
    as_json = conf.command.json
    try:
        host, vhost = bus_permissions_request(conf)
    except ConfigError as e:
        return report_error(e, CONFIG_ERROR_EXIT, as_json, prefix="")
    permissions = bus_permissions(host, queue_naming(conf))
    if as_json:
        print_output(json.dumps(permissions.as_dict(), indent=2))
    else:
        print_output("\n".join(bus_permissions_lines(
            host, conf.command.user or host, vhost, permissions)))
    return 0


def main(argv=None) -> int:
    tolerate_closed_stdout()
    argv = sys.argv[1:] if argv is None else argv
    as_json = json_requested(argv)
    command = cfg.SubCommandOpt("command", handler=add_parsers, title="commands")
    try:
        conf = load_config(argv, [command], placement_required=True,
                           command_help=HELP)
        setup_logging(conf)
    except ConfigError as e:
        return exit_config_error(e, as_json)
    try:
        if conf.command.name == "audit":
            return audit(conf)
        if conf.command.name == "status":
            return status(conf)
        if conf.command.name == "rebuild-store":
            return rebuild_store(conf)
        if conf.command.name == "accept-store":
            return accept(conf)
        if conf.command.name == "rename-host":
            return rename(conf)
        if conf.command.name == "heal":
            return heal(conf)
        if conf.command.name == "device":
            return device(conf)
        if conf.command.name == "upgrade-check":
            return upgrade_check.run(conf)
        if conf.command.name == "bus-permissions":
            return print_bus_permissions(conf)
        return tree(conf)
    except (StateDirectoryInUse, StateDirectoryUnusable, StoreError) as e:
        return exit_store_error(e, as_json)
    except AgentError as e:
        return report_error(e, 1, as_json, prefix="")


if __name__ == "__main__":
    sys.exit(main())
