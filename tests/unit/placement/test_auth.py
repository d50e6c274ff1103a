"""The placement_noauth2 auth plugin: the token and the roles a noauth2
Placement trusts, read from [placement] as keystoneauth reads any plugin's
options."""
from __future__ import annotations

from pathlib import Path

import pytest
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from compute_agent import config
from compute_agent.placement.auth import NoAuth2

URL = "http://127.0.0.1:8778"


def plugin_from(tmp_path: Path, placement: str) -> NoAuth2:
    """The auth plugin keystoneauth loads from a config whose [placement]
    section is ``placement``."""
    path = tmp_path / "compute-agent.conf"
    path.write_text(f"[placement]\nauth_type = placement_noauth2\n{placement}")
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf(args=["--config-file", str(path)], default_config_files=[], default_config_dirs=[])
    auth = ks_loading.load_auth_from_conf_options(conf, config.PLACEMENT_GROUP)
    assert isinstance(auth, NoAuth2)
    return auth


def test_a_config_that_names_only_the_endpoint_sends_admin_with_the_service_role(tmp_path):
    auth = plugin_from(tmp_path, f"endpoint = {URL}\n")
    assert auth.get_headers(None) == {"X-Auth-Token": "admin", "X-Roles": "admin,service"}
    assert auth.get_endpoint(None) == URL


def test_the_token_and_roles_a_config_gives_are_sent(tmp_path):
    auth = plugin_from(tmp_path, f"endpoint = {URL}\ntoken = t0k3n\nroles = reader\n")
    assert auth.get_headers(None) == {"X-Auth-Token": "t0k3n", "X-Roles": "reader"}


@pytest.mark.parametrize("token, roles, headers", [
    (None, None, {"X-Auth-Token": "admin", "X-Roles": "admin,service"}),
    ("", "", {"X-Auth-Token": "admin", "X-Roles": "admin,service"}),
    ("t", "r", {"X-Auth-Token": "t", "X-Roles": "r"}),
])
def test_an_unset_token_or_roles_falls_back_to_the_defaults(token, roles, headers):
    assert NoAuth2(URL, token, roles).get_headers(None) == headers


def test_the_entry_points_loader_makes_noauth2_from_three_options():
    loader = ks_loading.get_plugin_loader("placement_noauth2")
    assert loader.plugin_class is NoAuth2
    assert {o.name: o.default for o in loader.get_options()} == {
        "endpoint": None, "token": "admin", "roles": "admin,service"}
