"""The operator's policy read from a config file: nova's option names are
accepted, bad values are refused naming the option."""
import pytest

from agent.cmd.common import load_config
from agent.exception import ConfigError
from agent.policy import tree_policy_from_conf

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"


def policy_from(tmp_path, text: str):
    path = tmp_path / "agent.conf"
    path.write_text(text)
    return tree_policy_from_conf(load_config(["--config-file", str(path)]), ROOT)


def test_the_owner_trait_defaults_to_nova_s(tmp_path):
    assert policy_from(tmp_path, "[DEFAULT]\n").owner_trait == "OWNER_NOVA"


@pytest.mark.parametrize("value", ["OWNER_CYBORG", "CUSTOM_OWNER_ME"])
def test_an_owner_trait_of_os_traits_or_custom_is_taken(tmp_path, value):
    assert policy_from(tmp_path, f"[DEFAULT]\nowner_trait = {value}\n").owner_trait == value


@pytest.mark.parametrize("value", ["owner_nova", "OWNER_ME", "CUSTOM_my-owner",
                                   "COMPUTE_NODE"])
def test_a_bad_owner_trait_is_refused_naming_the_option(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        policy_from(tmp_path, f"[DEFAULT]\nowner_trait = {value}\n")
    assert "[DEFAULT] owner_trait" in str(err.value) and value in str(err.value)
