"""The cleaner (compute_agent/cleaning/run.py): a used one-time-use
device's cleaning command runs outside the tracker's lock, and its end is
recorded: the device given back, or kept out with the reason."""
import logging

import pytest

from compute_agent.claims.model import DeviceUse, UseState
from compute_agent.cleaning.run import Cleaner, run_command
from compute_agent.exception import InvalidRequest
from compute_agent.tree.device_spec import DeviceSpec
from tests.unit.cleaning.devices import ONE_VF, THE_GPU, WHOLE, build
from tests.waiting import wait_for


def spec(command=("clean",), timeout=5.0) -> DeviceSpec:
    return DeviceSpec("{}", None, None, None, None, frozenset(), one_time_use=True,
                      clean_command=command, clean_timeout=timeout)


def cleaned_by(tracker, run, specs) -> Cleaner:
    cleaner = Cleaner(tracker, lambda: None, run=run)
    cleaner.set_specs(specs)
    cleaner.start()
    return cleaner


def until_cleaned(tracker, cleaner, address: str) -> None:
    """Until the cleaning of ``address`` that is due has ended."""
    wait_for(lambda: address not in tracker.awaiting_cleaning()
             and not cleaner.running(address), timeout=5, interval=0.01)


def test_a_cleaning_that_succeeds_gives_the_device_back(tracker, caplog):
    caplog.set_level(logging.INFO, "compute_agent.cleaning.run")
    ran = []

    def run(command, address, timeout):
        # Outside the tracker's lock: a claim goes through meanwhile.
        build(tracker, ONE_VF)
        ran.append((command, address, timeout))
        return "", "formatted\n"

    tracker.release_instance(build(tracker, THE_GPU))
    cleaner = cleaned_by(tracker, run, {WHOLE: spec(timeout=7)})
    try:
        until_cleaned(tracker, cleaner, WHOLE)
        assert ran == [(("clean",), WHOLE, 7)]
        assert all(u.address != WHOLE for u, _ in tracker.device_uses())
        assert "formatted" in caplog.text
    finally:
        cleaner.stop()


def test_a_cleaning_that_fails_keeps_the_device_out_with_its_reason(tracker, caplog):
    tracker.release_instance(build(tracker, THE_GPU))
    cleaner = cleaned_by(tracker, lambda c, a, t: ("exit status 2: no disk", ""),
                         {WHOLE: spec()})
    try:
        until_cleaned(tracker, cleaner, WHOLE)
        assert tracker.device_uses() == [
            (DeviceUse(WHOLE, UseState.CLEANING_FAILED, "exit status 2: no disk"), False)]
        warnings = [r for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "exit status 2: no disk" in warnings[0].getMessage()
        with pytest.raises(InvalidRequest, match="has no clean_command"):
            cleaner.set_specs({WHOLE: spec(command=None)})
            cleaner.clean_again(WHOLE)
    finally:
        cleaner.stop()


def test_run_command_passes_the_address_and_bounds_the_time(tmp_path):
    assert run_command(("echo",), WHOLE, 5) == ("", f"{WHOLE}\n")
    assert run_command(("sh", "-c", "echo no such disk; exit 3", "sh"), WHOLE, 5) == (
        "exit status 3: no such disk", "no such disk\n")
    assert run_command(("sh", "-c", "sleep 5", "sh"), WHOLE, 0.2)[0] == "timed out after 0.2 s"
    assert run_command((str(tmp_path / "missing"),), WHOLE, 5)[0].startswith(
        f"cannot run {tmp_path / 'missing'}: ")
