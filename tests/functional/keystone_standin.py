"""A stand-in for Keystone's identity v3 API, as much of it as keystoneauth's
``password`` plugin uses: version discovery (``GET /v3``) and token issue
(``POST /v3/auth/tokens``), whose catalog names the test's real Placement.

There is no Keystone package to run here; this is the smallest honest
server that lets a test take Keystone away (``refuse``: 401, as for a wrong
password) and give it back, in front of a real Placement in noauth2 mode
(the token it issues is ``admin``, which noauth2 accepts).
"""
from __future__ import annotations

import datetime
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "admin"


def token_body(placement_url: str) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp = "%Y-%m-%dT%H:%M:%S.000000Z"
    domain = {"id": "default", "name": "Default"}
    return {"token": {
        "methods": ["password"],
        "issued_at": now.strftime(stamp),
        "expires_at": (now + datetime.timedelta(hours=1)).strftime(stamp),
        "user": {"id": "agent-user", "name": "compute-agent", "domain": domain},
        "project": {"id": "service-project", "name": "service", "domain": domain},
        "roles": [{"id": "service-role", "name": "service"}],
        "catalog": [{"type": "placement", "name": "placement", "id": "placement-svc",
                     "endpoints": [{"id": "placement-public", "interface": "public",
                                    "region": "RegionOne", "region_id": "RegionOne",
                                    "url": placement_url}]}],
    }}


class KeystoneStandin:
    """Serves on 127.0.0.1:``port``; ``refuse`` makes token requests
    answer 401. ``auth_url`` is what the agent's config names."""

    def __init__(self, port: int, placement_url: str):
        self.refuse = False
        self.token_requests = 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: dict, headers=()) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") != "/v3":
                    return self._answer(404, {"error": {"code": 404}})
                self._answer(200, {"version": {
                    "id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
                    "links": [{"rel": "self", "href": standin.auth_url + "/"}],
                    "media-types": [{"base": "application/json",
                                     "type": "application/vnd.openstack.identity-v3+json"}]}})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                standin.token_requests += 1
                if self.path != "/v3/auth/tokens":
                    return self._answer(404, {"error": {"code": 404}})
                if standin.refuse:
                    return self._answer(401, {"error": {
                        "code": 401, "title": "Unauthorized",
                        "message": "The request you have made requires authentication."}})
                self._answer(201, token_body(placement_url),
                             [("X-Subject-Token", TOKEN)])

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.auth_url = f"http://127.0.0.1:{self.server.server_port}/v3"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> KeystoneStandin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
