"""A keystoneauth1 plugin for a Placement that runs with
``auth_strategy = noauth2`` (development, demos, tests).

Such a Placement trusts the ``X-Auth-Token`` and ``X-Roles`` headers. The
stock ``admin_token`` plugin sends the token but no roles, and reshaping
needs the ``service`` role, so this plugin sends both:

    [placement]
    auth_type = placement_noauth2
    endpoint = http://127.0.0.1:8778

Never use it against a Placement that has real Keystone in front of it.
"""
from __future__ import annotations

from keystoneauth1 import loading, token_endpoint


class NoAuth2(token_endpoint.Token):
    # keystoneauth passes None for an option the config leaves unset: its
    # oslo.config mapping drops the loader's defaults.
    def __init__(self, endpoint: str, token: str | None = None,
                 roles: str | None = None):
        super().__init__(endpoint, token or "admin")
        self.roles = roles or "admin,service"

    def get_headers(self, session, **kwargs):
        return {"X-Auth-Token": self.token, "X-Roles": self.roles}


class NoAuth2Loader(loading.BaseLoader):
    @property
    def plugin_class(self):
        return NoAuth2

    def get_options(self):
        return [
            loading.Opt("endpoint", help="Placement's URL."),
            loading.Opt("token", default="admin",
                        help="Token that noauth2 accepts."),
            loading.Opt("roles", default="admin,service",
                        help="Roles sent in X-Roles."),
        ]
