import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
GENERATOR_CONF = TOP / "etc/compute-agent/compute-agent-config-generator.conf"
SAMPLE = TOP / "etc/compute-agent/compute-agent.conf.sample"


def test_the_checked_in_sample_config_is_current(tmp_path):
    fresh = tmp_path / "sample.conf"
    subprocess.run([str(Path(sys.executable).parent / "oslo-config-generator"),
                    "--config-file", str(GENERATOR_CONF), "--output-file", str(fresh)],
                   check=True, cwd=TOP)
    assert fresh.read_text() == SAMPLE.read_text(), (
        "the sample config is stale: run tools/genconfig")
