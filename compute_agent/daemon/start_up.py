"""The steps of the agent's start before its first cycle and after it
(compute_agent/daemon/service.py's Agent.start), each of which the start
outlives: a failure is logged, and the agent runs on, keeping reserved
what a step left undone."""
from __future__ import annotations

import logging

from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.vgpu_types import restore_vgpu_types_after_reboot
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import AgentError, PlacementError, PlacementUnavailable
from compute_agent.heal.realign import DeviceIndex
from compute_agent.heal.run import HealedAgent, align_store, run_heal
from compute_agent.health.vf_restore_run import VfRestore
from compute_agent.store.errors import StoreError

LOG = logging.getLogger(__name__)


def heal_safely(agent: HealedAgent) -> None:
    """[heal] on_startup: one heal before RPC is served; a refusal or a
    failure leaves the host reserved until healed, and running."""
    try:
        run_heal(agent)
    except AgentError as e:
        LOG.warning("Heal at start-up not done: %s", e)
    except Exception:  # start-up must outlive any bug in heal
        LOG.exception("Heal at start-up failed")


def align_store_safely(agent: HealedAgent) -> None:
    """The store's rows follow the allocations a heal moved, should that
    heal have been killed before it wrote them (compute_agent/heal/realign.py)."""
    try:
        align_store(agent, DeviceIndex(agent.manager.tracker.pools()))
    except (PlacementUnavailable, PlacementError) as e:
        LOG.warning("Store not aligned with Placement at start-up: %s", e)
    except Exception:  # start-up must outlive any bug here
        LOG.exception("Aligning the store with Placement failed")


def restore_after_reboot(vf_restore: VfRestore, driver: ComputeDriver) -> None:
    """Before the first cycle: the devices a host reboot took that the
    agent manages, back (compute_agent/health/vf_restore_run.py). A failure is
    logged; the cycles keep what is not back reserved."""
    try:
        vf_restore.restore(driver.boot_id())
    except (DriverUnavailable, StoreError, OSError) as e:
        LOG.warning("VF counts not restored at start-up: %s", e)
    except Exception:  # start-up must outlive any bug here
        LOG.exception("Restoring VF counts at start-up failed")


def restore_vgpu_types(manager: ComputeManager, driver: ComputeDriver) -> dict[str, str]:
    """Before the first cycle and before any claim, once the VFs are
    back: the vGPU VFs' types a reboot cleared written back from the
    store. The VFs whose type is not back -> why; none known when the
    restore failed."""
    try:
        return restore_vgpu_types_after_reboot(manager, driver.boot_id())
    except Exception:  # start-up must outlive any bug here
        LOG.exception("Restoring the vGPU VFs' types failed")
        return {}
