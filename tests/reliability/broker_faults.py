"""Broker faults against the real daemon (issue 16), shared by the short
tests (test_broker_faults.py) and the long case
(tools/reliability_cases/broker_faults.py).

A RabbitMQ node of the harness's own (PrivateRabbitMQ: never the machine's
broker) carries a conductor's calls to one compute-agent daemon on the
libvirt test driver and a real Placement. Callers build and delete in a
loop, each call retried with the same uuid until answered, as nova's
conductor would after a MessagingTimeout; meanwhile the broker is stopped
and started (stop_app/start_app) or every connection is cut
(close_all_connections). The ledger keeps what each acknowledged answer
said; ``violations()`` compares it with what the agent holds.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from compute_agent.cmd.common import load_config
from compute_agent.exception import NoSuchInstance
from compute_agent.messaging import messaging
from compute_agent.rpc.client import ComputeAgentAPI
from tests.functional.helpers import HEADERS, put_allocations, wait_for
from tests.functional.private_services import PrivateRabbitMQ
from tests.functional.test_rpc import SPEC, AgentDaemon

# Each call's timeout: an outage of a few seconds fails calls in flight.
CALL_TIMEOUT = 3.0
# A send is waited for to its end (compute_agent/rpc/sending.py): one caught
# connecting again to a stopping broker waits out kombu's 5 s connect
# timeout, and a second for the machine's load.
SEND_OVERRUN_BOUND = 6.0
# A call still unanswered after this many seconds of retries is a violation.
GIVE_UP_SECONDS = 90.0


def devices(answer: dict) -> list[tuple[str, str]]:
    """The devices an instance's answer holds, as (kind, device id)."""
    return sorted((a["kind"], a["device_id"]) for a in answer["assignments"]
                  if a["kind"] != "numa")


class BrokerAgent(AgentDaemon):
    """The daemon of tests/functional/test_rpc.py on a broker of the
    test's own, its update loop every second, run from this checkout."""

    def __init__(self, tmp_path: Path, placement_url: str, broker: PrivateRabbitMQ):
        super().__init__(tmp_path, placement_url)
        self.broker = broker
        self.conf = self.host.write_conf({"transport_url": broker.url,
                                          "update_interval": 1})

    def start(self, api: ComputeAgentAPI) -> BrokerAgent:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(self.conf)],
            stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(api), timeout=60)
        return self

    def mark(self) -> int:
        """Where the log ends now: the lines below start there."""
        return self.log.stat().st_size

    def log_lines(self, pattern: str, since: int = 0) -> list[str]:
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [line for line in text.splitlines() if re.search(pattern, line)]

    def down_lines(self, since: int = 0) -> list[str]:
        return self.log_lines(r"WARNING .*the message broker at \S+ did not answer", since)

    def back_lines(self, since: int = 0) -> list[str]:
        return self.log_lines(r"INFO .*the message broker at \S+ is back after", since)

    def driver_noise(self, since: int = 0) -> list[str]:
        """The rabbit driver's lines above DEBUG about its reconnections."""
        return self.log_lines(r"(ERROR|WARNING|INFO) oslo\.messaging\._drivers\.impl_rabbit",
                              since)

    def record(self) -> dict:
        """The update loop's record (compute_agent/daemon/cycle_record.py)."""
        return json.loads((Path(self.host.dir) / "state" / "last_cycle.json").read_text())

    def broker_in_record(self) -> dict:
        return next(d for d in self.record()["dependencies"]
                    if d["dependency"] == "the message broker")

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "compute_agent.cmd.manage", "--config-file",
                               str(self.conf), *args], capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)


def remove_allocations(url: str, consumer: str) -> None:
    resp = requests.delete(f"{url}/allocations/{consumer}", headers=HEADERS, timeout=10)
    assert resp.status_code in (204, 404), resp.text


def placement_retried(write: Callable[[], None], timeout: float = 10) -> None:
    """A conductor's write to Placement, retried for ``timeout`` seconds:
    the test Placement, on SQLite, answers 500 "database is locked" now and
    then under concurrent writers, for longer when the machine is loaded."""
    refused: list[AssertionError] = []

    def written() -> bool:
        try:
            write()
        except AssertionError as e:
            refused[:] = [e]
            return False
        return True
    wait_for(written, timeout, interval=0.2,
             message=lambda: f"Placement refused the write for {timeout} s: {refused[0]}")


def serves(api: ComputeAgentAPI, host: str) -> bool:
    try:
        api._call(host, "get_host_info", timeout=1)
        return True
    except messaging.MessagingTimeout:
        return False


def seconds_until_served(api: ComputeAgentAPI, host: str, limit: float = 60) -> float:
    """From now until the agent answers a call again."""
    started = time.monotonic()
    wait_for(lambda: serves(api, host), timeout=limit, interval=0.1)
    return time.monotonic() - started


@dataclass
class Ledger:
    """What the conductor was told, and what the faults did to its calls."""

    built: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    calls: int = 0  # answered
    timeouts: Counter = field(default_factory=Counter)  # by exception type
    slow_failures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Conductor:
    """Callers that build and delete on one agent, each call retried with
    the same uuid until answered; the Placement side as nova does it (the
    allocations written before the build, removed after the delete)."""

    def __init__(self, agent: BrokerAgent, placement_url: str, callers: int = 2):
        self.agent = agent
        self.placement_url = placement_url
        self.callers = callers
        self.api = ComputeAgentAPI(load_config(["--config-file", str(agent.conf)]),
                                   timeout=CALL_TIMEOUT)
        self.ledger = Ledger()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def close(self) -> None:
        self.stop()
        self.api.close()

    def call(self, method: str, *args):
        """``method`` until answered; a MessagingTimeout is retried, any
        other error is the test's failure. A timeout that took much longer
        than the call's timeout is a problem: the caller cannot retry."""
        def answered() -> tuple[object] | None:
            started = time.monotonic()
            try:
                answer = getattr(self.api, method)(self.agent.name, *args)
            except messaging.MessagingTimeout as e:
                took = time.monotonic() - started
                with self.ledger.lock:
                    self.ledger.timeouts[type(e).__name__] += 1
                    if took > CALL_TIMEOUT + SEND_OVERRUN_BOUND:
                        self.ledger.slow_failures.append(
                            f"{method} failed after {took:.1f} s: {e}")
                return None
            with self.ledger.lock:
                self.ledger.calls += 1
            return (answer,)
        # Asked again at once: each try waits out the call's timeout.
        (answer,) = wait_for(answered, GIVE_UP_SECONDS, interval=0,
                             message=f"{method} unanswered for {GIVE_UP_SECONDS} s")
        return answer

    def one_instance(self) -> None:
        """Build (retried), check, delete (retried), as nova would."""
        instance = str(uuid.uuid4())
        wanted = self.agent.allocations()
        placement_retried(lambda: put_allocations(self.placement_url, instance, wanted))
        built = self.call("build_instance", instance, SPEC, wanted)
        held = devices(built)
        with self.ledger.lock:
            self.ledger.built[instance] = held
        again = self.call("build_instance", instance, SPEC, wanted)
        if devices(again) != held:
            self._problem(f"build {instance} answered {devices(again)} after {held}")
        self.call("delete_instance", instance)
        with self.ledger.lock:
            self.ledger.deleted.add(instance)
        placement_retried(lambda: remove_allocations(self.placement_url, instance))

    def _problem(self, line: str) -> None:
        with self.ledger.lock:
            self.ledger.problems.append(line)

    def _caller(self) -> None:
        while not self._stop.is_set():
            try:
                self.one_instance()
            except Exception as e:
                self._problem(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
                return

    def start(self) -> Conductor:
        self._threads = [threading.Thread(target=self._caller, daemon=True,
                                          name=f"caller-{n}") for n in range(self.callers)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Let each caller finish the instance it is on."""
        self._stop.set()
        for thread in self._threads:
            thread.join(GIVE_UP_SECONDS * 3)
            if thread.is_alive():
                self._problem(f"{thread.name} did not finish")
        self._threads = []

    def violations(self) -> list[str]:
        """After stop(): every instance built was deleted, the agent holds
        none of them and no assignment (no claim doubled or left behind by
        a retried call), no answer changed on retry, every failed call
        failed within its timeout, the audit (store = guests = Placement)
        is consistent, the daemon is alive."""
        found = list(self.ledger.problems) + list(self.ledger.slow_failures)
        if self.agent.proc.poll() is not None:
            return found + [f"the daemon exited ({self.agent.proc.returncode})"]
        missing = set(self.ledger.built) - self.ledger.deleted
        if missing:
            found.append(f"{len(missing)} instances built and never deleted")
        for instance in self.ledger.deleted:
            try:
                self.call("get_instance", instance)
                found.append(f"instance {instance} deleted but still held")
            except NoSuchInstance:
                pass
        info = self.call("get_host_info")
        if info["assignments"] or info["instances"]:
            found.append(f"the agent holds {info['instances']} instances and "
                         f"{info['assignments']} assignments, none expected")
        audit = self.agent.manage("audit")
        if audit.returncode != 0:
            found.append(f"audit exit {audit.returncode}: {audit.stdout.strip()[:300]}")
        return found

    def figures(self) -> dict:
        return {"ops": self.ledger.calls, "instances": len(self.ledger.built),
                "timeouts": sum(self.ledger.timeouts.values()),
                "timeouts_by_type": dict(self.ledger.timeouts)}


def broker_outage(broker: PrivateRabbitMQ, seconds: float) -> None:
    """The broker's application stopped for ``seconds``, then started:
    its port closed, its connections cut, its transient queues gone."""
    broker.stop_app()
    try:
        time.sleep(seconds)  # the outage's length, the test's subject
    finally:
        broker.start_app()
