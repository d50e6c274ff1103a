"""Domain XML from a GuestSpec, and the metadata read back from it."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.libvirt.guest_xml import (
    NAMESPACE,
    DomainIdentity,
    build_domain_xml,
    domain_identity,
    parse_metadata,
    vf_mac,
)
from tests.functional.earlier_guests import DERIVED_MAC, NO_MAC, derived_mac, earlier_domain_xml
from tests.functional.nova_host import nova_domain_xml

INSTANCE = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"
NS = {"ca": NAMESPACE}


def full_spec(**overrides) -> GuestSpec:
    fields = dict(instance_uuid=INSTANCE, name="instance-0001", vcpus=4,
                  memory_mb=512, devices=(
                      GuestDevice("a-pci", DeviceKind.PCI, "0000:06:00.0"),
                      GuestDevice("a-vf", DeviceKind.VF, "0000:81:10.1"),
                      GuestDevice("a-mdev", DeviceKind.MDEV, MDEV,
                                  detail=DeviceDetail(mdev_parent="0000:07:00.0",
                                                      mdev_type="nvidia-35")),
                      GuestDevice("a-pmem", DeviceKind.PMEM, "ns0",
                                  detail=DeviceDetail(size_bytes=(1 << 30) + 4096,
                                                      dev_path="/dev/dax0.0")),
                      GuestDevice("a-pcpu", DeviceKind.PCPU, "pcpus",
                                  amount=2, cpus=frozenset({9, 3})),
                      GuestDevice("a-numa", DeviceKind.NUMA, "1")))
    fields.update(overrides)
    return GuestSpec(**fields)


def one(root, path):
    found = root.xpath(path, namespaces=NS)
    assert len(found) == 1, (path, found)
    return found[0]


def test_domain_basics():
    root = etree.fromstring(build_domain_xml(full_spec(devices=())))
    assert root.get("type") == "kvm"
    # Named by the uuid, so two instances of one name can share a host.
    assert one(root, "/domain/name/text()") == f"instance-{INSTANCE}"
    assert one(root, "/domain/title/text()") == "instance-0001"
    one(root, "/domain/features/acpi")  # an nvdimm needs it
    assert one(root, "/domain/uuid/text()") == INSTANCE
    assert one(root, "/domain/memory[@unit='KiB']/text()") == "524288"
    assert one(root, "/domain/currentMemory[@unit='KiB']/text()") == "524288"
    assert one(root, "/domain/vcpu/text()") == "4"
    assert one(root, "/domain/os/type/text()") == "hvm"
    one(root, "/domain/os/boot[@dev='network']")
    one(root, "/domain/devices/memballoon[@model='none']")
    assert root.xpath("//disk | //maxMemory | //cputune | //numatune") == []


def test_every_device_kind():
    root = etree.fromstring(build_domain_xml(full_spec(), "qemu"))
    assert root.get("type") == "qemu"
    pci = one(root, "/domain/devices/hostdev[@mode='subsystem' and "
                    "@type='pci' and @managed='yes']/source/address")
    assert dict(pci.attrib) == {"domain": "0x0000", "bus": "0x06",
                                "slot": "0x00", "function": "0x0"}
    vf = one(root, "/domain/devices/interface[@type='hostdev' and "
                   "@managed='yes']/source/address")
    assert dict(vf.attrib) == {"type": "pci", "domain": "0x0000",
                               "bus": "0x81", "slot": "0x10",
                               "function": "0x1"}
    one(root, f"/domain/devices/hostdev[@mode='subsystem' and @type='mdev' "
              f"and @model='vfio-pci']/source/address[@uuid='{MDEV}']")

    nvdimm = one(root, "/domain/devices/memory[@model='nvdimm' and "
                       "@access='shared']")
    assert one(nvdimm, "source/path/text()") == "/dev/dax0.0"
    # Rounded down to the devdax alignment, in KiB.
    assert one(nvdimm, "target/size[@unit='KiB']/text()") == "1048576"
    assert one(nvdimm, "target/node/text()") == "0"
    cell = one(root, "/domain/cpu/numa/cell")
    assert (cell.get("id"), cell.get("cpus"), cell.get("memory"),
            cell.get("unit")) == ("0", "0-3", "524288", "KiB")
    max_memory = one(root, "/domain/maxMemory")
    assert (max_memory.get("slots"), max_memory.get("unit"),
            max_memory.text) == ("1", "KiB", str(524288 + 1048576))
    assert one(root, "/domain/memory/text()") == str(524288 + 1048576)
    assert one(root, "/domain/currentMemory/text()") == "524288"

    pins = root.xpath("/domain/cputune/vcpupin")
    assert [(p.get("vcpu"), p.get("cpuset")) for p in pins] == [
        ("0", "3"), ("1", "9")]
    one(root, "/domain/numatune/memory[@mode='strict' and @nodeset='1']")

    assignments = root.xpath("/domain/metadata/ca:instance[@uuid=$u]/"
                             "ca:assignment", namespaces=NS, u=INSTANCE)
    assert {(a.get("id"), a.get("kind"), a.get("device"))
            for a in assignments} == {
        ("a-pci", "pci", "0000:06:00.0"), ("a-vf", "vf", "0000:81:10.1"),
        ("a-mdev", "mdev", MDEV), ("a-pmem", "pmem", "ns0"),
        ("a-pcpu", "pcpu", "pcpus"), ("a-numa", "numa", "1")}


def test_round_trip():
    text = build_domain_xml(full_spec())
    assert parse_metadata(text) == (INSTANCE, frozenset(
        {"a-pci", "a-vf", "a-mdev", "a-pmem", "a-pcpu", "a-numa"}))
    assert parse_metadata(build_domain_xml(full_spec(devices=()))) == (
        INSTANCE, frozenset())


def test_mdev_model_from_device_api():
    root = etree.fromstring(build_domain_xml(
        full_spec(), mdev_models={MDEV: "vfio-ccw"}))
    one(root, "//hostdev[@type='mdev' and @model='vfio-ccw']")
    with pytest.raises(ValueError, match="device_api"):
        build_domain_xml(full_spec(), mdev_models={MDEV: "junk"})


def test_several_cells_and_pmems():
    spec = full_spec(devices=(
        GuestDevice("n0", DeviceKind.NUMA, "0"),
        GuestDevice("n1", DeviceKind.NUMA, "2"),
        GuestDevice("p0", DeviceKind.PMEM, "ns0", detail=DeviceDetail(
            size_bytes=1 << 21, dev_path="/dev/dax0.0")),
        GuestDevice("p1", DeviceKind.PMEM, "ns1", detail=DeviceDetail(
            size_bytes=3 << 20, dev_path="/tmp/backing"))))
    root = etree.fromstring(build_domain_xml(spec))
    one(root, "/domain/numatune/memory[@nodeset='0,2']")
    assert one(root, "/domain/maxMemory/@slots") == "2"
    # A file-backed nvdimm keeps its exact size and is not marked pmem.
    assert root.xpath("//memory[@model='nvdimm']/target/size/text()") == [
        "2048", "3072"]
    assert len(root.xpath("//memory[@model='nvdimm']/source/pmem")) == 1


@pytest.mark.parametrize("spec, match", [
    (full_spec(vcpus=1), "pinned CPUs"),
    (full_spec(vcpus=0), "at least one vCPU"),
    (full_spec(devices=(GuestDevice("x", DeviceKind.VF, "81:10.1"),)),
     "not a PCI address"),
    (full_spec(devices=(GuestDevice("x", DeviceKind.PMEM, "ns0", detail=DeviceDetail(
        size_bytes=1 << 30)),)), "device path"),
    (full_spec(devices=(GuestDevice("x", DeviceKind.PMEM, "ns0", detail=DeviceDetail(
        dev_path="/dev/dax0.0")),)), "no size"),
    (full_spec(devices=(GuestDevice("x", DeviceKind.PMEM, "ns0", detail=DeviceDetail(
        size_bytes=1 << 20, dev_path="/dev/dax0.0")),)), "too small"),
    (full_spec(devices=(GuestDevice("x", DeviceKind.MDEV, "nope"),)),
     "UUID"),
])
def test_bad_specs_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        build_domain_xml(spec)


@pytest.mark.parametrize("text", [
    "<domain type='test'><name>test</name></domain>",
    "<domain><metadata><ca:instance xmlns:ca='http://example.org/other' "
    f"uuid='{INSTANCE}'/></metadata></domain>",
    f"<domain><metadata><ca:instance xmlns:ca='{NAMESPACE}' uuid='junk'>"
    "<ca:assignment id='a'/></ca:instance></metadata></domain>",
    f"<domain><metadata><ca:instance xmlns:ca='{NAMESPACE}'/></metadata>"
    "</domain>",
    f"<network><metadata><ca:instance xmlns:ca='{NAMESPACE}' "
    f"uuid='{INSTANCE}'/></metadata></network>",
])
def test_not_ours(text):
    assert parse_metadata(text) == (None, frozenset())


def test_assignments_without_id_are_skipped():
    text = (f"<domain><metadata><x:instance xmlns:x='{NAMESPACE}' "
            f"uuid='{INSTANCE.upper()}'><x:assignment id='a'/>"
            "<x:assignment/><x:assignment id='  '/><x:other id='b'/>"
            "</x:instance></metadata></domain>")
    assert parse_metadata(text) == (INSTANCE, frozenset({"a"}))


@pytest.mark.parametrize("text", ["", "<domain>", "not xml", "<a></b>",
                                  None, b"\xff\xfe<"])
def test_unparsable_raises_declared_error(text):
    with pytest.raises(InvalidHostData):
        parse_metadata(text)


_ID = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e),
              min_size=1, max_size=12)
_JUNK = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)


def _junk_metadata():
    """Our element with generated attributes and children."""
    attrs = st.dictionaries(st.sampled_from(["uuid", "id", "kind", "device"]),
                            st.one_of(_JUNK, st.just(INSTANCE)), max_size=3)
    child = st.builds(lambda tag, at: etree.Element(f"{{{NAMESPACE}}}{tag}",
                                                    _clean(at)),
                      st.sampled_from(["assignment", "instance", "x"]), attrs)
    return st.builds(_metadata_doc, attrs, st.lists(child, max_size=4),
                     st.sampled_from(["domain", "metadata", "x"]))


def _clean(attrs):
    # lxml refuses control characters in attribute values; the parser under
    # test is fed those through the raw-text strategies instead.
    return {k: "".join(c for c in v if c.isprintable()) for k, v in
            attrs.items()}


def _metadata_doc(attrs, children, root_tag):
    root = etree.Element(root_tag)
    instance = etree.SubElement(etree.SubElement(root, "metadata"),
                                f"{{{NAMESPACE}}}instance", _clean(attrs))
    instance.extend(children)
    return etree.tostring(root, encoding="unicode")


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=300), st.binary(max_size=200),
    _junk_metadata(),
    st.tuples(st.sampled_from([build_domain_xml(full_spec())]),
              st.integers(0, 3000), st.integers(0, 3000), _JUNK).map(
        lambda t: t[0][:t[1]] + t[3] + t[0][t[1] + t[2] % 40:])))
def test_parse_metadata_junk(text):
    try:
        instance_uuid, ids = parse_metadata(text)
    except InvalidHostData:
        return
    assert instance_uuid is None or isinstance(instance_uuid, str)
    assert isinstance(ids, frozenset)
    assert all(isinstance(i, str) and i for i in ids)


@settings(max_examples=100, deadline=None)
@given(st.uuids().map(str), st.lists(_ID, max_size=8, unique=True))
def test_round_trip_generated(instance_uuid, ids):
    devices = tuple(GuestDevice(i, DeviceKind.NUMA, "0") for i in ids)
    text = build_domain_xml(GuestSpec(instance_uuid, "g", 1, 64, devices))
    assert parse_metadata(text) == (instance_uuid, frozenset(ids))


# --- the identity a guest keeps when it is defined again ---------------------------

def test_an_earlier_versions_domain_is_known_by_its_name_and_vf_mac():
    spec = full_spec(name="web")
    assert domain_identity(earlier_domain_xml(spec, DERIVED_MAC)) == DomainIdentity(
        "web", {"a-vf": derived_mac("a-vf")})
    # d1b250d wrote no MAC (libvirt draws one when it defines the domain).
    assert domain_identity(earlier_domain_xml(spec, NO_MAC)) == DomainIdentity("web", {})


def test_a_vf_mac_is_the_one_of_the_device_its_assignment_names():
    text = build_domain_xml(full_spec(), identity=DomainIdentity(
        "web", {"a-vf": "52:54:00:aa:bb:cc"}))
    text = text.replace("0x81", "0x82", 1)  # the interface on another VF
    root = etree.fromstring(text)
    assert root.xpath("//interface/source/address/@bus") == ["0x82"]
    assert domain_identity(text) == DomainIdentity("web", {})


def test_a_domain_of_novas_keeps_its_name_and_has_no_vf_of_ours():
    text = nova_domain_xml(INSTANCE, 10, "web", 2, 64)
    assert domain_identity(text) == DomainIdentity("instance-0000000a", {})


def test_a_domain_without_a_name_is_refused_naming_the_field():
    text = build_domain_xml(full_spec()).replace(f"<name>instance-{INSTANCE}</name>", "")
    with pytest.raises(InvalidHostData, match=f"{INSTANCE}.*name"):
        domain_identity(text)


def test_a_guest_defined_again_keeps_its_identity_and_new_vfs_get_derived_macs():
    devices = full_spec().devices + (GuestDevice("b-vf", DeviceKind.VF, "0000:81:10.2"),)
    root = etree.fromstring(build_domain_xml(
        full_spec(name="web", devices=devices),
        identity=DomainIdentity("web", {"a-vf": "52:54:00:aa:bb:cc", "gone": "x"})))
    assert one(root, "/domain/name/text()") == "web"
    assert one(root, "/domain/title/text()") == "web"
    assert root.xpath("//interface/mac/@address") == ["52:54:00:aa:bb:cc", vf_mac("b-vf")]
