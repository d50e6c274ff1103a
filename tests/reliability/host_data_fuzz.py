"""Fuzzed host data: libvirt's node-device and capabilities XML, ndctl's
JSON and the sysfs files the libvirt driver reads, each a valid document
mutated (elements, attributes and keys deleted, duplicated, given junk
values; raw text truncated or spliced). Every parser answers with a
result or InvalidHostData (compute_agent/drivers/host_data.py), and discovery as a
whole (LibvirtDriver.get_host_inventory) always answers.

The valid documents are real ones: the node devices of the functional
tests' host (compute_agent/drivers/fake_sysfs.py writes them as libvirt does), the
capabilities of this machine's libvirtd and of libvirt's test driver,
and ``ndctl list -N -X`` output as ndctl documents it.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import libvirt
from hypothesis import strategies as st
from lxml import etree

from compute_agent.cmd.common import load_config
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.fake_sysfs import VgpuCard
from compute_agent.drivers.libvirt import capabilities, nodedev, pmem
from compute_agent.drivers.libvirt.driver import LibvirtDriver
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from tests.functional.libvirt_host import Host
from tests.reliability.exploring import Outcome

# --- junk ------------------------------------------------------------------

_EDGE_TEXT = ["", " ", "-1", "0", "0x", "0x0", "-0", "1-0", "0-", "^0", "0,,1",
              "nan", "inf", "1e9", "ffff", "0x10000", "4294967296",
              "18446744073709551616", "\u0663", "\uff11\uff12", "KiB", "tib",
              "pci_0000_00_00_0", "computer", "\n", "0\n1"]


def huge_numbers() -> st.SearchStrategy[str]:
    """Numbers past every bound, up to past Python's int-parsing limit
    (4300 digits)."""
    return st.one_of(st.integers(-(1 << 80), 1 << 80).map(str),
                     st.integers(0, 1 << 80).map(hex),
                     st.integers(1, 6000).map(lambda n: "9" * n))


def junk_text(xml_safe: bool) -> st.SearchStrategy[str]:
    """Values a host file or attribute may hold by mistake or malice."""
    characters = (st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
                  if xml_safe else st.characters())
    return st.one_of(st.sampled_from(_EDGE_TEXT), huge_numbers(),
                     st.text(characters, max_size=40),
                     st.text(characters, min_size=1, max_size=3).map(
                         lambda t: t * 1500))


# --- XML -------------------------------------------------------------------

class XmlEdit(str, Enum):
    DELETE_ELEMENT = "delete element"
    DUPLICATE_ELEMENT = "duplicate element"
    DELETE_ATTRIBUTE = "delete attribute"
    SET_ATTRIBUTE = "set attribute"
    SET_TEXT = "set text"
    ADD_CHILD = "add child"


@dataclass(frozen=True)
class Edit:
    kind: XmlEdit
    element: int   # taken modulo the document's element count
    name: int      # which attribute or tag, modulo the names there are
    value: str


@dataclass(frozen=True)
class XmlDocument:
    """A valid document and the tag and attribute names it uses, which
    the edits draw from, so that the junk lands where parsers look."""
    text: str
    tags: tuple[str, ...]
    attributes: tuple[str, ...]


def xml_document(text: str) -> XmlDocument:
    root = etree.fromstring(text.encode())
    elements = list(root.iter())
    return XmlDocument(text, tuple(sorted({e.tag for e in elements})),
                       tuple(sorted({a for e in elements for a in e.attrib})))


def _apply(root: etree._Element, edit: Edit, document: XmlDocument) -> None:
    elements = list(root.iter())
    element = elements[edit.element % len(elements)]
    parent = element.getparent()
    names = list(element.attrib) or list(document.attributes)
    name = names[edit.name % len(names)]
    try:
        if edit.kind is XmlEdit.DELETE_ELEMENT and parent is not None:
            parent.remove(element)
        elif edit.kind is XmlEdit.DUPLICATE_ELEMENT and parent is not None:
            element.addnext(etree.fromstring(etree.tostring(element)))
        elif edit.kind is XmlEdit.DELETE_ATTRIBUTE:
            element.attrib.pop(name, None)
        elif edit.kind is XmlEdit.SET_ATTRIBUTE:
            element.set(name, edit.value)
        elif edit.kind is XmlEdit.SET_TEXT:
            element.text = edit.value
        elif edit.kind is XmlEdit.ADD_CHILD:
            child = etree.SubElement(
                element, document.tags[edit.name % len(document.tags)])
            child.text = edit.value
    except ValueError:
        pass  # a value lxml will not put in a document: the edit is skipped


def mutated_xml(document: XmlDocument, edits: list[Edit],
                splice: tuple[int, str] | None) -> str:
    """The document with ``edits`` applied; ``splice`` (where, what)
    replaces its text from that point with junk: truncated or broken."""
    root = etree.fromstring(document.text.encode())
    for edit in edits:
        _apply(root, edit, document)
    text = etree.tostring(root, encoding="unicode")
    if splice is not None:
        where, junk = splice
        cut = where % (len(text) + 1)
        text = text[:cut] + junk
    return text


def xml_inputs(documents: list[XmlDocument]) -> st.SearchStrategy[str]:
    edit = st.builds(Edit, st.sampled_from(XmlEdit), st.integers(0, 1 << 16),
                     st.integers(0, 1 << 8), junk_text(xml_safe=True))
    splice = st.none() | st.tuples(st.integers(0, 1 << 20), st.one_of(
        st.just(""), junk_text(xml_safe=False),
        st.sampled_from(["<!DOCTYPE d [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>",
                         "&e;", "<![CDATA[", "\x00", "</device>" * 3])))
    return st.builds(mutated_xml, st.sampled_from(documents),
                     st.lists(edit, min_size=1, max_size=6),
                     st.one_of(st.none(), st.none(), splice))


def node_device_documents(directory: Path) -> list[XmlDocument]:
    """Every node device of the functional tests' host, as libvirt's XML."""
    host = Host(directory, "http://127.0.0.1:1")
    host.build_default()
    host_xml = etree.fromstring(host.sys.test_driver_host_xml().encode())
    return [xml_document(etree.tostring(d, encoding="unicode"))
            for d in host_xml.iterfind("device")]


def capabilities_documents() -> list[XmlDocument]:
    """This machine's capabilities, and libvirt's test driver's."""
    texts = []
    for uri in ("qemu:///system", "test:///default"):
        conn = libvirt.open(uri)
        try:
            texts.append(conn.getCapabilities())
        finally:
            conn.close()
    return [xml_document(t) for t in texts]


def check_node_device(text: str) -> Outcome:
    """One device: its parse or InvalidHostData; many: never an error."""
    found, warnings = nodedev.parse_node_devices([("fuzzed", text)])
    assert len(found) + len(warnings) == 1, (found, warnings)
    try:
        nodedev.parse_node_device(text)
    except InvalidHostData:
        return Outcome.REFUSED
    return Outcome.RESULT


def check_capabilities(text: str) -> Outcome:
    try:
        caps = capabilities.parse_capabilities(text)
    except InvalidHostData:
        return Outcome.REFUSED
    capabilities.merge_cells(caps.cells, ())
    return Outcome.RESULT


# --- ndctl JSON ------------------------------------------------------------

# ``ndctl list -N -X``: a devdax namespace (its character device in its dax
# region), an fsdax one with a block device, and a region's idle seed.
NDCTL_LIST = [
    {"dev": "namespace0.0", "mode": "devdax", "map": "dev", "size": 67573507072,
     "uuid": "0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9", "raw_uuid":
     "1a2b3c4d-5e6f-4071-8283-94a5b6c7d8e9", "daxregion": {
         "id": 0, "size": 67573507072, "align": 2097152, "devices": [
             {"chardev": "dax0.0", "size": 67573507072, "target_node": 2,
              "align": 2097152, "mode": "devdax"}]},
     "align": 2097152, "name": "ns0", "numa_node": 0, "target_node": 2},
    {"dev": "namespace1.0", "mode": "fsdax", "map": "dev", "size": 16909336576,
     "uuid": "2b3c4d5e-6f70-4182-9394-a5b6c7d8e9fa", "sector_size": 512,
     "align": 2097152, "blockdev": "pmem1", "name": "ns1", "numa_node": 1},
    {"dev": "namespace1.1", "mode": "raw", "size": 0, "uuid":
     "00000000-0000-0000-0000-000000000000", "sector_size": 512,
     "state": "disabled", "numa_node": 1},
    {"dev": "namespace0.1", "mode": "devdax", "size": 1073741824,
     "chardev": "dax0.1", "numa_node": 0},
]
_NDCTL_KEYS = sorted({k for r in NDCTL_LIST for k in r} | {"chardev"})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False) | junk_text(xml_safe=False),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(_NDCTL_KEYS) | st.text(max_size=8), inner,
                      max_size=4),
    max_leaves=8)


class JsonEdit(str, Enum):
    DELETE_KEY = "delete key"
    SET_KEY = "set key"
    REPLACE_RECORD = "replace record"
    DUPLICATE_RECORD = "duplicate record"


@dataclass(frozen=True)
class RecordEdit:
    kind: JsonEdit
    record: int
    key: str
    value: object


def mutated_ndctl(records: list[dict], edits: list[RecordEdit], bare: bool,
                  splice: tuple[int, str] | None) -> str:
    """``ndctl list`` output edited; ``bare``: one object, as ndctl prints
    a single namespace; ``splice`` breaks the text."""
    records = json.loads(json.dumps(records))
    for edit in edits:
        if not records:
            break
        index = edit.record % len(records)
        record = records[index]
        if edit.kind is JsonEdit.DELETE_KEY and isinstance(record, dict):
            record.pop(edit.key, None)
        elif edit.kind is JsonEdit.SET_KEY and isinstance(record, dict):
            record[edit.key] = edit.value
        elif edit.kind is JsonEdit.REPLACE_RECORD:
            records[index] = edit.value
        elif edit.kind is JsonEdit.DUPLICATE_RECORD:
            records.insert(index, json.loads(json.dumps(record)))
    text = json.dumps(records[0] if bare and records else records)
    if splice is not None:
        cut = splice[0] % (len(text) + 1)
        text = text[:cut] + splice[1]
    return text


def ndctl_inputs() -> st.SearchStrategy[str]:
    edit = st.builds(RecordEdit, st.sampled_from(JsonEdit), st.integers(0, 16),
                     st.sampled_from(_NDCTL_KEYS), json_values)
    splice = st.tuples(st.integers(0, 1 << 12), st.one_of(
        junk_text(xml_safe=False),
        st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
        st.integers(1, 200_000).map(lambda n: '{"a":' * n + "0" + "}" * n)))
    return st.builds(mutated_ndctl, st.just(NDCTL_LIST),
                     st.lists(edit, min_size=1, max_size=5), st.booleans(),
                     st.one_of(st.none(), st.none(), splice))


class NdctlFile:
    """The JSON through the file the driver reads (``[pmem] ndctl_json``),
    written as bytes: a file is not always UTF-8."""

    def __init__(self, directory: Path):
        self.path = directory / "ndctl.json"

    def check(self, text: str) -> Outcome:
        try:
            pmem.parse_ndctl_json(text)
        except InvalidHostData:
            refused = True
        else:
            refused = False
        self.path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            pmem.read_namespaces(SysfsReader(os.fspath(self.path.parent)),
                                 os.fspath(self.path))
        except InvalidHostData:
            assert refused, "the file refused what the text gave"
        return Outcome.REFUSED if refused else Outcome.RESULT

    def check_bytes(self, data: bytes) -> Outcome:
        """Bytes that need not be UTF-8, through the file."""
        self.path.write_bytes(data)
        try:
            pmem.read_namespaces(SysfsReader(os.fspath(self.path.parent)),
                                 os.fspath(self.path))
        except InvalidHostData:
            return Outcome.REFUSED
        return Outcome.RESULT


def ndctl_bytes() -> st.SearchStrategy[bytes]:
    """ndctl's output as bytes, a few of them broken."""
    return st.builds(
        lambda text, at, junk: (lambda b: b[:at % (len(b) + 1)] + junk + b[
            at % (len(b) + 1):])(text.encode()),
        ndctl_inputs(), st.integers(0, 1 << 12), st.binary(max_size=8))


# --- sysfs -----------------------------------------------------------------

class FileEdit(str, Enum):
    WRITE = "write junk"
    DELETE = "delete"
    EMPTY_DIRECTORY = "directory instead"
    RETARGET = "point elsewhere"


@dataclass(frozen=True)
class SysfsEdit:
    kind: FileEdit
    entry: int       # modulo the tree's entries (files and links)
    value: bytes


class FuzzedSysfs:
    """The functional tests' host as a sysfs tree and a libvirt driver on
    it (libvirt's test driver, whose node devices are that host's). Each
    input edits some of the tree's files and links, runs every reader and
    one discovery, and puts the tree back."""

    def __init__(self, directory: Path):
        self.host = Host(directory / "host", "http://127.0.0.1:1")
        self.host.build_default()
        self.host.sys.add_nvidia_vf_layout(
            "0000:84:00.0", "1eb8", 1, VgpuCard({256: "GRID T4-1B", 257: "GRID T4-2B"}),
            num_vfs=2)
        conf = load_config(["--config-file", os.fspath(self.host.write_conf())])
        self.root = Path(self.host.sys.root)
        self.pristine = directory / "pristine"
        shutil.copytree(self.root, self.pristine, symlinks=True)
        self.entries = sorted(
            p.relative_to(self.pristine) for p in self.pristine.rglob("*")
            if p.is_symlink() or p.is_file())
        self.driver = LibvirtDriver(conf)
        self.driver.init_host()

    def _edit(self, edit: SysfsEdit) -> Path:
        relative = self.entries[edit.entry % len(self.entries)]
        path = self.root / relative
        if not os.path.lexists(path):
            return relative  # under a directory an earlier edit removed
        was_link = (self.pristine / relative).is_symlink()
        _remove(path)
        if edit.kind is FileEdit.EMPTY_DIRECTORY:
            path.mkdir()
        elif edit.kind is FileEdit.RETARGET or (edit.kind is FileEdit.WRITE
                                                and was_link):
            # A target the kernel could write: no NUL, at most a name long.
            target = edit.value.replace(b"\0", b"")[:255]
            path.symlink_to(os.fsdecode(target) or ".")
        elif edit.kind is FileEdit.WRITE:
            path.write_bytes(edit.value)
        return relative

    def _restore(self, relatives: set[Path]) -> None:
        # Deepest first, so that a directory edited is whole again before
        # its entries are.
        for relative in sorted(relatives, key=lambda r: -len(r.parts)):
            path = self.root / relative
            while not os.path.lexists(path.parent):
                relative = relative.parent
                path = path.parent
            _remove(path)
            source = self.pristine / relative
            if source.is_symlink() or not source.is_dir():
                shutil.copy2(source, path, follow_symlinks=False)
            else:
                shutil.copytree(source, path, symlinks=True)

    def check(self, edits: list[SysfsEdit]) -> Outcome:
        touched = set()
        try:
            for edit in edits:
                touched.add(self._edit(edit))
            reader = SysfsReader(os.fspath(self.root))
            warnings = []
            for read in (lambda: reader.numa_cells(4), reader.pci_devices,
                         reader.mdev_types, reader.mdevs, reader.nd_namespaces,
                         lambda: pmem.read_namespaces(reader, None)):
                warnings += read()[1]
            # Discovery reads sysfs afresh on a new connection.
            self.driver.cleanup()
            inventory = self.driver.get_host_inventory()
            assert inventory.cpus, inventory
        finally:
            self._restore(touched)
        return Outcome.REFUSED if warnings or inventory.warnings else Outcome.RESULT

    def close(self) -> None:
        self.driver.cleanup()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def sysfs_inputs() -> st.SearchStrategy[list[SysfsEdit]]:
    value = st.one_of(junk_text(xml_safe=False).map(
        lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=64))
    return st.lists(st.builds(SysfsEdit, st.sampled_from(FileEdit),
                              st.integers(0, 1 << 16), value),
                    min_size=1, max_size=6)
