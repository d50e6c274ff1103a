"""The host CPU's feature traits: libvirt's CPU feature names as os-traits
names (pure)."""
from __future__ import annotations

import os_traits

_X86 = "HW_CPU_X86_"
# libvirt's feature names (its cpu_map) whose os-traits name is not simply
# HW_CPU_X86_ and the name upper-cased without '.' and '-'.
_RENAMED = {
    "pni": "HW_CPU_X86_SSE3",
    "pclmuldq": "HW_CPU_X86_CLMUL",
    "fma": "HW_CPU_X86_FMA3",
    "aes": "HW_CPU_X86_AESNI",
    "sha-ni": "HW_CPU_X86_SHA",
    "bmi1": "HW_CPU_X86_BMI",
    "vaes": "HW_CPU_X86_AVX512VAES",
    "gfni": "HW_CPU_X86_AVX512GFNI",
    "vpclmulqdq": "HW_CPU_X86_AVX512VPCLMULQDQ",
    "pcid": "HW_CPU_X86_INTEL_PCID",
    "spec-ctrl": "HW_CPU_X86_INTEL_SPEC_CTRL",
    "ssbd": "HW_CPU_X86_INTEL_SSBD",
    "md-clear": "HW_CPU_X86_INTEL_MD_CLEAR",
    "amd-ssbd": "HW_CPU_X86_AMD_SSBD",
    "virt-ssbd": "HW_CPU_X86_AMD_VIRT_SSBD",
    "amd-no-ssb": "HW_CPU_X86_AMD_NO_SSB",
    "ibpb": "HW_CPU_X86_AMD_IBPB",
}
_STANDARD = frozenset(os_traits.get_traits())

# Every trait cpu_feature_trait can give: the plain names and the renamed.
# Other HW_CPU_X86_* traits (AMD_SEV, INTEL_TDX...) say more than a CPU
# feature; the agent does not report them.
CPU_FEATURE_TRAITS = frozenset(
    t for t in os_traits.get_traits(_X86) if "_" not in t[len(_X86):]
) | frozenset(_RENAMED.values())


def cpu_feature_trait(feature: str) -> str | None:
    """The os-traits name of one libvirt CPU feature ('avx2' ->
    HW_CPU_X86_AVX2); None when os-traits has none."""
    feature = feature.lower()
    trait = _RENAMED.get(feature) or (
        _X86 + feature.upper().replace(".", "").replace("-", ""))
    return trait if trait in _STANDARD else None


def cpu_feature_traits(features: frozenset[str]) -> frozenset[str]:
    return frozenset(t for f in features if (t := cpu_feature_trait(f)) is not None)
