"""The cleaner (compute_agent/cleaning/run.py): a used one-time-use
device's cleaning command runs outside the tracker's lock, and its end is
recorded: the device given back, or kept out with the reason."""
import logging
import threading

import pytest

from compute_agent.claims.model import DeviceUse, UseState
from compute_agent.cleaning.run import OUTPUT_LIMIT, Cleaner, last_line, run_command
from compute_agent.exception import InvalidRequest
from compute_agent.store.errors import StoreError
from compute_agent.tree.device_spec import DeviceSpec
from tests.unit.cleaning.devices import ONE_VF, THE_GPU, VF0, WHOLE, build
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


@pytest.mark.parametrize("output, reason", [
    ("formatting /dev/nvme1n1\nerror: device busy\n\n  \n", "error: device busy"),
    ("   \n\n", ""),
    ("", ""),
    ("x" * 500, "x" * 200),
])
def test_the_reason_of_a_failure_is_its_output_s_last_line_cut_to_one_line(output, reason):
    assert last_line(output) == reason


def test_a_command_that_fails_silently_says_its_exit_status_alone():
    assert run_command(("sh", "-c", "exit 4", "sh"), WHOLE, 5) == ("exit status 4", "")


class Blocked:
    """A cleaning command that runs until the test lets it end."""

    def __init__(self, reason: str = "") -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.reason = reason
        self.ran: list[str] = []

    def __call__(self, command, address, timeout) -> tuple[str, str]:
        self.ran.append(address)
        self.started.set()
        assert self.go.wait(10)
        return self.reason, ""


def test_what_an_operator_asks_of_a_device_waits_for_its_running_cleaning(tracker):
    tracker.release_instance(build(tracker, THE_GPU))
    run = Blocked()
    cleaner = cleaned_by(tracker, run, {WHOLE: spec()})
    try:
        assert run.started.wait(10)
        assert cleaner.running(WHOLE)
        for asked in (cleaner.give_back, cleaner.clean_again):
            with pytest.raises(InvalidRequest, match="is being cleaned now"):
                asked(WHOLE)
        run.go.set()
        until_cleaned(tracker, cleaner, WHOLE)
        assert tracker.device_uses() == [] and run.ran == [WHOLE]
    finally:
        run.go.set()
        cleaner.stop()


def test_a_device_cleaned_again_runs_its_command_again(tracker):
    tracker.release_instance(build(tracker, THE_GPU))
    outcomes = [("exit status 1: busy", ""), ("", "")]
    cleaner = cleaned_by(tracker, lambda c, a, t: outcomes.pop(0), {WHOLE: spec()})
    try:
        wait_for(lambda: not cleaner.running(WHOLE) and tracker.device_uses() == [
            (DeviceUse(WHOLE, UseState.CLEANING_FAILED, "exit status 1: busy"), False)],
            timeout=5, interval=0.01)
        cleaner.clean_again(WHOLE)
        until_cleaned(tracker, cleaner, WHOLE)
        assert tracker.device_uses() == [] and outcomes == []
    finally:
        cleaner.stop()


def told_to_wait(caplog, address: str) -> int:
    """How often the cleaner said ``address`` waits for an operator."""
    return caplog.text.count(f"Device {address} used: it waits to be cleaned by hand")


def test_a_device_without_a_command_waits_for_an_operator_said_once(tracker, caplog):
    caplog.set_level(logging.INFO, "compute_agent.cleaning.run")
    ran: list[str] = []
    tracker.release_instance(build(tracker, THE_GPU))
    cleaner = cleaned_by(tracker, lambda c, a, t: ran.append(a) or ("", ""),
                         {WHOLE: spec(command=None), VF0: spec(command=None)})
    try:
        wait_for(lambda: told_to_wait(caplog, WHOLE), timeout=5, interval=0.01)
        # Woken again by a VF used and freed: that VF is told, the GPU not again.
        tracker.release_instance(build(tracker, ONE_VF))
        wait_for(lambda: told_to_wait(caplog, VF0), timeout=5, interval=0.01)
        assert told_to_wait(caplog, WHOLE) == 1 and ran == []
        cleaner.give_back(WHOLE)
        assert [u.address for u, _ in tracker.device_uses()] == [VF0]
    finally:
        cleaner.stop()


def test_a_device_is_cleaned_once_its_spec_arrives(tracker, caplog):
    """Used before its spec was known (the first cycle had not run): its
    cleaning waits for the spec, which wakes the cleaner."""
    caplog.set_level(logging.INFO, "compute_agent.cleaning.run")
    ran: list[str] = []
    tracker.release_instance(build(tracker, ONE_VF))
    tracker.release_instance(build(tracker, THE_GPU))
    waits_for_hand = {VF0: spec(command=None)}
    cleaner = cleaned_by(tracker, lambda c, a, t: ran.append(a) or ("", ""), waits_for_hand)
    try:
        # A pass went by (it told the VF's wait) without the GPU's spec.
        wait_for(lambda: told_to_wait(caplog, VF0), timeout=5, interval=0.01)
        assert ran == [] and WHOLE in tracker.awaiting_cleaning()
        cleaner.set_specs({**waits_for_hand, WHOLE: spec()})
        until_cleaned(tracker, cleaner, WHOLE)
        assert ran == [WHOLE]
    finally:
        cleaner.stop()


def test_the_update_loop_is_woken_by_a_use_and_by_each_cleaning_s_end(tracker):
    woken: list[list[str]] = []
    cleaner = Cleaner(tracker, lambda: woken.append(tracker.awaiting_cleaning()),
                      run=lambda c, a, t: ("", ""))
    cleaner.set_specs({WHOLE: spec()})
    instance = build(tracker, THE_GPU)
    assert woken == [[]]  # the claim: the device goes out of scheduling
    tracker.release_instance(instance)
    assert woken == [[], [WHOLE]]  # the release: it waits for its cleaning
    cleaner.start()  # after, so that its cleaning cannot end before the release is told
    try:
        wait_for(lambda: len(woken) == 3, timeout=5, interval=0.01)
        # The cleaning's end: the device given back.
        assert woken == [[], [WHOLE], []] and tracker.device_uses() == []
    finally:
        cleaner.stop()


def test_a_cleaning_whose_end_cannot_be_written_runs_again_at_the_next_start(
        tracker, caplog, monkeypatch):
    """Was: it ran again at every wake of the cleaner (a disk formatted
    again and again while the store failed), and a wake between the
    cleaning's end and its telling told the loop it still ran."""
    def store_fails(address: str) -> None:
        raise StoreError("store /var/lib/compute-agent/state.db: disk I/O error")

    monkeypatch.setattr(tracker, "give_back_device", store_fails)
    tracker.release_instance(build(tracker, THE_GPU))
    ends: list[bool] = []
    ran: list[str] = []
    # Made after the release, so that only the cleaning's end wakes the loop.
    cleaner = Cleaner(tracker, lambda: ends.append(cleaner.running(WHOLE)),
                      run=lambda c, a, t: ran.append(a) or ("", ""))
    cleaner.set_specs({WHOLE: spec()})
    cleaner.start()
    try:
        wait_for(lambda: ends, timeout=5, interval=0.01)
        assert ends[0] is False  # told once the cleaning no longer runs
        assert "runs again at the next start: store /var/lib" in caplog.text
        assert tracker.awaiting_cleaning() == [WHOLE]  # still used, on disk
        for _ in range(3):
            cleaner._start_due()  # what each wake of the cleaner's loop does
        assert not cleaner.running(WHOLE)
        assert ran == [WHOLE]  # not again before the next start
        cleaner.clean_again(WHOLE)  # but at once when an operator asks
        wait_for(lambda: len(ran) == 2, timeout=5, interval=0.01)
        wait_for(lambda: not cleaner.running(WHOLE), timeout=5, interval=0.01)
    finally:
        cleaner.stop()
    again = Cleaner(tracker, lambda: None, run=lambda c, a, t: ran.append(a) or ("", ""))
    again.set_specs({WHOLE: spec()})
    again.start()  # the next start
    try:
        wait_for(lambda: len(ran) == 3, timeout=5, interval=0.01)
    finally:
        again.stop()


def test_a_cleaning_that_breaks_takes_neither_the_cleaner_nor_other_devices_down(
        tracker, caplog):
    def run(command, address, timeout):
        if address == WHOLE:
            raise RuntimeError("bug in a cleaning")
        return "", ""

    tracker.release_instance(build(tracker, THE_GPU))
    cleaner = cleaned_by(tracker, run, {WHOLE: spec()})
    try:
        wait_for(lambda: "Cleaning device 0000:af:00.0 failed" in caplog.text, timeout=5,
                 interval=0.01)
        wait_for(lambda: not cleaner.running(WHOLE), timeout=5, interval=0.01)
        cleaner.set_specs({WHOLE: spec(), VF0: spec()})
        tracker.release_instance(build(tracker, ONE_VF))
        until_cleaned(tracker, cleaner, VF0)
        assert [u.address for u, _ in tracker.device_uses()] == [WHOLE]
    finally:
        cleaner.stop()


def test_only_the_end_of_a_long_output_is_logged(tracker, caplog):
    caplog.set_level(logging.INFO, "compute_agent.cleaning.run")
    output = "BEGIN" + "x" * OUTPUT_LIMIT + "END\n"
    outcome = Cleaner(tracker, lambda: None, run=lambda c, a, t: ("", output)).clean(
        WHOLE, spec())
    assert outcome.ok and outcome.address == WHOLE
    (logged,) = [r.getMessage() for r in caplog.records if "cleaning output" in r.getMessage()]
    assert logged.endswith("x" * (OUTPUT_LIMIT - 3) + "END") and "BEGIN" not in logged
