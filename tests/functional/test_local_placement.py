"""The Placement the tests and benchmarks start, with several serving
processes: every request served is logged once, and stop() ends them all."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests

from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.helpers import HEADERS, wait_for


def children_of(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def test_several_processes_serve_and_the_request_log_stays_exact(tmp_path):
    placement = LocalPlacement(tmp_path, workers=3).start()
    try:
        workers = children_of(placement.proc.pid)
        assert len(workers) == 2
        mark = placement.mark()
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(
                lambda i: requests.get(f"{placement.url}/traits?name=startswith:HW_",
                                       headers=HEADERS, timeout=30).status_code,
                range(120)))
        assert codes == [200] * 120
        sent = placement.requests_since(mark)
        assert len(sent) == 120
        assert set(sent) == {"GET /traits?name=startswith:HW_ 200"}
    finally:
        placement.stop()
    wait_for(lambda: not any(running(pid) for pid in workers), timeout=10)


def running(pid: int) -> bool:
    """Alive, and not just waiting to be reaped."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
