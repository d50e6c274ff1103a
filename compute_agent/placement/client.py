"""The Placement client: one method per Placement call the agent makes.

It speaks through a keystoneauth1 adapter, negotiates the microversion once,
and turns every failure into one of four typed errors: KeystoneUnavailable
(with a Keystone auth plugin: Keystone did not answer, refused the
credentials or has no Placement endpoint), PlacementUnavailable (no answer
or 5xx: give up this cycle), GenerationConflict (409 concurrent_update:
re-read and retry) and PlacementError (anything else). Each unavailable
error is one short line naming the service, its URL and the cause.

Keystone is told apart from Placement by asking in two steps: first the
endpoint (with a Keystone plugin this authenticates and reads the
catalog; the plugin caches the token), then the request itself.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from keystoneauth1.adapter import Adapter
from oslo_config import cfg

from compute_agent.config import PLACEMENT_GROUP
from compute_agent.exception import (
    GenerationConflict,
    KeystoneUnavailable,
    PlacementError,
    PlacementUnavailable,
)
from compute_agent.metrics import Metrics
from compute_agent.tree.provider_tree import Inventory

LOG = logging.getLogger(__name__)

# 1.20: POST /resource_providers answers with the provider. 1.30: reshaper.
# 1.37: a provider's parent may change, which every switch of tree mode
# needs (a device's provider moves between the root and its NUMA cell).
MIN_VERSION = (1, 37)
MAX_VERSION = (1, 39)
# Each request's timeout when [placement] timeout is not set.
DEFAULT_TIMEOUT_SECONDS = 30


def _version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def adapter_from_conf(conf: cfg.ConfigOpts) -> Adapter:
    auth = ks_loading.load_auth_from_conf_options(conf, PLACEMENT_GROUP)
    session = ks_loading.load_session_from_conf_options(
        conf, PLACEMENT_GROUP, auth=auth)
    return ks_loading.load_adapter_from_conf_options(
        conf, PLACEMENT_GROUP, session=session, auth=auth)


# "[Errno 111] Connection refused" inside urllib3's long message.
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


def connection_problem(error: ks_exc.ClientException) -> str:
    """What went wrong reaching a server, in a few words: the system's
    reason (connection refused, name not known) rather than urllib3's
    nest of wrappers."""
    if isinstance(error, (ks_exc.ConnectTimeout, ks_exc.RequestTimeout)):
        return "did not answer (timed out)"
    if isinstance(error, ks_exc.SSLError):
        return f"did not answer (TLS: {error})"
    text = str(error)
    found = _ERRNO.search(text)
    if found:
        return f"did not answer ({found.group(1).strip().lower()})"
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "did not answer (connection closed)"
    # keystoneauth's "Unable to establish connection to URL: ": the URL is
    # said already.
    return f"did not answer ({type(error).__name__}: {text.split(': ', 1)[-1]})"


def keystone_problem(error: ks_exc.ClientException) -> str:
    """Why Keystone gave no token or no Placement endpoint."""
    if isinstance(error, ks_exc.Unauthorized):
        return "refused the credentials (401): check [placement] username, password and domains"
    if isinstance(error, ks_exc.EndpointNotFound):
        return "has no Placement endpoint in its catalog for [placement] service_type, " \
               "valid_interfaces and region_name"
    if isinstance(error, ks_exc.HttpError):
        return f"answered {error.http_status}: {error.message}"
    if isinstance(error, (ks_exc.ConnectionError, ks_exc.RequestTimeout)):
        return connection_problem(error)
    if isinstance(error, ks_exc.DiscoveryFailure):
        return f"found no identity API version: {error}"
    return f"failed: {type(error).__name__}: {error}"


class _DiscoveryWarning(logging.Filter):
    """keystoneauth warns that it could not discover Keystone's versions at
    every attempt while Keystone is away; the KeystoneUnavailable that
    follows says so once (compute_agent/dependencies.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to discover available identity")


logging.getLogger("keystoneauth.identity.generic.base").addFilter(_DiscoveryWarning())


def keystone_url(adapter: Adapter) -> str | None:
    """The auth plugin's Keystone URL; None when it does not use Keystone
    (a token-and-endpoint plugin such as placement_noauth2)."""
    return getattr(adapter.auth or adapter.session.auth, "auth_url", None)


class PlacementClient:
    def __init__(self, adapter: Adapter, metrics: Metrics | None = None) -> None:
        self.adapter = adapter
        self.version: str | None = None
        self.keystone_url = keystone_url(adapter)
        # Placement's URL once known (from the config or the catalog).
        self.url = adapter.endpoint_override or ""
        # Every request is counted here, by method and status.
        self.metrics = metrics or Metrics()

    @property
    def requests_sent(self) -> int:
        """Every request sent, answered or not (compute-agent --once says
        it): the metrics' count, this client's own as long as no other
        client shares its Metrics (an agent's does not)."""
        return self.metrics.placement_requests_sent()

    # --- plumbing -------------------------------------------------------

    def endpoint(self) -> str:
        """Placement's URL. With a Keystone plugin this is where Keystone is
        asked (a token, the catalog), so its failures are told apart here.
        Raises KeystoneUnavailable."""
        try:
            found = self.adapter.get_endpoint()
        except ks_exc.ClientException as e:
            raise KeystoneUnavailable(self.keystone_url or "", keystone_problem(e)) from None
        if not found:
            raise KeystoneUnavailable(self.keystone_url or "",
                                      keystone_problem(ks_exc.EndpointNotFound()))
        self.url = found.rstrip("/")
        return self.url

    def _call(self, method: str, url: str, body: object = None,
              expected: tuple[int, ...] = (200,)) -> Any:
        if self.version is None and url != "/":
            self.negotiate()
        kwargs: dict[str, Any] = {"raise_exc": False}
        if body is not None:
            kwargs["json"] = body
        if url != "/":
            kwargs["microversion"] = self.version
        self.endpoint()
        started = time.monotonic()
        try:
            resp = self.adapter.request(url, method, **kwargs)
        except ks_exc.HttpError as e:
            # Not Placement's answer (raise_exc is off): Keystone's, when the
            # session authenticated again (an expired or revoked token).
            raise KeystoneUnavailable(self.keystone_url or "", keystone_problem(e)) from None
        except ks_exc.ClientException as e:
            self.metrics.placement_request(method, None, time.monotonic() - started)
            LOG.debug("%s %s: %s: %s", method, url, type(e).__name__, e)
            raise PlacementUnavailable(self.url, connection_problem(e)) from None
        self.metrics.placement_request(method, resp.status_code, time.monotonic() - started)
        if resp.status_code in expected:
            return resp.json() if resp.content else None
        code, detail = _error_of(resp)
        if resp.status_code >= 500:
            raise PlacementUnavailable(
                self.url, f"answered {resp.status_code} to {method} {url}: {detail}")
        if resp.status_code == 409 and code == "placement.concurrent_update":
            raise GenerationConflict(f"{method} {url}: {detail}", 409, code)
        raise PlacementError(f"Placement answered {resp.status_code} to "
                             f"{method} {url}: {detail}", resp.status_code, code)

    def negotiate(self) -> str:
        doc = self._call("GET", "/")
        server_max = max(_version_tuple(v["max_version"]) for v in doc["versions"])
        if server_max < MIN_VERSION:
            raise PlacementError("Placement's newest microversion is "
                                 f"{server_max[0]}.{server_max[1]}; the agent "
                                 f"needs {MIN_VERSION[0]}.{MIN_VERSION[1]}")
        chosen = min(server_max, MAX_VERSION)
        self.version = f"{chosen[0]}.{chosen[1]}"
        LOG.debug("Placement microversion %s", self.version)
        return self.version

    # --- providers ------------------------------------------------------

    def get_tree(self, root_uuid: str) -> list[dict]:
        return self._call("GET", f"/resource_providers?in_tree={root_uuid}"
                          )["resource_providers"]

    def create_provider(self, uuid: str, name: str, parent_uuid: str | None) -> int:
        body = {"uuid": uuid, "name": name}
        if parent_uuid:
            body["parent_provider_uuid"] = parent_uuid
        return self._call("POST", "/resource_providers", body)["generation"]

    def update_provider(self, uuid: str, name: str, parent_uuid: str | None) -> int:
        return self._call("PUT", f"/resource_providers/{uuid}",
                          {"name": name, "parent_provider_uuid": parent_uuid}
                          )["generation"]

    def delete_provider(self, uuid: str) -> None:
        self._call("DELETE", f"/resource_providers/{uuid}", expected=(204,))

    def get_inventories(self, uuid: str) -> tuple[int, dict]:
        doc = self._call("GET", f"/resource_providers/{uuid}/inventories")
        return doc["resource_provider_generation"], doc["inventories"]

    # The generation as the caller's tree holds it: None is sent as null.

    def set_inventories(self, uuid: str, generation: int | None,
                        inventories: Mapping[str, Inventory]) -> int:
        return self._call("PUT", f"/resource_providers/{uuid}/inventories",
                          {"resource_provider_generation": generation,
                           "inventories": inventories}
                          )["resource_provider_generation"]

    def get_traits(self, uuid: str) -> tuple[int, frozenset[str]]:
        doc = self._call("GET", f"/resource_providers/{uuid}/traits")
        return doc["resource_provider_generation"], frozenset(doc["traits"])

    def set_traits(self, uuid: str, generation: int | None, traits: Iterable[str]) -> int:
        return self._call("PUT", f"/resource_providers/{uuid}/traits",
                          {"resource_provider_generation": generation,
                           "traits": sorted(traits)}
                          )["resource_provider_generation"]

    def set_aggregates(self, uuid: str, generation: int | None, aggregates: Iterable[str]) -> int:
        return self._call("PUT", f"/resource_providers/{uuid}/aggregates",
                          {"resource_provider_generation": generation,
                           "aggregates": sorted(aggregates)}
                          )["resource_provider_generation"]

    def reshape(self, inventories: Mapping[str, tuple[int | None, Mapping[str, Inventory]]],
                allocations: dict | None = None) -> None:
        """Set many providers' inventories (and move allocations) in one
        atomic call. Generations must be re-read afterwards: Placement
        does not return them."""
        self._call("POST", "/reshaper", {
            "inventories": {u: {"resource_provider_generation": g,
                                "inventories": inv}
                            for u, (g, inv) in inventories.items()},
            "allocations": allocations or {},
        }, expected=(204,))

    def get_provider_allocations(self, uuid: str) -> dict[str, dict]:
        """consumer uuid -> {"resources": {class: amount}}"""
        return self._call("GET", f"/resource_providers/{uuid}/allocations"
                          )["allocations"]

    # --- consumers (the conductor's side) --------------------------------

    def get_consumer_allocations(self, consumer: str) -> dict:
        return self._call("GET", f"/allocations/{consumer}")

    def post_allocations(self, body: dict) -> None:
        """Several consumers' allocations, all or nothing."""
        self._call("POST", "/allocations", body, expected=(204,))

    def delete_consumer_allocations(self, consumer: str) -> None:
        """Every allocation of ``consumer``; one that has none is no error."""
        self._call("DELETE", f"/allocations/{consumer}", expected=(204, 404))

    def get_providers(self, **query: str) -> list[dict[str, Any]]:
        """GET /resource_providers with ``query`` (name=, required=, ...)."""
        params = "&".join(f"{k}={v}" for k, v in sorted(query.items()))
        return self._call("GET", "/resource_providers" + (f"?{params}" if params else "")
                          )["resource_providers"]

    def get_roots_named(self, name: str) -> list[str]:
        """The UUIDs of the root providers named ``name``: none or one,
        since Placement's names are unique."""
        rows = self._call("GET", "/resource_providers?name=" + quote(name, safe="")
                          )["resource_providers"]
        return [r["uuid"] for r in rows if r["uuid"] == r["root_provider_uuid"]]

    def get_allocation_candidates(self, query: list[tuple[str, str]]) -> dict:
        """GET /allocation_candidates; ``query`` in order, values as they are
        (resource strings and uuids need no quoting)."""
        return self._call("GET", "/allocation_candidates?"
                          + "&".join(f"{k}={v}" for k, v in query))

    # --- names ----------------------------------------------------------

    def ensure_resource_class(self, name: str) -> None:
        self._call("PUT", f"/resource_classes/{name}", expected=(201, 204))

    def ensure_trait(self, name: str) -> None:
        self._call("PUT", f"/traits/{name}", expected=(201, 204))


def _error_of(resp) -> tuple[str | None, str]:
    try:
        err = resp.json()["errors"][0]
        return err.get("code"), " ".join(err.get("detail", "").split())
    except (ValueError, KeyError, IndexError, TypeError):
        return None, resp.text[:200]
