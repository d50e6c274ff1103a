"""The agent process: the periodic update_provider_tree loop, signals and
systemd notification. Native threads only (no eventlet)."""
from __future__ import annotations

import logging
import os
import random
import socket
import threading
from dataclasses import dataclass

from oslo_config import cfg

from agent import node_identity
from agent.exception import (AgentError, ConfigError, PlacementError,
                             PlacementUnavailable)
from agent.host_tree import TreePolicy, build_tree
from agent.placement import PlacementClient, adapter_from_conf
from agent.policy import tree_policy_from_conf
from agent.tree_sync import SyncResult, TreeSync
from drivers.base import ComputeDriver, DriverUnavailable

LOG = logging.getLogger(__name__)


def load_driver(conf: cfg.ConfigOpts) -> ComputeDriver:
    if conf.compute_driver == "fake":
        from drivers.fake import FakeDriver
        return FakeDriver.from_conf(conf)
    from drivers.libvirt.driver import LibvirtDriver
    return LibvirtDriver(conf)


def sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) how we are; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.sendto(state.encode(), address)
        except OSError as e:
            LOG.debug("sd_notify %s failed: %s", state, e)


@dataclass
class CycleOutcome:
    ok: bool
    reason: str = ""
    result: SyncResult | None = None


class Agent:
    def __init__(self, driver: ComputeDriver, policy: TreePolicy, sync: TreeSync,
                 interval: float = 60, jitter: float = 0):
        self.driver = driver
        self.policy = policy
        self.sync = sync
        self.interval = interval
        self.jitter = jitter
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._drop_cache = threading.Event()
        self._thread: threading.Thread | None = None
        driver.register_change_listener(self._wake.set)

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> "Agent":
        """Raises ConfigError for a bad value; connects to nothing yet."""
        conf.set_default("timeout", 30, group="placement")
        root_uuid = node_identity.load_or_create(conf.state_path)
        policy = tree_policy_from_conf(conf, root_uuid)
        host = conf.host
        sync = TreeSync(PlacementClient(adapter_from_conf(conf)), root_uuid,
                        owned=lambda p: p.name == host or p.name.startswith(host + "_"))
        return cls(load_driver(conf), policy, sync,
                   conf.update_interval, conf.update_jitter)

    def update_provider_tree(self) -> SyncResult:
        """One cycle: discover, build the desired tree, sync it."""
        if self._drop_cache.is_set():
            self._drop_cache.clear()
            self.sync.invalidate()
            LOG.info("Placement cache dropped")
        inventory = self.driver.get_host_inventory()
        built = build_tree(inventory, self.policy)
        for warning in built.warnings:
            LOG.warning("%s", warning)
        result = self.sync.sync(built.tree)
        LOG.debug("update_provider_tree: %d providers, %d writes",
                  len(built.tree), result.writes)
        return result

    def run_cycle(self) -> CycleOutcome:
        """A cycle that never raises: every failure is one log line and the
        next cycle tries again."""
        try:
            return CycleOutcome(True, result=self.update_provider_tree())
        except DriverUnavailable as e:
            reason = f"hypervisor unavailable, cycle skipped: {e}"
        except PlacementUnavailable as e:
            reason = f"Placement unavailable, cycle abandoned: {e}"
        except ConfigError as e:
            reason = f"configuration error, cycle skipped: {e}"
        except (PlacementError, AgentError) as e:
            reason = f"cycle failed: {e}"
        except Exception as e:  # the loop must outlive any bug in a cycle
            LOG.exception("update_provider_tree failed")
            return CycleOutcome(False, f"unexpected error: {type(e).__name__}: {e}")
        LOG.warning("%s", reason)
        return CycleOutcome(False, reason)

    def drop_cache(self) -> None:
        self._drop_cache.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self._wake.clear()
            self.run_cycle()
            delay = self.interval + random.uniform(0, self.jitter)
            self._wake.wait(delay)

    def start(self) -> None:
        self.driver.init_host()
        self._thread = threading.Thread(target=self._loop, name="update-provider-tree",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60) -> None:
        """Let a cycle in flight finish (its Placement calls time out on
        their own), then release the driver."""
        self.stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.driver.cleanup()
