"""Every option the agent reads, grouped, with ``list_opts()`` for
oslo-config-generator. Options that only a later stage validates (JSON device
specs, CPU sets) are still declared here, so the sample config is complete."""
from __future__ import annotations

import socket

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg, iniparser
from oslo_log import log as logging
from oslo_log import versionutils

from compute_agent import messaging

PLACEMENT_GROUP = "placement"


def placement_group() -> cfg.OptGroup:
    """A new one for each config: oslo.config copies a registered group
    shallowly, so one group object would share its options (the auth
    plugin's, registered once its auth_type is read) among configs."""
    return cfg.OptGroup(
        PLACEMENT_GROUP,
        title="Placement",
        help="How to reach Placement: keystoneauth1's session, auth and adapter "
        "options. With Keystone, use auth_type = password and give the agent's "
        "service user, which needs the 'service' role for reshaping. For a "
        "Placement that runs with auth_strategy = noauth2 (development, demos), "
        "use auth_type = placement_noauth2 and endpoint = <Placement's URL>.",
    )


# Placement keeps inventory amounts in a signed 32-bit column.
PLACEMENT_MAX_INT = 2**31 - 1
# Beyond any sane overcommit; Placement itself stops only at a float's limit.
MAX_ALLOCATION_RATIO = 10000.0


def _nova(name: str, group: str = "DEFAULT") -> cfg.DeprecatedOpt:
    """nova's name for the same setting, so a nova.conf's values carry over
    when a nova-compute host is adopted."""
    return cfg.DeprecatedOpt(name, group=group)


default_opts = [
    cfg.StrOpt(
        "host",
        default=socket.gethostname(),
        sample_default="<hostname>",
        help="Name of this compute host. It names the root resource provider "
        "and prefixes every child provider's name.",
    ),
    cfg.StrOpt(
        "state_path",
        default="/var/lib/compute-agent",
        help="Directory for the agent's durable state. The node UUID is kept "
        "in 'compute_id' here, the same file nova-compute uses, so pointing "
        "this at a nova host's state path adopts its providers in place.",
    ),
    cfg.IntOpt(
        "update_interval",
        default=60,
        min=1,
        max=86400,
        help="Seconds between two runs of update_provider_tree.",
    ),
    cfg.IntOpt(
        "update_jitter",
        default=5,
        min=0,
        max=3600,
        help="Up to this many seconds, chosen at random, are added to each "
        "interval, and waited before the first cycle after a start, so that "
        "a fleet of hosts (restarted at once, say) does not call Placement "
        "in step.",
    ),
    cfg.IntOpt(
        "reconcile_interval",
        default=10,
        min=1,
        max=10000,
        help="Reconcile the store with the hypervisor and Placement every "
        "this many update cycles (and always at start-up).",
    ),
    cfg.IntOpt(
        "allocation_refresh_interval",
        default=300,
        min=0,
        max=86400,
        help="Reconciliation reads a provider's allocations from Placement "
        "only when they may have changed: its generation moved (allocations "
        "written on it), a claim or release here touched it, or its last "
        "read found allocations and is older than this many seconds. "
        "Placement does not move a provider's generation when allocations "
        "are deleted from it or moved off it, so such a change is seen "
        "within this bound; a provider read without allocations has none "
        "to lose, and is not read again by age. 0 reads every "
        "provider at every reconciliation.",
    ),
    cfg.IntOpt(
        "orphan_grace_period",
        default=300,
        min=0,
        max=30 * 86400,
        help="Seconds for which the devices of an instance whose guest has "
        "gone from this host stay held (and reported) before reconciliation "
        "gives them back, counted from the last change to its assignments. "
        "A guest briefly absent, being redefined by hand for instance, "
        "keeps its devices.",
    ),
    cfg.IntOpt(
        "live_migration_announced_timeout",
        default=600,
        min=60,
        max=86400,
        help="Seconds for which a live migration this host was told of as "
        "its source (check_can_live_migrate_source), but which never "
        "started here, keeps the instance for the move. Past it, "
        "reconciliation takes the conductor for gone: the migration's "
        "allocations on this host's providers return to the instance and "
        "the move is ended; the guest runs on untouched. Until then a "
        "restart leaves the move open for the conductor to go on or roll "
        "back. Keep it well above the conductor's RPC timeout.",
    ),
    cfg.IntOpt(
        "service_down_time",
        default=20,
        min=1,
        max=3600,
        help="A host is down when its agent has not answered a heartbeat "
        "request within this many seconds (compute_agent/rpc/heartbeat.py). The agent "
        "answers heartbeats on a topic and threads of their own, never "
        "behind claims or Placement, so a busy host still answers in "
        "milliseconds; an evacuation's destination refuses to rebuild the "
        "instances of a source that answers.",
    ),
    cfg.IntOpt(
        "graceful_shutdown_timeout",
        default=60,
        min=1,
        max=3600,
        help="Seconds a stop (SIGTERM) waits for the RPC calls in flight to "
        "finish and be answered, after it stops taking new ones, before the "
        "agent exits all the same (oslo.service's option of that name, "
        "without its 0 for an endless wait). A call cut by it is resumed or "
        "rolled back by the next start, as after a kill. Keep it below the "
        "systemd unit's TimeoutStopSec (90 in "
        "etc/systemd/compute-agent.service), which kills the agent past it: "
        "the agent cannot read the unit's value.",
    ),
    cfg.StrOpt(
        "owner_trait",
        default="OWNER_NOVA",
        help="Trait set on the root provider to say who manages this host: "
        "an OWNER_* trait of os-traits or a CUSTOM_* name. nova's scheduler "
        "asks for OWNER_NOVA (root_required), so the default keeps it "
        "placing instances here.",
    ),
    cfg.StrOpt(
        "compute_driver",
        default="libvirt",
        choices=[
            ("libvirt", "The production driver."),
            ("fake", "An in-memory host described by [fake] host_file."),
        ],
        help="Hypervisor driver.",
    ),
    cfg.StrOpt(
        "sysfs_root",
        default="/sys",
        help="Where sysfs is mounted. Tests and demos point this at a tree of "
        "files.",
    ),
    cfg.StrOpt(
        "boot_id_file",
        default="/proc/sys/kernel/random/boot_id",
        help="The kernel's boot ID, new at every boot: devices claimed in an "
        "earlier boot are recreated (mdevs, VF counts). Tests and demos point "
        "this at a file of their own to simulate a reboot.",
    ),
]

compute_opts = [
    cfg.StrOpt(
        "provider_tree_mode",
        default="nested",
        choices=[
            ("nested", "NUMA cells are child providers that carry VCPU, PCPU "
             "and MEMORY_MB; devices sit under their cell. An instance's CPUs "
             "and memory come from one cell, so no flavor larger than a cell "
             "fits."),
            ("flat", "nova-compatible: VCPU, PCPU and MEMORY_MB stay on the "
             "root, and devices sit directly under it."),
            ("numa_devices", "VCPU, PCPU and MEMORY_MB stay on the root, so "
             "a flavor larger than one cell fits; the NUMA cells stay as "
             "providers (HW_NUMA_ROOT) that hold the devices, so a request "
             "can still keep its devices on one cell with same_subtree."),
        ],
        help="Shape of the provider tree. Changing it on a host with "
        "running guests leaves the new providers of a moving class fully "
        "reserved until 'compute-agent-manage heal' moves the guests' "
        "allocations.",
    ),
    cfg.StrOpt(
        "cpu_dedicated_set",
        help="Host CPUs reported as PCPU, for pinned guests, as a CPU list "
        "such as '4-15,^8'.",
    ),
    cfg.StrOpt(
        "cpu_shared_set",
        help="Host CPUs reported as VCPU. When neither set is given, every "
        "host CPU is a VCPU.",
    ),
    cfg.IntOpt(
        "reserved_host_memory_mb",
        default=512,
        min=0,
        max=PLACEMENT_MAX_INT,
        deprecated_opts=[_nova("reserved_host_memory_mb")],
        help="Memory kept for the host, reserved on the first NUMA cell (or "
        "on the root in flat mode).",
    ),
    cfg.IntOpt(
        "reserved_host_disk_mb",
        default=0,
        min=0,
        max=PLACEMENT_MAX_INT,
        deprecated_opts=[_nova("reserved_host_disk_mb")],
        help="Disk kept for the host.",
    ),
    cfg.FloatOpt("cpu_allocation_ratio", default=4.0, min=0.0, max=MAX_ALLOCATION_RATIO,
                 deprecated_opts=[_nova("cpu_allocation_ratio")],
                 help="Allocation ratio of VCPU."),
    cfg.FloatOpt("ram_allocation_ratio", default=1.0, min=0.0, max=MAX_ALLOCATION_RATIO,
                 deprecated_opts=[_nova("ram_allocation_ratio")],
                 help="Allocation ratio of MEMORY_MB."),
    cfg.FloatOpt("disk_allocation_ratio", default=1.0, min=0.0, max=MAX_ALLOCATION_RATIO,
                 deprecated_opts=[_nova("disk_allocation_ratio")],
                 help="Allocation ratio of DISK_GB."),
]

libvirt_opts = [
    cfg.StrOpt(
        "connection_uri",
        default="qemu:///system",
        help="libvirt URI. 'test:///<path to host XML>' runs the libvirt test "
        "driver on a host of your own description.",
    ),
    cfg.StrOpt(
        "virt_type",
        default="kvm",
        choices=[("kvm", "Hardware virtualization."),
                 ("qemu", "Emulation, where /dev/kvm is missing.")],
        help="Domain type of the guests the agent defines.",
    ),
    cfg.StrOpt(
        "instances_path",
        default="$state_path/instances",
        help="Directory whose file system's size is reported as DISK_GB.",
    ),
    cfg.StrOpt(
        "live_migration_uri",
        help="The URI of this host's libvirtd as another host's libvirtd "
        "reaches it, to live-migrate a guest here (peer to peer). By default "
        "connection_uri's driver over TCP at this host's name, as nova does: "
        "'qemu:///system' on host 'compute-2' gives "
        "'qemu+tcp://compute-2/system'; a connection_uri that names a host "
        "is used as it is.",
    ),
]

pci_opts = [
    cfg.MultiStrOpt(
        "device_spec",
        default=[],
        deprecated_opts=[_nova("passthrough_whitelist", "pci")],
        help="The PCI allowlist: one JSON object per entry. Keys: vendor_id, "
        "product_id, address (a string with '*' wildcards, or an object of "
        "domain/bus/slot/function where each part may be a range 'a-b'), "
        "resource_class and traits. A spec that matches a PF's VFs reports "
        "them on the PF's provider. Nothing is assignable without a match. "
        "one_time_use (yes/no, nova's): a device used once is out of "
        "scheduling until cleaned; clean_command (a list of arguments or a "
        "string, run with the device's PCI address appended) and "
        "clean_timeout (seconds, default 600) say how the agent cleans it.",
    ),
    cfg.ListOpt(
        "vf_counts",
        default=[],
        help="The VF count (sriov_numvfs) of SR-IOV PFs, as ADDRESS=COUNT "
        "items: '0000:81:00.0=8,0000:82:00.0=0'. After a host reboot, which "
        "leaves every PF without VFs, the agent sets these counts before it "
        "reports inventory or serves claims; a PF not listed whose VFs it "
        "reports gets back the count it had when last seen with all its VFs. "
        "A PF whose VFs exist already with another count is changed only "
        "when it is listed here and none of its VFs is in use; 0 leaves a PF "
        "without VFs.",
    ),
]

devices_opts = [
    cfg.ListOpt(
        "enabled_mdev_types",
        default=[],
        help="mdev types to report. For each type T, an optional group "
        "[mdev_T] takes 'device_addresses' (the GPUs that offer it) and "
        "'mdev_class' (the resource class; default VGPU).",
    ),
    cfg.BoolOpt(
        "remove_released_mdevs",
        default=False,
        help="Remove an mdev from the host when the instance that held it "
        "gives it back. By default it stays, ready for the next claim.",
    ),
    cfg.FloatOpt(
        "health_poll_interval",
        default=1.0,
        min=0.1,
        max=60.0,
        help="Seconds between two reads of the allowlisted devices' health "
        "in sysfs (presence, config space, AER counters, VF count, link). A "
        "device that turns bad is taken out of scheduling at the next "
        "update cycle, which the change starts at once; so this bounds how "
        "long a bad device stays on offer.",
    ),
    cfg.IntOpt(
        "health_correctable_errors_per_minute",
        default=100,
        min=1,
        max=1000000,
        help="A device whose AER correctable error count (TOTAL_ERR_COR) "
        "rises by this many or more within a minute is unhealthy, until a "
        "minute holds fewer. Any rise of the fatal or non-fatal counts is "
        "unhealthy whatever this says.",
    ),
]

mdev_type_opts = [
    cfg.ListOpt("device_addresses", default=[],
                help="PCI addresses of the GPUs that offer this type. A "
                "GPU's PF address names every VF of it (NVIDIA's "
                "vendor-specific VFIO vGPU, or mdevs on VFs); VF addresses "
                "name those VFs. Empty: every GPU that offers the type."),
    cfg.StrOpt("mdev_class", default="VGPU",
               help="Resource class for this type."),
]

pmem_opts = [
    cfg.ListOpt(
        "namespaces",
        default=[],
        deprecated_opts=[_nova("pmem_namespaces", "libvirt")],
        help="Labels and the namespaces they group, as nova writes them: "
        "'LABEL:ns0|ns1,LABEL2:ns2'. Each label becomes the resource class "
        "CUSTOM_PMEM_NAMESPACE_<LABEL>.",
    ),
    cfg.StrOpt(
        "ndctl_json",
        help="A file holding the output of 'ndctl list -N'. When set, "
        "namespaces are read from it instead of /sys/bus/nd/devices.",
    ),
]

heal_opts = [
    cfg.BoolOpt(
        "on_startup",
        default=False,
        help="Heal the host at start-up, before RPC is served: move the "
        "allocations that a change of model left on old providers, as "
        "'compute-agent-manage heal --yes' does. A heal that is refused or "
        "fails is logged, and the host stays reserved until healed.",
    ),
]

metrics_opts = [
    cfg.StrOpt(
        "listen",
        help="host:port (an IPv6 address as [address]:port) on which the "
        "daemon serves Prometheus metrics at /metrics, over plain HTTP. "
        "Unset (the default): no endpoint. The metrics carry host and "
        "device names, not secrets; bind to an address your Prometheus "
        "reaches and others do not. A port in use stops the start, exit 2. "
        "The same listener answers /healthz and /readyz, for the liveness "
        "and readiness probes of a pod.",
    ),
    cfg.IntOpt(
        "healthz_turn_limit",
        default=120,
        min=1,
        max=86400,
        help="Seconds a turn of the update loop (a cycle, and the "
        "reconciliation every reconcile_interval cycles) may run before "
        "/healthz answers 503, the loop taken for stuck: the pod's "
        "equivalent of the systemd unit's WatchdogSec=120. Keep it above "
        "twice [placement] timeout, so that a Placement that hangs only "
        "fails cycles.",
    ),
]

fake_opts = [
    cfg.StrOpt(
        "host_file",
        help="JSON or YAML description of the fake driver's host.",
    ),
    cfg.StrOpt(
        "state_file",
        help="A file the fake hypervisor keeps its guests and created mdevs "
             "in, so that they outlive the agent process, as a real "
             "hypervisor's do (for tests that kill the agent). Another fake "
             "hypervisor live-migrates a guest to it at fake-file://<path>. "
             "Unset: they live in the process.",
    ),
]


def _placement_opts() -> list[cfg.Opt]:
    return (
        ks_loading.get_session_conf_options()
        + ks_loading.get_auth_common_conf_options()
        + ks_loading.get_auth_plugin_conf_options("password")
        + ks_loading.get_adapter_conf_options(include_deprecated=False)
    )


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(default_opts)
    conf.register_opts(compute_opts, group="compute")
    conf.register_opts(libvirt_opts, group="libvirt")
    conf.register_opts(pci_opts, group="pci")
    conf.register_opts(devices_opts, group="devices")
    conf.register_opts(pmem_opts, group="pmem")
    conf.register_opts(fake_opts, group="fake")
    conf.register_opts(heal_opts, group="heal")
    conf.register_opts(metrics_opts, group="metrics")
    conf.register_group(placement_group())
    ks_loading.register_session_conf_options(conf, PLACEMENT_GROUP)
    ks_loading.register_auth_conf_options(conf, PLACEMENT_GROUP)
    ks_loading.register_adapter_conf_options(
        conf, PLACEMENT_GROUP, include_deprecated=False)
    conf.set_default("service_type", "placement", group=PLACEMENT_GROUP)
    logging.register_options(conf)
    # The sample lists it with oslo.log's options; oslo.log registers it
    # only when something is deprecated, so a bad value would go unseen.
    conf.register_opts(versionutils.deprecated_opts)
    messaging.register_opts(conf)
    # oslo.messaging's queue manager (use_queue_manager) names this
    # process's reply and fanout queues, and its counter file in /dev/shm,
    # after [oslo_messaging_rabbit] hostname. Its default, the machine's
    # name, is shared by every agent of a machine (several in tests and in
    # tools/fleet, or two containers of one name), whose queues would then
    # take one another's messages; this host's name is its agent's alone.
    conf.set_default("hostname", "$host", group="oslo_messaging_rabbit")
    # With several nodes in transport_url: the node a lost connection is
    # made again to, drawn at random. With oslo.messaging's round-robin, an
    # agent whose node of three hung (a frozen VM, a stopped process: its
    # port still takes connections, nothing answers) tried that same node
    # again at every attempt, and stayed deaf until it came back
    # (tests/cluster/test_broker_cluster.py).
    conf.set_default("kombu_failover_strategy", "shuffle", group="oslo_messaging_rabbit")


def _parse_with_byte_order_mark(parser: cfg.ConfigParser) -> None:
    with open(parser.filename, encoding="utf-8-sig") as f:
        iniparser.BaseParser.parse(parser, f.readlines())


def read_byte_order_marks() -> None:
    """oslo.config opens a config file as plain text, so the byte-order
    mark some editors put first becomes part of the first line, which
    then parses as neither a section nor an option: read the files as
    UTF-8 that may start with one (the same text otherwise)."""
    # A patch of oslo.config's class, on purpose: no type says that.
    cfg.ConfigParser.parse = _parse_with_byte_order_mark  # type: ignore[method-assign,assignment]


def register_mdev_type_groups(conf: cfg.ConfigOpts) -> None:
    """Register [mdev_<type>] for each enabled type; their names are only
    known once the config has been read."""
    for type_id in conf.devices.enabled_mdev_types:
        conf.register_opts(mdev_type_opts, group=f"mdev_{type_id}")


def list_opts():
    return [
        (None, default_opts),
        ("compute", compute_opts),
        ("libvirt", libvirt_opts),
        ("pci", pci_opts),
        ("devices", devices_opts),
        ("pmem", pmem_opts),
        ("fake", fake_opts),
        ("heal", heal_opts),
        ("metrics", metrics_opts),
        (placement_group(), _placement_opts()),
        ("upgrade_levels", messaging.upgrade_opts),
    ]
