"""The demo's build for compute-agent-ctl (tools/demo.py writes it from the
tree it made) builds on the demo host through the real path: the demo's
host and config, the agent's first cycle in a real Placement, the
scheduler's allocations put there, then compute-agent-ctl over the real
RabbitMQ to the running agent, whose claim lands on the providers the
build names and whose guest runs. (Not ``audit``: the libvirt test driver
keeps a guest in the connection that defined it, so another process
finds none.)"""
from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from compute_agent.cmd import ctl
from tests.functional.helpers import put_allocations, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def load_demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "tools" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_the_build_the_demo_writes_builds_on_the_demo_host(tmp_path, placement, services):
    demo = load_demo()
    description = yaml.safe_load((ROOT / "etc" / "demo" / "host.yaml").read_text())
    uri = demo.build_host(description, tmp_path / "host")
    (tmp_path / "instances").mkdir()
    conf = demo.write_conf(tmp_path, uri, placement.url)
    once = subprocess.run([str(BIN / "compute-agent"), "--config-file", str(conf), "--once"],
                          capture_output=True, text=True, timeout=120)
    assert once.returncode == 0, once.stderr

    spec_path = demo.write_example_spec(tmp_path, placement.url)
    # Where compute-agent-ctl's help says the demo writes it.
    assert (demo.WORK / spec_path.name).relative_to(ROOT) == Path(ctl.DEMO_SPEC)
    build = json.loads(spec_path.read_text())
    # The scheduler's part: the allocations in Placement, for the instance.
    put_allocations(placement.url, build["instance_uuid"], build["allocations"])
    log = tmp_path / "agent.log"
    daemon = subprocess.Popen([str(BIN / "compute-agent"), "--config-file", str(conf)],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "compute-agent running as host" in log.read_text(), 60)
        built = subprocess.run(
            [str(BIN / "compute-agent-ctl"), "--config-file", str(conf), "build",
             demo.HOST, "--spec", str(spec_path), "--json"],
            capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stdout + built.stderr
        vf_provider = next(u for u, a in build["allocations"].items()
                           if demo.VF_CLASS in a["resources"])
        claimed = [(a["resource_class"], a["provider_uuid"])
                   for a in json.loads(built.stdout)["assignments"]]
        assert (demo.VF_CLASS, vf_provider) in claimed, claimed
        shown = subprocess.run(
            [str(BIN / "compute-agent-ctl"), "--config-file", str(conf), "show",
             demo.HOST, build["instance_uuid"], "--json"],
            capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        instance = json.loads(shown.stdout)
        assert (instance["spec"], instance["running"]) == (demo.EXAMPLE_GUEST, True)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
