"""Parsing of libvirt's capabilities XML and of sysfs NUMA node files.

Pure functions: the caller hands in text, these hand back the NumaCell
dataclasses of compute_agent.drivers.base and a list of warnings. No libvirt, no file I/O.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lxml import etree

from compute_agent.drivers.base import NumaCell
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import parse_cpulist, parse_int

DEVICE = "capabilities"
# Units libvirt writes on <memory> and <pages>, as multiples of a KiB.
_KIB_PER_UNIT = {"b": None, "bytes": None, "kib": 1, "k": 1, "mib": 1024,
                 "m": 1024, "gib": 1024 ** 2, "g": 1024 ** 2}
_MEMINFO_TOTAL = re.compile(r"^Node\s+(\d+)\s+MemTotal:\s+(\d+)\s+kB\s*$",
                            re.MULTILINE)


@dataclass(frozen=True)
class Capabilities:
    uuid: str | None
    cells: tuple[NumaCell, ...]
    # The kernel's base page size (4 KiB on x86, 64 KiB on some arm64 and
    # POWER kernels); None when libvirt lists no page sizes.
    base_page_kib: int | None = None
    # The host CPU's features listed in the XML, by libvirt's names: those
    # beyond its named model (host_cpu.py adds the model's own).
    cpu_features: frozenset[str] = frozenset()
    # The host's <cpu> element as text when it names a model: what
    # baselineCPU expands. None when it names none: its list is whole.
    cpu_definition: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*(cell.cpus for cell in self.cells))


def parse_xml(text: object, device: str) -> etree._Element:
    """Parse XML from libvirt without trusting it: no entities, no network,
    and any syntax problem becomes InvalidHostData."""
    if not isinstance(text, (str, bytes)):
        raise InvalidHostData(device, "xml", "not text", text)
    try:
        data = text.encode("utf-8") if isinstance(text, str) else text
        parser = etree.XMLParser(resolve_entities=False, no_network=True,
                                 load_dtd=False, huge_tree=False)
        root = etree.fromstring(data, parser)
    except (etree.XMLSyntaxError, UnicodeError, ValueError) as exc:
        raise InvalidHostData(device, "xml", f"malformed XML: {exc}",
                              text) from None
    if root is None:
        raise InvalidHostData(device, "xml", "empty document", text)
    return root


def parse_capabilities(text: object) -> Capabilities:
    """Host UUID and NUMA cells from ``virConnect.getCapabilities()``.

    A document that is not capabilities XML raises InvalidHostData; a cell
    that cannot be read is left out with a warning."""
    root = parse_xml(text, DEVICE)
    host = root.find("host") if root.tag == "capabilities" else None
    if host is None:
        raise InvalidHostData(DEVICE, "host", "no <capabilities><host>",
                              text)
    warnings: list[str] = []
    host_uuid = None
    uuid_text = host.findtext("uuid")
    if uuid_text is not None:
        try:
            host_uuid = str(uuid.UUID(uuid_text.strip()))
        except ValueError:
            warnings.append(str(InvalidHostData(
                DEVICE, "uuid", "not a UUID", uuid_text)))
    cells: dict[int, NumaCell] = {}
    for index, cell_el in enumerate(host.iterfind("topology/cells/cell")):
        try:
            cell = _parse_cell(cell_el, index)
        except InvalidHostData as exc:
            warnings.append(str(exc))
            continue
        if cell.id in cells:
            warnings.append(str(InvalidHostData(
                f"cell {cell.id}", "id", "duplicate cell id", cell.id)))
            continue
        cells[cell.id] = cell
    base_page_kib = None
    try:
        base_page_kib = _base_page_kib(host)
    except InvalidHostData as exc:
        warnings.append(str(exc))
    cpu = host.find("cpu")
    features = cpu_features(cpu) if cpu is not None else frozenset()
    definition = (etree.tostring(cpu, encoding="unicode", with_tail=False)
                  if cpu is not None and (cpu.findtext("model") or "").strip()
                  else None)
    return Capabilities(host_uuid, tuple(cells[i] for i in sorted(cells)),
                        base_page_kib, features, definition, tuple(warnings))


def cpu_features(cpu: etree._Element) -> frozenset[str]:
    """The features of a ``<cpu>`` element: the host CPU of capabilities
    XML, whose features are those its named model leaves out, or a CPU
    that baselineCPU expanded to every feature. A feature whose policy
    says the CPU lacks it (``disable``, ``forbid``) is not one."""
    return frozenset(
        name.strip().lower() for f in cpu.iterfind("feature")
        if (name := f.get("name")) and name.strip()
        and f.get("policy", "require") not in ("disable", "forbid"))


def _base_page_kib(host: etree._Element) -> int | None:
    """libvirt lists the page sizes the host supports under <cpu>, the
    base page first."""
    page_el = host.find("cpu/pages")
    if page_el is None:
        return None
    return _page_kib(page_el, "cpu")


def _parse_cell(cell_el: etree._Element, index: int) -> NumaCell:
    raw_id = cell_el.get("id")
    device = f"cell {raw_id if raw_id is not None else f'#{index}'}"
    cell_id = parse_int(raw_id, device, "id", maximum=4095)
    memory_el = cell_el.find("memory")
    # libvirt leaves <memory> out of a memory-less cell (CPUs whose memory
    # is on other nodes): the cell still has its CPUs.
    memory_kib = (0 if memory_el is None else _kib(
        memory_el, device, "memory",
        parse_int(memory_el.text, device, "memory")))
    cpus: set[int] = set()
    siblings: set[frozenset[int]] = set()
    for cpu_el in cell_el.iterfind("cpus/cpu"):
        cpu = parse_int(cpu_el.get("id"), device, "cpu id", maximum=65535)
        cpus.add(cpu)
        # A CPU with no siblings attribute is its own only thread.
        threads = cpu_el.get("siblings")
        group = (parse_cpulist(threads, device, f"cpu {cpu} siblings")
                 if threads is not None else frozenset())
        siblings.add(group | {cpu})
    pages = [(_page_kib(page_el, device),
              parse_int(page_el.text, device, "pages"))
             for page_el in cell_el.iterfind("pages")]
    distances = [
        (parse_int(sib.get("id"), device, "distance id", maximum=4095),
         parse_int(sib.get("value"), device, "distance value"))
        for sib in cell_el.iterfind("distances/sibling")]
    return NumaCell(
        id=cell_id, cpus=frozenset(cpus), memory_mb=memory_kib // 1024,
        siblings=tuple(sorted(siblings, key=lambda s: (min(s), sorted(s)))),
        pages=tuple(sorted(pages)), distances=tuple(sorted(distances)))


def _page_kib(page_el: etree._Element, device: str) -> int:
    return _kib(page_el, device, "pages size",
                parse_int(page_el.get("size"), device, "pages size",
                          minimum=1))


def _kib(element: etree._Element, device: str, field_name: str,
         amount: int) -> int:
    unit = (element.get("unit") or "KiB").lower()
    if unit not in _KIB_PER_UNIT:
        raise InvalidHostData(device, f"{field_name} unit", "unknown unit",
                              element.get("unit"))
    per = _KIB_PER_UNIT[unit]
    return amount // 1024 if per is None else amount * per


def parse_sysfs_numa_node(node_id: int, cpulist: str, meminfo: str,
                          hugepages: Mapping[int, str],
                          base_page_kib: int) -> NumaCell:
    """One ``devices/system/node/node<N>`` directory's files as a cell.

    ``hugepages`` maps a page size in KiB to that size's nr_hugepages text.
    The base pages are what MemTotal leaves after the huge pages, as
    libvirt counts them. Thread siblings and distances are left empty: the
    node files do not say them."""
    device = f"node{node_id}"
    cpus = parse_cpulist(cpulist, device, "cpulist")
    match = (_MEMINFO_TOTAL.search(meminfo) if isinstance(meminfo, str)
             else None)
    if not match or int(match.group(1)) != node_id:
        raise InvalidHostData(device, "meminfo", "no MemTotal line", meminfo)
    total_kib = int(match.group(2))
    pages = {size: parse_int(count, device,
                             f"hugepages-{size}kB/nr_hugepages")
             for size, count in hugepages.items()}
    huge_kib = sum(size * count for size, count in pages.items())
    pages[base_page_kib] = max(total_kib - huge_kib, 0) // base_page_kib
    return NumaCell(id=node_id, cpus=cpus, memory_mb=total_kib // 1024,
                    pages=tuple(sorted(pages.items())))


def merge_cells(from_caps: Iterable[NumaCell],
                from_sysfs: Iterable[NumaCell]) -> tuple[NumaCell, ...]:
    """libvirt's view of a cell wins whole; sysfs only supplies cells that
    libvirt did not describe (a file-based test driver describes none)."""
    cells = {cell.id: cell for cell in from_sysfs}
    cells.update((cell.id, cell) for cell in from_caps)
    return tuple(cells[i] for i in sorted(cells))
