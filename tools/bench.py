"""Benchmarks: run every case (or those named) and print one JSON object per
measurement. Figures are medians over several runs; the machine is shared."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("placement_loop", "reconcile_loop", "libvirt_discovery", "claims", "rpc", "heal",
         "device_health", "live_migration", "evacuation", "stop", "guest_holdings",
         "store_check", "store_migration", "hotplug", "reboot_restore", "gpu_candidates")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"any of {', '.join(CASES)} (default: all)")
    args = parser.parse_args()
    unknown = set(args.cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case {sorted(unknown)[0]!r}; known: {', '.join(CASES)}")
    for case in args.cases or CASES:
        module = importlib.import_module(f"tools.benchmarks.{case}")
        with tempfile.TemporaryDirectory(prefix=f"bench-{case}-") as tmp:
            results = module.run(Path(tmp))
        for result in results if isinstance(results, list) else [results]:
            print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
