"""libvirt's CPU feature names as os-traits names."""
from compute_agent.tree.cpu_traits import CPU_FEATURE_TRAITS, cpu_feature_trait, cpu_feature_traits


def test_plain_feature_names_map_upper_cased():
    assert cpu_feature_trait("avx2") == "HW_CPU_X86_AVX2"
    assert cpu_feature_trait("sse4.2") == "HW_CPU_X86_SSE42"
    assert cpu_feature_trait("avx512-vpopcntdq") == "HW_CPU_X86_AVX512VPOPCNTDQ"
    assert cpu_feature_trait("amx-bf16") == "HW_CPU_X86_AMXBF16"


def test_features_libvirt_names_otherwise_map_to_the_os_traits_name():
    assert cpu_feature_trait("pni") == "HW_CPU_X86_SSE3"
    assert cpu_feature_trait("pclmuldq") == "HW_CPU_X86_CLMUL"
    assert cpu_feature_trait("fma") == "HW_CPU_X86_FMA3"
    assert cpu_feature_trait("aes") == "HW_CPU_X86_AESNI"
    assert cpu_feature_trait("md-clear") == "HW_CPU_X86_INTEL_MD_CLEAR"


def test_features_without_an_os_traits_name_give_none():
    assert cpu_feature_trait("ds") is None
    assert cpu_feature_trait("tsc-deadline") is None
    assert cpu_feature_traits(frozenset({"ds", "vmx", "avx2"})) == {
        "HW_CPU_X86_VMX", "HW_CPU_X86_AVX2"}


def test_every_trait_the_mapping_gives_is_in_the_family_the_agent_owns():
    assert cpu_feature_trait("ibpb") in CPU_FEATURE_TRAITS
    assert "HW_CPU_X86_AMD_SEV" not in CPU_FEATURE_TRAITS
    assert "HW_CPU_X86_INTEL_TDX" not in CPU_FEATURE_TRAITS
