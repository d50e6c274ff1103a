"""PCI devices in a domain past ffff, in the kernel's sysfs layout: the
devices behind an Intel VMD controller sit in domain 10000 and up, in a
directory named pci10000:e0 under the controller itself."""
import os
from pathlib import Path

from compute_agent.drivers.base import PciKind
from compute_agent.drivers.libvirt.sysfs import SysfsReader

VMD_BRIDGE = "devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:06.0"


def add_device(root: Path, address: str, vendor: str, product: str,
               physfn: str | None = None) -> Path:
    """A device directory with the files sysfs gives every PCI function,
    and its link in bus/pci/devices."""
    path = root / VMD_BRIDGE / address
    path.mkdir(parents=True)
    for name, text in (("vendor", f"0x{vendor}"), ("device", f"0x{product}"),
                       ("class", "0x020000"), ("numa_node", "0")):
        (path / name).write_text(text + "\n")
    link = root / "bus" / "pci" / "devices" / address
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(path, link.parent))
    if physfn:
        (path / "physfn").symlink_to(f"../{physfn}")
        (root / VMD_BRIDGE / physfn / "virtfn0").symlink_to(f"../{address}")
    return path


def test_pf_and_vf_in_a_domain_past_ffff(tmp_path):
    pf_dir = add_device(tmp_path, "10000:e1:00.0", "8086", "1572")
    (pf_dir / "sriov_totalvfs").write_text("4\n")
    (pf_dir / "sriov_numvfs").write_text("1\n")
    add_device(tmp_path, "10000:e1:02.0", "8086", "154c",
               physfn="10000:e1:00.0")
    devices, warnings = SysfsReader(str(tmp_path)).pci_devices()
    assert warnings == []
    assert sorted(devices) == ["10000:e1:00.0", "10000:e1:02.0"]
    assert devices["10000:e1:00.0"].kind is PciKind.PF
    vf = devices["10000:e1:02.0"]
    assert (vf.kind, vf.parent_address) == (PciKind.VF, "10000:e1:00.0")
