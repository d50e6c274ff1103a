"""The scheduler's ``GET /allocation_candidates`` for a VM with several GPUs,
on Placement's defaults, in the provider shapes a GPU host can be given.

Hosts of 2 cards x 16 VFs of one vGPU type (NVIDIA's vendor-specific VFIO
layout), and hosts of 8 whole GPUs on 2 NUMA cells, in two shapes each:

- one provider per device (a VF, a GPU) with one unit: a VM with N GPUs
  asks N request groups, each of a different provider (``group_policy
  = isolate``), as nova asks for one-unit providers;
- one provider per card and type (vGPU), or per product and NUMA cell
  (whole GPUs), with N units: a VM asks one group per card, or per cell it
  spans.

Each (shape, GPUs per VM, hosts) is asked ``QUERIES`` times, the median
kept; a query Placement has not answered within ``QUERY_TIMEOUT`` is
recorded as such and not asked at larger sizes (the time only grows with
the trees). The trees are written the way the agent writes them (a
provider, its inventory, its traits), many at a time.
"""
from __future__ import annotations

import enum
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from compute_agent.testing.local_placement import LocalPlacement

HOSTS = (1, 100, 1000)
GPUS_PER_VM = (1, 2, 4, 8)
QUERIES = 3
QUERY_TIMEOUT = 60.0
WRITERS = 4
LOCKED_RETRIES = 20
# Placement's version of `same_subtree` and of group_policy with numbered
# groups in one request.
MICROVERSION = "1.36"
HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": f"placement {MICROVERSION}",
           "Accept": "application/json"}

CARDS = 2
VFS_PER_CARD = 16
VGPU_TRAIT = "CUSTOM_MDEV_TYPE_NVIDIA_1155"  # one type, L40-1Q: 16 fit a card
WHOLE_GPUS = 8
CELLS = 2
WHOLE_GPU_CLASS = "CUSTOM_PCI_10DE_26B5"
ROOT_INVENTORY = {"VCPU": 128, "MEMORY_MB": 1 << 20, "DISK_GB": 2000}
VM = "VCPU:2,MEMORY_MB:4096"


class Shape(str, enum.Enum):
    VGPU_PER_VF = "vgpu_per_vf"
    VGPU_PER_CARD = "vgpu_per_card"
    WHOLE_PER_DEVICE = "whole_gpu_per_device"
    WHOLE_PER_CELL = "whole_gpu_per_cell"


@dataclass(frozen=True)
class Child:
    """A device provider under a host's root."""

    suffix: str
    resource_class: str
    units: int
    trait: str | None = None


def children(shape: Shape) -> list[Child]:
    if shape is Shape.VGPU_PER_VF:
        return [Child(f"card{c}_vf{v}", "VGPU", 1, VGPU_TRAIT)
                for c in range(CARDS) for v in range(VFS_PER_CARD)]
    if shape is Shape.VGPU_PER_CARD:
        return [Child(f"card{c}", "VGPU", VFS_PER_CARD, VGPU_TRAIT) for c in range(CARDS)]
    if shape is Shape.WHOLE_PER_DEVICE:
        return [Child(f"gpu{g}", WHOLE_GPU_CLASS, 1) for g in range(WHOLE_GPUS)]
    return [Child(f"cell{c}", WHOLE_GPU_CLASS, WHOLE_GPUS // CELLS) for c in range(CELLS)]


def request_groups(shape: Shape, gpus: int) -> dict[str, str]:
    """The query string of a VM with ``gpus`` GPUs in ``shape``: one group a
    device on one-unit providers; one group on a card (it holds 16); one
    group a NUMA cell the VM spans for whole GPUs."""
    query = {"resources": VM}
    if shape in (Shape.VGPU_PER_VF, Shape.WHOLE_PER_DEVICE):
        rc = "VGPU" if shape is Shape.VGPU_PER_VF else WHOLE_GPU_CLASS
        for g in range(1, gpus + 1):
            query[f"resources{g}"] = f"{rc}:1"
            if shape is Shape.VGPU_PER_VF:
                query[f"required{g}"] = VGPU_TRAIT
        if gpus > 1:
            query["group_policy"] = "isolate"
        return query
    if shape is Shape.VGPU_PER_CARD:
        return {**query, "resources1": f"VGPU:{gpus}", "required1": VGPU_TRAIT}
    per_cell = WHOLE_GPUS // CELLS
    groups = -(-gpus // per_cell)
    for g in range(1, groups + 1):
        query[f"resources{g}"] = f"{WHOLE_GPU_CLASS}:{min(per_cell, gpus - (g - 1) * per_cell)}"
    if groups > 1:
        query["group_policy"] = "isolate"
    return query


class Writer:
    """Trees written to Placement, hosts in parallel."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers.update(HEADERS)

    def _ok(self, send: Callable[[], requests.Response]) -> dict:
        for _ in range(LOCKED_RETRIES):
            resp = send()
            # The local Placement is on SQLite: one writer at a time, and
            # now and then a 500 "database is locked" for the others.
            if not (resp.status_code == 500 and "database is locked" in resp.text):
                break
        if resp.status_code >= 300:
            raise RuntimeError(f"{resp.request.method} {resp.url}: {resp.status_code} "
                               f"{resp.text[:200]}")
        return resp.json() if resp.content else {}

    def provider(self, name: str, parent: str | None, inventory: dict[str, int],
                 trait: str | None) -> str:
        rp = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
        body = {"name": name, "uuid": rp}
        if parent:
            body["parent_provider_uuid"] = parent
        generation = self._ok(lambda: self.session.post(
            f"{self.url}/resource_providers", json=body))["generation"]
        generation = self._ok(lambda: self.session.put(
            f"{self.url}/resource_providers/{rp}/inventories",
            json={"resource_provider_generation": generation,
                  "inventories": {rc: {"total": n} for rc, n in inventory.items()}}))[
            "resource_provider_generation"]
        if trait:
            self._ok(lambda: self.session.put(
                f"{self.url}/resource_providers/{rp}/traits",
                json={"resource_provider_generation": generation, "traits": [trait]}))
        return rp

    def host(self, shape: Shape, index: int) -> None:
        name = f"{shape.value}-{index}"
        root = self.provider(name, None, ROOT_INVENTORY, None)
        for child in children(shape):
            self.provider(f"{name}_{child.suffix}", root, {child.resource_class: child.units},
                          child.trait)

    def custom_names(self) -> None:
        self._ok(lambda: self.session.put(f"{self.url}/traits/{VGPU_TRAIT}"))
        self._ok(lambda: self.session.put(f"{self.url}/resource_classes/{WHOLE_GPU_CLASS}"))

    def hosts(self, shape: Shape, start: int, stop: int) -> None:
        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(lambda i: Writer(self.url).host(shape, i), range(start, stop)))


def timed_query(url: str, query: dict[str, str]) -> tuple[float | None, int]:
    """Seconds Placement took to answer, and the candidates it gave; None
    when it gave no answer within QUERY_TIMEOUT (the rest are then not
    asked: each would wait as long)."""
    started = time.monotonic()
    try:
        resp = requests.get(f"{url}/allocation_candidates", params=query, headers=HEADERS,
                            timeout=QUERY_TIMEOUT)
    except (requests.Timeout, requests.ConnectionError):
        return None, 0
    spent = time.monotonic() - started
    if resp.status_code != 200:
        raise RuntimeError(f"allocation_candidates {query}: {resp.status_code} "
                           f"{resp.text[:200]}")
    return spent, len(resp.json()["allocation_requests"])


def measure(workdir: Path, shape: Shape, sizes: tuple[int, ...] = HOSTS) -> Iterator[dict]:
    placement = LocalPlacement(workdir / shape.value, workers=2).start()
    try:
        writer = Writer(placement.url)
        writer.custom_names()
        written = 0
        gave_up: set[int] = set()
        for hosts in sizes:
            if gave_up == set(GPUS_PER_VM):
                return
            started = time.monotonic()
            writer.hosts(shape, written, hosts)
            written = hosts
            write_seconds = time.monotonic() - started
            for gpus in GPUS_PER_VM:
                if gpus in gave_up:
                    continue
                runs = []
                for _ in range(QUERIES):
                    runs.append(timed_query(placement.url, request_groups(shape, gpus)))
                    if runs[-1][0] is None:
                        break
                answered = [s for s, _ in runs if s is not None]
                result = {"case": "gpu_candidates", "shape": shape.value, "hosts": hosts,
                          "gpus_per_vm": gpus, "providers_per_host": 1 + len(children(shape)),
                          "write_seconds": round(write_seconds, 1)}
                if len(answered) < QUERIES:
                    gave_up.add(gpus)
                    # Placement works on a query its client gave up on:
                    # restarted, so that the next queries are not behind it.
                    placement.stop()
                    placement.start()
                    yield {**result, "answered": f"no answer within {QUERY_TIMEOUT:.0f} s"}
                    continue
                yield {**result, "seconds_median": round(statistics.median(answered), 3),
                       "candidates": runs[-1][1]}
                # The time only grows with the trees: past QUERY_TIMEOUT
                # at this size, not asked at the next.
                if statistics.median(answered) > QUERY_TIMEOUT / 2:
                    gave_up.add(gpus)
    finally:
        placement.stop()


def run(workdir: Path) -> list[dict]:
    return [result for shape in Shape for result in measure(workdir, shape)]
