"""The quick-start demo: the agent's main job on an embedded default.

It builds the demo host (etc/demo/host.yaml) as a fake sysfs tree plus a
libvirt test-driver host, starts a real Placement on SQLite under .demo/,
runs one update_provider_tree cycle with the real console script, and
prints the provider tree as Placement then shows it. Placement's data and
port are kept under .demo/placement, so the config the demo leaves keeps
working once Placement is started again (the demo says how), and a second
run finds the providers the first made. Last, it writes a build for
compute-agent-ctl (.demo/instance-spec.json) that names the providers it
made: etc/compute-agent/instance-spec.example.json shows the format only.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import requests
import yaml

from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.store import node_identity
from compute_agent.testing.local_placement import LocalPlacement, free_port

TOP = Path(__file__).resolve().parents[1]
WORK = TOP / ".demo"
BIN = Path(sys.executable).parent
PLACEMENT_DIR = WORK / "placement"
# The port Placement listens on, kept with its database: the config the
# demo leaves names it.
PORT_FILE = PLACEMENT_DIR / "port"
INSTANCES = WORK / "instances"
HOST = "demo-host"
# The class the demo's [pci] device_spec gives the NIC's VFs.
VF_CLASS = "CUSTOM_PCI_8086_154C"
# The build the demo writes for compute-agent-ctl: a guest of this size
# with one VF.
EXAMPLE_GUEST = {"name": "web-1", "vcpus": 2, "memory_mb": 2048}
# Placement as the demo's noauth2 config asks it (in_tree: 1.14).
PLACEMENT_HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.14"}


def shown(path: Path) -> str:
    """A path as the operator types it, from the checkout's top."""
    return os.path.relpath(path, Path.cwd())


def placement_port() -> int:
    if not PORT_FILE.exists():
        PLACEMENT_DIR.mkdir(parents=True, exist_ok=True)
        PORT_FILE.write_text(f"{free_port()}\n")
    return int(PORT_FILE.read_text())


def answering(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def disk_of_host_file(size_gb: int) -> str:
    """The libvirt driver reports as DISK_GB the size of the file system
    [libvirt] instances_path is on (statvfs), as nova does. The demo host's
    disk is a file system of the host file's size there: a tmpfs, which
    takes no memory until written (the demo writes nothing). Returns what
    the demo did, in one line; needs root, as the demo's setup does."""
    INSTANCES.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(INSTANCES):
        stat = os.statvfs(INSTANCES)
        if stat.f_blocks * stat.f_frsize == size_gb << 30:
            return f"disk: {size_gb} GB, the tmpfs on {shown(INSTANCES)} (kept)"
        subprocess.run(["umount", str(INSTANCES)], check=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_gb}G",
                           "compute-agent-demo", str(INSTANCES)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return (f"disk: NOT the host file's {size_gb} GB but the file system under "
                f"{shown(INSTANCES)}, the real one: a tmpfs of that size could not be "
                f"mounted there ({done.stderr.strip() or done.returncode})")
    return f"disk: {size_gb} GB, a tmpfs mounted on {shown(INSTANCES)}"


def build_host(description: dict, root: Path) -> str:
    """Write the sysfs tree and the test-driver host, afresh from the
    description; returns the URI."""
    shutil.rmtree(root, ignore_errors=True)
    builder = SysfsBuilder(root / "sys")
    for cell in description["numa_cells"]:
        builder.add_numa_node(cell["id"], cell["cpus"], cell["memory_mb"])
    for dev in description.get("pci_devices", []):
        vfs = dev["vfs"]
        builder.add_pf(dev["address"], dev["vendor_id"], dev["product_id"],
                       vfs["product_id"], dev["numa_node"], vfs["count"], vfs["count"])
    for gpu in description.get("gpus", []):
        builder.add_mdev_parent(
            gpu["address"], gpu["numa_node"],
            {t: (v.get("name"), v["available_instances"])
             for t, v in gpu["mdev_types"].items()},
            gpu["vendor_id"], gpu["product_id"])
    for i, ns in enumerate(description.get("pmem_namespaces", [])):
        builder.add_pmem_namespace(i, 0, ns["size_bytes"], ns["numa_node"],
                                   alt_name=ns["name"])
    return builder.write_test_driver_host_xml(root / "host.xml")


def write_conf(work: Path, uri: str, placement_url: str) -> Path:
    """The agent's config for the demo host under ``work``."""
    conf = work / "compute-agent.conf"
    conf.write_text(f"""\
[DEFAULT]
host = {HOST}
state_path = {work / 'state'}
compute_driver = libvirt
sysfs_root = {work / 'host' / 'sys'}

[libvirt]
connection_uri = {uri}
instances_path = {work / 'instances'}

[pci]
# Only the NIC's VFs are assignable; nothing else on the host is. They
# count as nova's class for them, {VF_CLASS}, and the PF's
# provider carries the trait CUSTOM_PHYSNET_PHYSNET1.
device_spec = {{"vendor_id": "8086", "product_id": "154c", "physical_network": "physnet1"}}

[devices]
enabled_mdev_types = nvidia-222

[pmem]
namespaces = 64GB:ns0|ns1

[placement]
auth_type = placement_noauth2
endpoint = {placement_url}
""")
    return conf


def example_build(providers: list[dict], instance_uuid: str) -> dict:
    """A build for compute-agent-ctl on the demo's tree: EXAMPLE_GUEST with
    one VF, its VCPU and MEMORY_MB from the provider nearest the VF's that
    has both (its NUMA cell in the nested mode, the root in flat).
    ``providers``: Placement's, each with its ``inventories``."""
    by_uuid = {p["uuid"]: p for p in providers}
    nic = next(p for p in providers if VF_CLASS in p["inventories"])
    host = nic
    while not {"VCPU", "MEMORY_MB"} <= set(host["inventories"]):
        host = by_uuid[host["parent_provider_uuid"]]
    return {"instance_uuid": instance_uuid, "spec": EXAMPLE_GUEST,
            "allocations": {
                host["uuid"]: {"resources": {"VCPU": EXAMPLE_GUEST["vcpus"],
                                             "MEMORY_MB": EXAMPLE_GUEST["memory_mb"]}},
                nic["uuid"]: {"resources": {VF_CLASS: 1}}}}


def write_example_spec(work: Path, placement_url: str) -> Path:
    """``work``/instance-spec.json: example_build on the tree Placement
    holds for the demo host, for a new instance; its UUID alone in
    ``work``/instance-uuid."""
    root_uuid = node_identity.load(str(work / "state"))

    def get(path: str) -> dict:
        answer = requests.get(placement_url + path, headers=PLACEMENT_HEADERS, timeout=30)
        answer.raise_for_status()
        return answer.json()

    providers = [{**p, "inventories": get(f"/resource_providers/{p['uuid']}/inventories")
                  ["inventories"]}
                 for p in get(f"/resource_providers?in_tree={root_uuid}")["resource_providers"]]
    path = work / "instance-spec.json"
    build = example_build(providers, str(uuid.uuid4()))
    path.write_text(json.dumps(build, indent=4) + "\n")
    # For the commands that name the instance: "$(cat .demo/instance-uuid)".
    (work / "instance-uuid").write_text(build["instance_uuid"] + "\n")
    return path


def main() -> int:
    description = yaml.safe_load((TOP / "etc/demo/host.yaml").read_text())
    uri = build_host(description, WORK / "host")
    disk = disk_of_host_file(description["disk_gb"])
    port = placement_port()
    # A Placement already on the port is the one the demo told how to start.
    placement = (None if answering(port)
                 else LocalPlacement(PLACEMENT_DIR, port).start())
    url = f"http://127.0.0.1:{port}"
    try:
        conf = write_conf(WORK, uri, url)
        print(f"Placement: {url} (SQLite: {shown(PLACEMENT_DIR / 'placement.db')})")
        print(f"Config:    {shown(conf)}")
        print(f"Host:      {shown(WORK / 'host')} from etc/demo/host.yaml; {disk}\n")
        once = subprocess.run([str(BIN / "compute-agent"), "--config-file", str(conf),
                               "--once"], check=True, stdout=subprocess.PIPE, text=True)
        print(f"One update_provider_tree cycle: {once.stdout.strip()}\n")
        print("The provider tree as Placement shows it:\n")
        subprocess.run([str(BIN / "compute-agent-manage"), "--config-file", str(conf),
                        "tree"], check=True)
        spec = write_example_spec(WORK, url)
    finally:
        if placement is not None:
            placement.stop()
    print(closing_words(conf, port, placement is not None, spec))
    return 0


def closing_words(conf: Path, port: int, stopped: bool, spec: Path) -> str:
    """What the demo did, and what to try next, each command as it runs
    from the checkout's top, in this order."""
    venv = shown(BIN)
    config = f"--config-file {shown(conf)}"
    instance = f'"$(cat {shown(spec.parent / "instance-uuid")})"'
    placement = (
        f"Placement is stopped; its data stays in {shown(PLACEMENT_DIR)}. The commands\n"
        f"below need it: start it again first, on the same port and data, in\n"
        f"another terminal, and leave it running:\n"
        f"    {venv}/python -m compute_agent.testing.local_placement --dir "
        f"{shown(PLACEMENT_DIR)} --port {port}"
        if stopped else
        f"Placement was already running on port {port}; the demo left it so.")
    return f"""
The demo built a host with two NUMA cells, an SR-IOV NIC, a vGPU-capable GPU
and two persistent-memory namespaces (etc/demo/host.yaml), reported it to a
real Placement in one cycle of the agent, then showed the provider tree
Placement now holds beside the one the agent would report.

{placement}
The demo disk, if mounted, stays until: umount {shown(INSTANCES)}

Then try, in this order:
    {venv}/compute-agent-manage {config} tree --json
        the same, as JSON
    {venv}/compute-agent-manage {config} audit
        the agent's store, the guests and Placement compared: consistent
    {venv}/compute-agent {config} --once
        one more cycle: nothing left to write
    tools/services
        RabbitMQ (and libvirtd) started if not running: the agent's RPC
    {venv}/compute-agent {config}
        the agent itself, until Ctrl-C; then, in another terminal:
    {venv}/compute-agent-ctl {config} build {HOST} --spec {shown(spec)}
        a build as a conductor sends it: {EXAMPLE_GUEST['vcpus']} vCPUs, \
{EXAMPLE_GUEST['memory_mb']} MB and one VF,
        on the providers the demo made ({shown(spec)}, written now; no
        scheduler allocated them in Placement first)
    {venv}/compute-agent-ctl {config} show {HOST} {instance}
        the instance, running, and the devices it holds
    {venv}/compute-agent-ctl {config} delete {HOST} {instance}
        the guest gone, its devices given back; then Ctrl-C the agent.
        The libvirt test driver keeps a guest only in the process that
        defined it, the agent: until this delete, audit and status (other
        processes) find no guest for the instance and report
        assignment_without_guest (exit 1, "warnings")
    {venv}/compute-agent-ctl --help
        the operator's RPC client (over the broker of [DEFAULT] transport_url,
        RabbitMQ on this host by default)
    tools/demo
        again: the same providers, found where they are
"""


if __name__ == "__main__":
    sys.exit(main())
