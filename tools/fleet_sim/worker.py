"""One process of the fleet: its agents, driven by JSON lines on stdin,
one JSON answer a line on stdout.

    python -m tools.fleet_sim.worker CONF...

Commands: {"cmd": "start"|"restart"} (answered at once; the work goes on
in a thread: "wait" answers when it is done), "stop", "status",
"build_half", "wait", "exit"; and for one host, answered by the process
that has it ({"here": false} by the others): {"cmd": "stop_host"|
"start_host", "host": NAME}, {"cmd": "build_small", "host": NAME,
"placement_url": URL, "count": N}.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

import psutil


def process_stats(base_rss: int) -> dict:
    me = psutil.Process()
    cpu = me.cpu_times()
    return {"rss": me.memory_info().rss, "base_rss": base_rss, "threads": me.num_threads(),
            "fds": me.num_fds(), "cpu_seconds": cpu.user + cpu.system}


# How long a thread of a worker holds the GIL while others wait for it
# (sys.setswitchinterval; Python's default 5 ms): see gil_waits_of.
GIL_SWITCH_SECONDS = 0.5


def gil_waits_of(seconds: float) -> None:
    """A thread waiting for the GIL wakes every switch interval to ask for
    it. The agents of a worker share its GIL, where each host's agent has
    its own. When the GIL's holder is short of CPU (the agents' cgroup has
    the least weight), all of them wait: at 1,000 agents in 50 processes,
    1,000 heartbeat answers at once (compute-agent-ctl hosts) left 100 to
    150 threads a process waking 200 times a second each, 3,000 runnable
    at once, 200,000 context switches a second and 70 % of the CPU in the
    kernel, until the broker dropped the agents' connections for missed
    heartbeats and the reconnections kept it going. The agents' work waits
    on sockets and files, which hand the GIL on at once, so the interval
    only bounds how long a computing thread keeps the others out."""
    sys.setswitchinterval(seconds)


def main(argv: list[str]) -> int:
    out = sys.stdout
    # Anything printed by a library goes to stderr, not into the answers.
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from tools.fleet_sim.agents import Fleet, FleetHost  # after logging: quiet imports
    base_rss = psutil.Process().memory_info().rss
    gil_waits_of(GIL_SWITCH_SECONDS)
    fleet = Fleet([FleetHost(Path(p)) for p in argv])
    job: threading.Thread | None = None

    def answer(value) -> None:
        out.write(json.dumps(value) + "\n")
        out.flush()

    for line in sys.stdin:
        command = json.loads(line)
        cmd = command["cmd"]
        if cmd in ("start", "restart"):
            job = threading.Thread(target=getattr(fleet, cmd), daemon=True)
            job.start()
            answer({"ok": True})
        elif cmd == "wait":
            if job is not None:
                job.join()
            answer({"ok": True})
        elif cmd == "stop":
            fleet.stop()
            answer({"ok": True})
        elif cmd == "status":
            answer({"hosts": fleet.status(), "process": process_stats(base_rss)})
        elif cmd == "build_half":
            answer({"providers": fleet.build_half(command["placement_url"])})
        elif cmd in ("stop_host", "start_host", "build_small"):
            host = fleet.named(command["host"])
            if host is None:
                answer({"here": False})
            elif cmd == "stop_host":
                host.stop()
                answer({"here": True})
            elif cmd == "start_host":
                host.start_safely()
                answer({"here": True, "error": host.error})
            else:
                answer({"here": True, "instances": host.build_small(
                    command["placement_url"], command["count"])})
        elif cmd == "exit":
            fleet.stop()
            answer({"ok": True})
            out.flush()
            os._exit(0)
        else:
            answer({"error": f"unknown command {cmd!r}"})
    fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
