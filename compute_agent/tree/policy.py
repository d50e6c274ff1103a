"""Read the operator's policy out of the config into a TreePolicy, checking
every value on the way: errors name the option and the value."""
from __future__ import annotations

import re

import os_resource_classes as orc
import os_traits
from oslo_config import cfg

from compute_agent.common.cpuset import parse_cpu_set
from compute_agent.common.pci_address import canonical_address
from compute_agent.config import register_mdev_type_groups
from compute_agent.exception import ConfigError, shown
from compute_agent.tree.device_spec import PLACEMENT_NAME_LENGTH, parse_specs
from compute_agent.tree.host_tree import MdevTypePolicy, TreeMode, TreePolicy

# What os-resource-classes and os-traits accept as a custom name, within
# the 255 characters Placement takes for a trait or a resource class.
_CUSTOM_NAME = re.compile(rf"CUSTOM_[A-Z0-9_]{{1,{PLACEMENT_NAME_LENGTH - len('CUSTOM_')}}}")


def _cpu_option(conf: cfg.ConfigOpts, name: str) -> frozenset[int] | None:
    """A CPU list that names at least one CPU: an empty item ('1,,2') is a
    typo, and a set that excludes all it includes ('0-7,^0-7') would
    report no CPUs of that kind while the operator meant some."""
    text = getattr(conf.compute, name)
    if text is None:
        return None
    if any(not item.strip() for item in text.split(",")):
        raise ConfigError(f"[compute] {name}: an empty item in the CPU list "
                          f"(value: {shown(text)})")
    try:
        cpus = parse_cpu_set(text)
    except ValueError as e:
        raise ConfigError(f"[compute] {name}: {e} (value: {shown(text)})") from None
    if not cpus:
        raise ConfigError(f"[compute] {name}: names no CPU; leave it unset "
                          f"instead (value: {shown(text)})")
    return cpus


# A label names a resource class (CUSTOM_PMEM_NAMESPACE_<LABEL>) and a
# provider; a namespace is named as ndctl names it.
_PMEM_LABEL = re.compile(r"[A-Za-z0-9_]+")
_PMEM_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]+")


def _pmem_labels(conf: cfg.ConfigOpts) -> tuple[tuple[str, frozenset[str]], ...]:
    out: list[tuple[str, frozenset[str]]] = []
    for entry in conf.pmem.namespaces:
        label, sep, names = entry.partition(":")
        label = label.strip()
        members = [n.strip() for n in names.split("|")]
        if not sep or not label or not all(members):
            raise ConfigError(f"[pmem] namespaces: expected LABEL:ns0|ns1 "
                              f"(value: {shown(entry)})")
        if not _PMEM_LABEL.fullmatch(label):
            raise ConfigError(f"[pmem] namespaces: label {shown(label)} is not "
                              f"letters, digits and _ (value: {shown(entry)})")
        bad = [n for n in members if not _PMEM_NAMESPACE.fullmatch(n)]
        if bad:
            raise ConfigError(f"[pmem] namespaces: namespace {shown(bad[0])} is not "
                              f"letters, digits, '.', '-' and _ (value: {shown(entry)})")
        if label in dict(out):
            raise ConfigError(f"[pmem] namespaces: label {shown(label)} given twice "
                              f"(value: {shown(entry)})")
        out.append((label, frozenset(members)))
    return tuple(out)


# An mdev type id as the kernel names it (nvidia-35, i915-GVTg_V5_4); it
# also names the config group [mdev_<type>].
_MDEV_TYPE = re.compile(r"[A-Za-z0-9_-]+")


def _mdev_addresses(type_id: str, texts: list[str]) -> frozenset[str] | None:
    try:
        return frozenset(canonical_address(a.strip()) for a in texts) or None
    except ValueError as e:
        raise ConfigError(f"[mdev_{type_id}] device_addresses: {e} "
                          f"(value: {shown(','.join(texts))})") from None


def _mdev_types(conf: cfg.ConfigOpts) -> tuple[MdevTypePolicy, ...]:
    for type_id in conf.devices.enabled_mdev_types:
        if not _MDEV_TYPE.fullmatch(type_id):
            raise ConfigError("[devices] enabled_mdev_types: not an mdev type "
                              f"id of letters, digits, '-' and _ (value: {shown(type_id)})")
    register_mdev_type_groups(conf)
    out = []
    for type_id in conf.devices.enabled_mdev_types:
        group = conf[f"mdev_{type_id}"]
        rc = group.mdev_class.strip().upper()
        if rc not in orc.STANDARDS and not _CUSTOM_NAME.fullmatch(rc):
            raise ConfigError(f"[mdev_{type_id}] mdev_class: not a standard "
                              "class nor CUSTOM_ followed by up to 248 of A-Z, 0-9 and _ "
                              f"(value: {shown(group.mdev_class)})")
        out.append(MdevTypePolicy(type_id, rc,
                                  _mdev_addresses(type_id, group.device_addresses)))
    return tuple(out)


# sriov_totalvfs is a 16-bit field of the SR-IOV capability (TotalVFs).
MAX_VF_COUNT = 0xFFFF


def _vf_counts(conf: cfg.ConfigOpts) -> tuple[tuple[str, int], ...]:
    """[pci] vf_counts: ADDRESS=COUNT items, each PF once."""
    out: dict[str, int] = {}
    for item in conf.pci.vf_counts:
        address, sep, count = item.partition("=")
        try:
            address = canonical_address(address.strip())
        except ValueError as e:
            raise ConfigError(f"[pci] vf_counts: {e} (value: {shown(item)})") from None
        count = count.strip()
        if not sep or not count.isdigit() or int(count) > MAX_VF_COUNT:
            raise ConfigError(f"[pci] vf_counts: expected ADDRESS=COUNT, COUNT a whole "
                              f"number from 0 to {MAX_VF_COUNT} (value: {shown(item)})")
        if address in out:
            raise ConfigError(f"[pci] vf_counts: PF {address} given twice "
                              f"(value: {shown(item)})")
        out[address] = int(count)
    return tuple(sorted(out.items()))


def _owner_trait(conf: cfg.ConfigOpts) -> str:
    name: str = conf.owner_trait.strip()
    standard = name.startswith("OWNER_") and name in os_traits.get_traits()
    if not standard and not _CUSTOM_NAME.fullmatch(name):
        raise ConfigError("[DEFAULT] owner_trait: not an OWNER_* trait of "
                          "os-traits nor CUSTOM_ followed by up to 248 of A-Z, 0-9 and _ "
                          f"(value: {shown(conf.owner_trait)})")
    return name


def tree_policy_from_conf(conf: cfg.ConfigOpts, root_uuid: str) -> TreePolicy:
    c = conf.compute
    return TreePolicy(
        host=conf.host,
        root_uuid=root_uuid,
        mode=TreeMode(c.provider_tree_mode),
        dedicated_cpus=_cpu_option(conf, "cpu_dedicated_set"),
        shared_cpus=_cpu_option(conf, "cpu_shared_set"),
        reserved_memory_mb=c.reserved_host_memory_mb,
        reserved_disk_mb=c.reserved_host_disk_mb,
        cpu_allocation_ratio=c.cpu_allocation_ratio,
        ram_allocation_ratio=c.ram_allocation_ratio,
        disk_allocation_ratio=c.disk_allocation_ratio,
        device_specs=parse_specs(conf.pci.device_spec),
        mdev_types=_mdev_types(conf),
        pmem_labels=_pmem_labels(conf),
        owner_trait=_owner_trait(conf),
        vf_counts=_vf_counts(conf),
    )
