"""Services of a test's own, for tests that stop or restart one: a libvirtd
and a RabbitMQ node. The machine's shared libvirtd and RabbitMQ serve other
tests and other users, so no test stops, restarts or reconfigures them.
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import kombu
import libvirt

from compute_agent.testing.local_placement import free_port
from tests.tls import KeyPair
from tests.waiting import wait_for

LIBVIRTD = "/usr/sbin/libvirtd"
# libvirt's fixed directories as a privileged daemon, each replaced by a
# directory of the private daemon's own: its config (libvirtd.conf,
# qemu.conf, domain definitions), sockets and runtime state, state, the
# QEMU capabilities cache, and logs.
LIBVIRT_DIRS = {"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt",
                "cache": "/var/cache/libvirt", "log": "/var/log/libvirt"}
# What the machine's libvirtd learnt by probing QEMU (about 8 s). libvirt
# checks each entry against the QEMU binary and probes again when stale.
SHARED_CAPABILITIES_CACHE = Path("/var/cache/libvirt/qemu/capabilities")
LIBVIRTD_CONF = 'unix_sock_dir = "/run/libvirt"\nlisten_tls = 0\nlisten_tcp = 0\n'
# root, as the setup configures the machine's one (without it every call
# re-probes QEMU); QEMU's output to a file rather than through a virtlogd.
# No private /dev per QEMU (namespaces = []): a test's stand-in for a dax
# device is a file reached through a /dev path, which libvirt would
# otherwise look for in the guest's own /dev.
QEMU_CONF = 'user = "root"\ngroup = "root"\nstdio_handler = "file"\nnamespaces = []\n'
# Two daemons a live migration runs between, each with ports of its own
# for the incoming QEMU to listen on, clear of the machine's libvirtd
# (libvirt's default range, 49152-49215). Pairs run at once (one per
# pytest-xdist worker, or in another checkout's run) each take a slot of
# their own: slot n's daemons listen in the two ranges of
# MIGRATION_PORTS_PER_DAEMON ports from MIGRATION_PORT_BASE + 2n of them.
MIGRATION_PORT_BASE = 49216
MIGRATION_PORTS_PER_DAEMON = 16
MIGRATION_SLOTS = 16
# Who holds a slot: an flock on its file, so a slot frees itself when its
# holder exits, however it exits.
MIGRATION_SLOT_LOCKS = Path("/run/lock")
# Run by sh in the new mount namespace: $1 is the private root.
_IN_NAMESPACE = "set -e; root=$1; shift\n" + "".join(
    f'mkdir -p {target}; mount --bind "$root/{name}" {target}\n'
    for name, target in LIBVIRT_DIRS.items()
) + 'exec "$@"\n'


class PrivateLibvirtd:
    """A privileged libvirtd with QEMU/KVM, as the machine's one, but in a
    mount namespace of its own where libvirt's fixed directories are bind
    mounts of directories under ``root``. It shares nothing with the
    machine's libvirtd: not a socket, a pid file, a domain, a log or a
    config file. Connect with ``uri``; ``stop()`` and ``start()`` restart
    only this daemon.

    As a live migration's source or destination it takes a ``host_uuid``:
    libvirt refuses to migrate between daemons of one host UUID, which
    without it is the machine's DMI product UUID, the same for every
    daemon of a host (this VM has none, so libvirt draws a new one at
    each start: a host that changes identity on restart). And
    ``migration_ports``: the range its incoming QEMU listens in."""

    def __init__(self, root: Path, host_uuid: str | None = None,
                 migration_ports: tuple[int, int] | None = None):
        self.root = root
        self.proc: subprocess.Popen | None = None
        for name in LIBVIRT_DIRS:
            (root / name).mkdir(parents=True, exist_ok=True)
        libvirtd_conf, qemu_conf = LIBVIRTD_CONF, QEMU_CONF
        if host_uuid is not None:
            libvirtd_conf += f'host_uuid = "{host_uuid}"\n'
        if migration_ports is not None:
            qemu_conf += (f"migration_port_min = {migration_ports[0]}\n"
                          f"migration_port_max = {migration_ports[1]}\n")
        (root / "etc" / "libvirtd.conf").write_text(libvirtd_conf)
        (root / "etc" / "qemu.conf").write_text(qemu_conf)
        if SHARED_CAPABILITIES_CACHE.is_dir():
            shutil.copytree(SHARED_CAPABILITIES_CACHE, root / "cache" / "qemu" / "capabilities",
                            dirs_exist_ok=True)

    @property
    def socket(self) -> Path:
        return self.root / "run" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket}"

    def start(self, timeout: float = 60) -> PrivateLibvirtd:
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--",
             "sh", "-c", _IN_NAMESPACE, "sh", str(self.root),
             LIBVIRTD, "--pid-file", str(self.root / "libvirtd.pid")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "libvirtd.stderr", "a"))
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the private libvirtd exited ({self.proc.returncode}): "
                                   f"{(self.root / 'libvirtd.stderr').read_text()[-2000:]}")
            return self._answers()
        wait_for(answers, timeout=timeout, interval=0.05)
        return self

    def qemu_pid(self, domain_name: str) -> int:
        """The pid of the QEMU this daemon runs the domain in."""
        return int((self.root / "run" / "qemu" / f"{domain_name}.pid").read_text())

    def domain(self, instance_uuid: str) -> libvirt.virDomain | None:
        """The instance's domain on this daemon; None when it has none."""
        conn = libvirt.open(self.uri)
        try:
            return conn.lookupByUUIDString(instance_uuid)
        except libvirt.libvirtError as exc:
            assert exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN
            return None
        finally:
            conn.close()

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return False
        try:
            conn.getLibVersion()
            return True
        finally:
            conn.close()

    def stop(self) -> None:
        """SIGTERM, as an init system stops it; its guests keep running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None

    def close(self) -> None:
        """Destroy the guests it runs (a QEMU outlives its libvirtd), then
        stop it."""
        if self.proc is not None and self.proc.poll() is None:
            conn = libvirt.open(self.uri)
            try:
                for domain in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                    domain.destroy()
            finally:
                conn.close()
        self.stop()


def migration_ports(slot: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The migration port ranges, first and last port, of slot's two
    daemons."""
    first = MIGRATION_PORT_BASE + 2 * slot * MIGRATION_PORTS_PER_DAEMON
    return tuple((start, start + MIGRATION_PORTS_PER_DAEMON - 1)
                 for start in (first, first + MIGRATION_PORTS_PER_DAEMON))


@contextmanager
def migration_port_slot() -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """Holds the first free slot of migration ports until the block ends,
    and yields its two daemons' ranges."""
    for slot in range(MIGRATION_SLOTS):
        with open(MIGRATION_SLOT_LOCKS / f"compute-agent-test-migration-{slot}.lock",
                  "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield migration_ports(slot)
            return
    raise RuntimeError(f"all {MIGRATION_SLOTS} slots of migration ports are taken "
                       f"(locks in {MIGRATION_SLOT_LOCKS})")


def private_libvirtd_pair(root: Path, ports: tuple[tuple[int, int], tuple[int, int]]
                          ) -> tuple[PrivateLibvirtd, PrivateLibvirtd]:
    """Two private libvirtds, as two hosts a guest can live-migrate
    between, each listening for incoming guests in its range of ``ports``;
    not started."""
    return tuple(PrivateLibvirtd(root / name, host_uuid=str(uuid.uuid4()),
                                 migration_ports=daemon_ports)
                 for name, daemon_ports in zip("ab", ports))


@contextmanager
def running_libvirtd_pair(root: Path) -> Iterator[tuple[PrivateLibvirtd, PrivateLibvirtd]]:
    """Two private libvirtds started on a slot of migration ports of their
    own, and closed (their guests destroyed) after."""
    with migration_port_slot() as ports:
        pair = private_libvirtd_pair(root, ports)
        try:
            for daemon in pair:
                daemon.start()
            yield pair
        finally:
            for daemon in pair:
                daemon.close()


@dataclass(frozen=True)
class BrokerTls:
    """A private node's TLS listener: the certificate and key it presents,
    the CA file it trusts clients' certificates by, and whether it asks a
    client for one (and refuses a client without)."""

    server: KeyPair
    authority: Path
    client_certificates: bool = False

    def config(self, port: int, directory: Path) -> str:
        """rabbitmq.conf's lines for a listener on ``port`` of the loopback,
        with the files in ``directory``."""
        lines = [f"listeners.ssl.default = 127.0.0.1:{port}",
                 f"ssl_options.cacertfile = {directory / 'ca.pem'}",
                 f"ssl_options.certfile = {directory / 'server.pem'}",
                 f"ssl_options.keyfile = {directory / 'server.key'}"]
        if self.client_certificates:
            lines += ["ssl_options.verify = verify_peer",
                      "ssl_options.fail_if_no_peer_cert = true"]
        return "\n".join(lines) + "\n"

    def copy_to(self, directory: Path) -> list[Path]:
        """The files, copied where the node's ``rabbitmq`` user reads them:
        a test's own directories are root's alone."""
        directory.mkdir()
        copies = []
        for source, name in ((self.authority, "ca.pem"), (self.server.certificate, "server.pem"),
                             (self.server.key, "server.key")):
            copies.append(directory / name)
            shutil.copyfile(source, copies[-1])
        return [directory, *copies]


class PrivateRabbitMQ:
    """A RabbitMQ node of its own on free ports, with its own node name,
    config file, database, logs and pid file, in a directory of its own
    that the ``rabbitmq`` user (which ``rabbitmq-server`` switches to)
    owns. ``url`` is its transport URL; ``stop_app()`` and ``start_app()``
    take its broker away and back. With ``tls``, it also listens for TLS
    on ``tls_port`` (``tls_url``)."""

    def __init__(self, tls: BrokerTls | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="rabbitmq-test-"))
        self.node = f"test-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.url = f"rabbit://guest:guest@127.0.0.1:{self.port}/"
        self.pid_file = self.root / "rabbitmq.pid"
        config = self.root / "rabbitmq.conf"
        config_text = (f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
                       "loopback_users.guest = true\n")
        owned = [self.root, config, self.root / "mnesia", self.root / "log"]
        self.tls_port: int | None = None
        if tls is not None:
            self.tls_port = free_port()
            config_text += tls.config(self.tls_port, self.root / "tls")
            owned += tls.copy_to(self.root / "tls")
        config.write_text(config_text)
        for name in ("mnesia", "log"):
            (self.root / name).mkdir()
        rabbitmq = pwd.getpwnam("rabbitmq")
        for path in owned:
            os.chown(path, rabbitmq.pw_uid, rabbitmq.pw_gid)
        self.env = {**os.environ,
                    "RABBITMQ_CONFIG_FILE": str(config),
                    "RABBITMQ_NODENAME": self.node,
                    "RABBITMQ_NODE_PORT": str(self.port),
                    "RABBITMQ_DIST_PORT": str(free_port()),
                    "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(self.root / "log"),
                    "RABBITMQ_PID_FILE": str(self.pid_file)}

    def tls_url(self, host: str = "localhost") -> str:
        """The transport URL of the TLS listener, reached as ``host``: the
        name a client checks the node's certificate against."""
        if self.tls_port is None:
            raise ValueError("this node has no TLS listener")
        return f"rabbit://guest:guest@{host}:{self.tls_port}/"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", "-n", self.node, *args], check=True,
                       timeout=120, stdout=subprocess.DEVNULL)

    def start(self) -> PrivateRabbitMQ:
        # As the rabbitmq-server wrapper starts it (su to the rabbitmq user),
        # but with the descriptors the hard limit allows: su's PAM session
        # sets the soft limit to 1,024, which RabbitMQ turns into 832
        # sockets, and a fleet of 300 agents (4 connections each) was
        # refused past that.
        subprocess.run(["su", "rabbitmq", "-s", "/bin/sh", "-c",
                        "cd /var/lib/rabbitmq && ulimit -n \"$(ulimit -Hn)\" && "
                        "exec /usr/lib/rabbitmq/bin/rabbitmq-server -detached"],
                       env=self.env, check=True, timeout=60)
        # Waits for the pid file, then for the node's applications.
        self._ctl("wait", "--timeout", "90", str(self.pid_file))
        return self

    def stop_app(self) -> None:
        self._ctl("stop_app")

    def start_app(self) -> None:
        self._ctl("start_app")

    def close_all_connections(self) -> None:
        """Cut every client's connection; the broker stays up."""
        self._ctl("close_all_connections", "cut by a test")

    def queue_types(self) -> dict[str, str]:
        """Each queue's type (classic, quorum, stream), by its name."""
        listed = subprocess.run(["rabbitmqctl", "-q", "-n", self.node, "list_queues", "name",
                                 "type", "--formatter", "json"], check=True, timeout=120,
                                capture_output=True, text=True).stdout
        return {q["name"]: q["type"] for q in json.loads(listed)}

    def delete_queue(self, queue: str) -> None:
        self._ctl("delete_queue", queue)

    def amqp(self) -> kombu.Connection:
        """A connection of the test's own to this node, as guest: for what
        rabbitmqctl does not do (delete an exchange, remove a binding)."""
        return kombu.Connection(hostname="127.0.0.1", port=self.port, userid="guest",
                                password="guest")

    def add_user(self, user: str, password: str, vhost: str = "/") -> str:
        """A user with no permission yet on ``vhost``; its transport URL."""
        self._ctl("add_user", user, password)
        return f"rabbit://{user}:{password}@127.0.0.1:{self.port}/{vhost.lstrip('/')}"

    def set_permissions(self, user: str, configure: str, write: str, read: str,
                        vhost: str = "/") -> None:
        """``user``'s permissions on ``vhost``: regular expressions on the
        names of queues and exchanges."""
        self._ctl("set_permissions", "-p", vhost, user, configure, write, read)

    def set_topic_permissions(self, user: str, exchange: str, write: str, read: str,
                              vhost: str = "/") -> None:
        """``user``'s topic permissions on ``exchange``: regular expressions
        on routing keys."""
        self._ctl("set_topic_permissions", "-p", vhost, user, exchange, write, read)

    def close(self) -> None:
        """Stop the node (waiting until its process is gone), then remove
        its directory."""
        if self.pid_file.exists():
            self._ctl("stop", str(self.pid_file))
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def paused(node: PrivateRabbitMQ) -> Iterator[None]:
    """The node's process stopped (SIGSTOP): its socket still takes
    connections, in the kernel, and nothing answers on them."""
    pid = int(node.pid_file.read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# What the nodes of a cluster add to a private node's config: a partition
# heals by itself, the side with fewer clients restarting. A node paused
# past net_ticktime and resumed healed within 2 s so; with pause_minority
# it stayed cut off from the other two (3 minutes, until stopped), and
# with RabbitMQ's default, ignore, a partition waits for a restart by hand.
CLUSTER_CONF = "cluster_partition_handling = autoheal\n"
# docs/operations.md's recommended [oslo_messaging_rabbit] for agents on a
# cluster (kombu_failover_strategy = shuffle is the agent's default), as
# the cluster tests and tools/fleet --broker-nodes 3 configure them. The
# heartbeat threshold is what bounds the time an agent whose node hangs
# stays on it: 3 to 4 times as long (tests/cluster).
CLUSTER_HEARTBEAT_TIMEOUT_THRESHOLD = 15
CLUSTER_RABBIT_OPTIONS = {
    "rabbit_quorum_queue": "true", "rabbit_transient_quorum_queue": "true",
    "rabbit_stream_fanout": "true", "rabbit_qos_prefetch_count": "10",
    "use_queue_manager": "true",
    "heartbeat_timeout_threshold": str(CLUSTER_HEARTBEAT_TIMEOUT_THRESHOLD)}
# Each consumer of the default virtual host: the node its channel is on, and
# its queue's name.
CONSUMER_NODES = ("[{node(proplists:get_value(channel_pid, C)), "
                  "element(4, proplists:get_value(queue_name, C))} "
                  "|| C <- rabbit_amqqueue:consumers_all(<<\"/\">>)].")


class PrivateRabbitCluster:
    """Three private RabbitMQ nodes (PrivateRabbitMQ, each with its own
    ports, directories and enabled-plugins file) joined in one cluster:
    ``url`` names all three, as an operator's transport_url does. Started
    as root, the nodes share the rabbitmq user's Erlang cookie.
    ``stop(i)`` and ``start(i)`` take node i away whole (its Erlang VM
    stopped) and bring it back, where it rejoins the cluster."""

    SIZE = 3

    def __init__(self, net_ticktime: int | None = None) -> None:
        """``net_ticktime``: Erlang's, the seconds after which nodes take a
        node that does not answer for down (60 by default), 1 to 1.25
        times it: a node paused longer is a partition."""
        self.nodes = [PrivateRabbitMQ() for _ in range(self.SIZE)]
        rabbitmq = pwd.getpwnam("rabbitmq")
        for node in self.nodes:
            plugins = node.root / "enabled_plugins"
            plugins.write_text("[].\n")
            os.chown(plugins, rabbitmq.pw_uid, rabbitmq.pw_gid)
            node.env["RABBITMQ_ENABLED_PLUGINS_FILE"] = str(plugins)
            if net_ticktime is not None:
                node.env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = (
                    f"-kernel net_ticktime {net_ticktime}")
            with open(node.root / "rabbitmq.conf", "a") as config:
                config.write(CLUSTER_CONF)
        self.url = self.url_of(range(self.SIZE))

    def url_of(self, indexes: Iterable[int]) -> str:
        """The transport URL that names nodes ``indexes``."""
        return "rabbit://" + ",".join(f"guest:guest@127.0.0.1:{self.nodes[i].port}"
                                      for i in indexes) + "/"

    def start_all(self) -> PrivateRabbitCluster:
        """Each node started (together: a first start can take a minute on
        a loaded machine), then the second and third joined to the first."""
        with ThreadPoolExecutor(self.SIZE) as starting:
            list(starting.map(PrivateRabbitMQ.start, self.nodes))
        first = self.nodes[0].node
        for node in self.nodes[1:]:
            node.stop_app()
            # It says on stderr, as errors, what it did not find of the
            # node it joins while it joins: captured.
            subprocess.run(["rabbitmqctl", "-q", "-n", node.node, "join_cluster", first],
                           check=True, capture_output=True, timeout=120)
            node.start_app()
        return self

    def stop(self, index: int) -> None:
        """Node ``index`` stopped whole, its data kept (waits until its
        process is gone)."""
        node = self.nodes[index]
        node._ctl("stop", str(node.pid_file))
        # Else the start's wait would read the stopped process's pid.
        node.pid_file.unlink(missing_ok=True)

    def start(self, index: int) -> None:
        """Node ``index`` started again: it rejoins the cluster."""
        self.nodes[index].start()

    def _ask(self, index: int, *args: str, tool: str = "rabbitmqctl") -> list | dict | None:
        """What node ``index`` answers to ``args`` (JSON), None when it does
        not answer."""
        done = subprocess.run([tool, "-q", "-n", self.nodes[index].node, *args,
                               "--formatter", "json"], capture_output=True, text=True,
                              timeout=120)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def _ask_any(self, *args: str) -> list | dict:
        """What the first node that answers says to ``args``."""
        for index in range(self.SIZE):
            answer = self._ask(index, *args)
            if answer is not None:
                return answer
        raise RuntimeError(f"no node of the cluster answers {' '.join(args)}")

    def running(self) -> list[int]:
        """The nodes the cluster counts as running; none when a node finds
        itself cut off from another (a partition)."""
        status = self._ask_any("cluster_status")
        if status["partitions"]:
            return []
        return sorted(self.index_of(name) for name in status["running_nodes"])

    def index_of(self, node_name: str) -> int:
        return next(i for i, node in enumerate(self.nodes) if node.node == node_name)

    def queues(self) -> dict[str, dict]:
        """Every queue, by name: its type, leader and members (node names)."""
        return {q["name"]: q for q in self._ask_any("list_queues", "name", "type", "leader",
                                                    "members", "consumers")}

    def leader(self, queue: str) -> int:
        """The node that leads quorum queue ``queue``."""
        return self.index_of(self.queues()[queue]["leader"])

    def consumer_nodes(self, queue: str) -> list[int]:
        """The nodes ``queue``'s consumers are connected to. The command line
        shows a process by a number it gives each node, different at each
        call, so the node asks Erlang itself."""
        for node in self.nodes:
            done = subprocess.run(["rabbitmqctl", "-q", "-n", node.node, "eval",
                                   CONSUMER_NODES], capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                return sorted({self.index_of(name) for name, of in re.findall(
                    r"\{'([^']+)',\s*<<\"([^\"]*)\">>\}", done.stdout) if of == queue})
        raise RuntimeError("no node of the cluster lists its consumers")

    def move_leader(self, queue: str, away_from: int) -> None:
        """Quorum queue ``queue`` led by another node than ``away_from``: that
        node's member removed (a new leader is elected) and added back."""
        node = self.nodes[away_from].node
        for change in ("delete_member", "add_member"):
            subprocess.run(["rabbitmq-queues", "-q", "-n", self.nodes[(away_from + 1)
                                                                      % self.SIZE].node,
                            change, queue, node], check=True, timeout=120,
                           stdout=subprocess.DEVNULL)

    def delete_queue(self, queue: str) -> None:
        self._ask_any("delete_queue", queue)

    def unbind(self, queue: str, exchange: str) -> None:
        """``queue``'s binding to ``exchange`` (by its own name) removed,
        through the first node that runs: nothing routes to it any more,
        and its consumers are told nothing."""
        with self.nodes[self.running()[0]].amqp() as connection:
            connection.channel().queue_unbind(queue, exchange=exchange, routing_key=queue)

    def log(self, index: int) -> str:
        """Node ``index``'s log."""
        node = self.nodes[index]
        return (node.root / "log" / f"{node.node}.log").read_text()

    def close(self) -> None:
        """Every node stopped, its directory removed."""
        with ThreadPoolExecutor(self.SIZE) as closing:
            list(closing.map(PrivateRabbitMQ.close, self.nodes))
