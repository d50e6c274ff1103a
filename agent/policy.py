"""Read the operator's policy out of the config into a TreePolicy, checking
every value on the way: errors name the option and the value."""
from __future__ import annotations

import re

import os_resource_classes as orc
import os_traits
from oslo_config import cfg

from agent.config import register_mdev_type_groups
from compute_common.cpuset import parse_cpu_set
from agent.device_spec import parse_specs
from agent.exception import ConfigError
from agent.host_tree import MdevTypePolicy, TreeMode, TreePolicy


def _cpu_option(conf: cfg.ConfigOpts, name: str) -> frozenset[int] | None:
    text = getattr(conf.compute, name)
    if text is None:
        return None
    try:
        return parse_cpu_set(text)
    except ValueError as e:
        raise ConfigError(f"[compute] {name}: {e}") from None


def _pmem_labels(conf: cfg.ConfigOpts) -> tuple[tuple[str, frozenset[str]], ...]:
    out = []
    for entry in conf.pmem.namespaces:
        label, sep, names = entry.partition(":")
        members = frozenset(n.strip() for n in names.split("|") if n.strip())
        if not sep or not label.strip() or not members:
            raise ConfigError(f"[pmem] namespaces: expected LABEL:ns0|ns1 "
                              f"(value: {entry!r})")
        out.append((label.strip(), members))
    return tuple(out)


def _mdev_types(conf: cfg.ConfigOpts) -> tuple[MdevTypePolicy, ...]:
    register_mdev_type_groups(conf)
    out = []
    for type_id in conf.devices.enabled_mdev_types:
        group = conf[f"mdev_{type_id}"]
        rc = group.mdev_class.strip().upper()
        if rc not in orc.STANDARDS and not orc.is_custom(rc):
            raise ConfigError(f"[mdev_{type_id}] mdev_class: not a standard "
                              f"class nor CUSTOM_* (value: {group.mdev_class!r})")
        addresses = frozenset(a.lower() for a in group.device_addresses) or None
        out.append(MdevTypePolicy(type_id, rc, addresses))
    return tuple(out)


def _owner_trait(conf: cfg.ConfigOpts) -> str:
    name = conf.owner_trait.strip()
    standard = name.startswith("OWNER_") and name in os_traits.get_traits()
    if not standard and not re.fullmatch(r"CUSTOM_[A-Z0-9_]+", name):
        raise ConfigError("[DEFAULT] owner_trait: not an OWNER_* trait of "
                          "os-traits nor a CUSTOM_* name of A-Z, 0-9 and _ "
                          f"(value: {conf.owner_trait!r})")
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
    )
