"""Regressions of issue 12, through the real broker, a real `compute-agent`
daemon on the libvirt test driver, and the real Placement.

- A same-host resize left the running guest on its old devices, and after
  confirm the next build got them: two running guests on one VF. These
  tests read the running guest's *live* domain XML, through the agent's
  own connection (get_instance's ``live_definition``).
- Reconcile took "Placement's allocations unknown" (after SIGHUP, with
  Placement away) for "no allocations", and destroyed stopped guests.
- Move calls acted before they checked that the instance, the migration
  and this host agree.
"""
from __future__ import annotations

import signal
import socket
import threading
import uuid

import pytest
from lxml import etree

from compute_agent.exception import InvalidRequest
from compute_agent.placement.allocations import move_allocations
from tests.functional.helpers import failed_cycles, wait_for
from tests.functional.test_rpc import BIGGER, BROKER, SPEC, AgentDaemon, build, conductor, devices  # noqa: F401


def live_devices(view: dict) -> dict[str, list[str]]:
    """The VFs and mdevs in a running guest's live domain XML."""
    assert view["running"], view
    dom = etree.fromstring(view["live_definition"].encode())
    vfs = []
    for a in dom.iterfind("devices/interface[@type='hostdev']/source/address"):
        d, b, s, f = (int(a.get(k), 16) for k in ("domain", "bus", "slot", "function"))
        vfs.append(f"{d:04x}:{b:02x}:{s:02x}.{f:x}")
    mdevs = [a.get("uuid") for a in dom.iterfind("devices/hostdev[@type='mdev']/source/address")]
    return {"vf": sorted(vfs), "mdev": sorted(mdevs)}


def resize(c, agent: AgentDaemon, instance: str, spec: dict, vcpus: int) -> str:
    """A same-host resize up to finish, the way nova's conductor drives it."""
    migration = str(uuid.uuid4())
    wanted = agent.allocations(vcpus=vcpus, memory_mb=spec["memory_mb"])
    move_allocations(c.placement_client, instance, migration)
    c.schedule(instance, wanted)
    c.rpc.prep_resize(agent.name, migration, instance, spec, wanted)
    c.rpc.resize_instance(agent.name, migration, instance)
    c.rpc.finish_resize(agent.name, migration, instance)
    return migration


def test_same_host_resize_moves_the_running_guest_and_never_hands_its_devices_out(
        conductor):
    c, agent = conductor, conductor.agent()
    instance, built = build(c, agent)
    original = live_devices(c.rpc.get_instance(agent.name, instance))
    assert original == {k: devices(built)[k] for k in ("vf", "mdev")}

    first = resize(c, agent, instance, BIGGER, 4)
    finished = c.rpc.get_instance(agent.name, instance)
    new = {k: devices(finished)[k] for k in ("vf", "mdev")}
    assert new["vf"] != original["vf"] and new["mdev"] != original["mdev"]
    assert live_devices(finished) == new, "the running guest kept its old devices"

    c.rpc.confirm_resize(agent.name, first, instance)
    c.forget(first)
    assert live_devices(c.rpc.get_instance(agent.name, instance)) == new

    # The devices given back at confirm are free; the guest's are not. (The
    # test host has two VFs: the other guest gets the one given back.)
    other, _ = build(c, agent)
    theirs = live_devices(c.rpc.get_instance(agent.name, other))
    assert theirs["vf"] == original["vf"]
    assert not set(theirs["vf"]) & set(new["vf"])
    assert not set(theirs["mdev"]) & set(new["mdev"])
    c.rpc.delete_instance(agent.name, other)
    c.forget(other)

    # Another resize, reverted: the running guest is back on the devices it
    # had before it.
    second = resize(c, agent, instance, SPEC, 2)
    assert live_devices(c.rpc.get_instance(agent.name, instance))["vf"] == original["vf"]
    c.rpc.revert_resize(agent.name, second, instance)
    move_allocations(c.placement_client, second, instance, "INSTANCE")
    assert live_devices(c.rpc.get_instance(agent.name, instance)) == new


def test_confirm_of_one_instance_with_anothers_migration_changes_nothing(conductor):
    c, agent = conductor, conductor.agent()
    a, _ = build(c, agent)
    # The test host has two VFs, both a's during its resize: b has a vGPU.
    b = str(uuid.uuid4())
    wanted = {p: r for p, r in agent.allocations().items()
              if "SRIOV_NET_VF" not in r["resources"]}
    c.schedule(b, wanted)
    c.rpc.build_instance(agent.name, b, SPEC, wanted)
    migration = resize(c, agent, a, BIGGER, 4)
    before = agent.store_dump()
    b_live = live_devices(c.rpc.get_instance(agent.name, b))

    with pytest.raises(InvalidRequest, match="instance_uuid"):
        c.rpc.confirm_resize(agent.name, migration, b)
    with pytest.raises(InvalidRequest, match="instance_uuid"):
        c.rpc.revert_resize(agent.name, migration, str(uuid.uuid4()))

    assert agent.store_dump() == before
    assert live_devices(c.rpc.get_instance(agent.name, b)) == b_live
    assert c.rpc.get_instance(agent.name, a)["running"]


def test_steps_of_a_move_this_host_does_not_know_start_no_guest(conductor):
    c, agent = conductor, conductor.agent()
    build(c, agent)
    before = agent.store_dump()
    stranger = str(uuid.uuid4())
    for method in ("finish_resize", "post_live_migration_at_destination",
                   "confirm_resize", "revert_resize",
                   "rollback_live_migration_at_destination"):
        with pytest.raises(InvalidRequest, match="migration_uuid"):
            getattr(c.rpc, method)(agent.name, str(uuid.uuid4()), stranger)
    assert agent.store_dump() == before
    assert c.rpc.get_host_info(agent.name)["instances"] == 1


def test_evacuation_onto_the_host_the_instance_runs_on_is_refused(conductor):
    c, agent = conductor, conductor.agent()
    instance, built = build(c, agent)
    before = agent.store_dump()
    with pytest.raises(InvalidRequest, match="instance_uuid"):
        c.rpc.rebuild_instance(agent.name, str(uuid.uuid4()), instance, SPEC,
                               agent.allocations())
    assert agent.store_dump() == before
    view = c.rpc.get_instance(agent.name, instance)
    assert len(devices(view)["vf"]) == 1
    assert live_devices(view) == {k: devices(built)[k] for k in ("vf", "mdev")}


# --- reconcile on unknown allocations ------------------------------------------

class Gate:
    """A TCP forwarder to Placement that the test can shut, so the agent
    sees Placement go away without the shared Placement being stopped."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.open = True
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    def close(self) -> None:
        """Placement goes away: new connections are refused, and those the
        agent keeps open are cut."""
        self.open = False
        for s in self.sockets:
            _shut(s)

    def stop(self) -> None:
        self.close()
        self.server.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"


def define_stopped(host_xml, domain_xml: str) -> None:
    """Put a domain into a test-driver host file, shut off, as a guest
    defined on the hypervisor and not running."""
    node = etree.parse(str(host_xml)).getroot()
    dom = etree.fromstring(domain_xml.encode())
    runstate = etree.SubElement(dom, f"{{{TEST_NS}}}runstate", nsmap={"test": TEST_NS})
    runstate.text = "5"  # VIR_DOMAIN_SHUTOFF
    node.append(dom)
    host_xml.write_bytes(etree.tostring(node))


def test_a_stopped_guest_survives_sighup_while_placement_is_away(tmp_path, placement,
                                                                 conductor):
    """After SIGHUP the agent drops its view of Placement; with Placement
    away the next cycles cannot read it again, so its allocations are
    unknown, not empty: reconcile keeps the stopped guest and its devices."""
    gate = Gate(int(placement.url.rsplit(":", 1)[1].split("/")[0]))
    c = conductor
    agent = AgentDaemon(tmp_path / "gated", f"http://127.0.0.1:{gate.port}")
    agent.conf = agent.host.write_conf({"transport_url": BROKER, "update_interval": 1,
                                        "reconcile_interval": 1})
    try:
        agent.start(c.rpc)
        instance, built = build(c, agent)
        definition = c.rpc.get_instance(agent.name, instance)["definition"]
        agent.stop()
        define_stopped(agent.host.host_xml, definition)
        agent.start(c.rpc)
        view = c.rpc.get_instance(agent.name, instance)
        assert not view["running"] and devices(view) == devices(built)

        gate.close()
        mark = len(agent.log.read_text())
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: failed_cycles(agent.host.dir / "state") >= 3, timeout=60)
        view = c.rpc.get_instance(agent.name, instance)
        assert devices(view) == devices(built)
        assert view["definition"] is not None
        assert "Placement cache dropped" in agent.log.read_text()[mark:]
    finally:
        agent.stop()
        gate.stop()
