"""Short load: 64 concurrent callers building and deleting against one
agent daemon (the long run: tools/reliability_cases/load.py)."""
from __future__ import annotations

from tests.reliability.load import run_load

# Past the warm-up, the daemon's thread pool and broker connections are
# filled: what still grows in a few seconds of steady load is a leak.
MAX_RSS_GROWTH_KIB = 32 * 1024
# On a loaded machine the RPC executors' pools (the claims' and the
# heartbeat's, up to oslo.messaging's executor_thread_pool_size, 64, each)
# may still be filling after the warm-up: a few dozen threads at most, each
# with its descriptors (18 seen once, with a claim now listing the guests
# first). A leak per call would be a thousand over the run.
MAX_THREAD_GROWTH = 32
MAX_FD_GROWTH = 24


def test_64_callers_build_and_delete_without_errors_or_growth(tmp_path, placement,
                                                              services):
    figures = run_load(tmp_path, placement.url, seconds=10, callers=64, warmup=3)
    print(figures.as_dict())
    assert figures.errors == [] and figures.alive
    assert figures.calls >= 100, figures.as_dict()
    growth = figures.growth()
    assert growth.rss_kib <= MAX_RSS_GROWTH_KIB, figures.as_dict()
    assert growth.threads <= MAX_THREAD_GROWTH, figures.as_dict()
    assert growth.fds <= MAX_FD_GROWTH, figures.as_dict()
