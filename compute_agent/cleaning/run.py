"""The cleaner: a thread that runs each used one-time-use device's
cleaning command once no guest holds it (compute_agent/cleaning/rules.py says
what a used device does to the tree).

The command is the device spec's ``clean_command`` with the device's PCI
address appended, run without a shell, bounded by ``clean_timeout``; its
output is logged. It exits 0: the device is given back (the tracker's
record goes, on disk), and the update loop is woken to lower its reserved.
It exits otherwise, cannot start or runs out of time: the device stays out,
its record says why, one WARNING says so, and the update loop is woken to
add the reason trait. A device whose spec names no command waits for an
operator (one INFO line). Each cleaning runs in a thread of its own, so a
slow one (a disk's format) holds no other, and none runs under the
tracker's lock or in the store's writer: only the records they end with
are decisions. A cleaning cut short by a stop or a crash runs again at the
next start, the device still recorded used.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compute_agent.compute.tracker import Tracker
from compute_agent.exception import InvalidRequest
from compute_agent.store.errors import StoreError
from compute_agent.tree.device_spec import DeviceSpec

LOG = logging.getLogger(__name__)
# The output logged of one cleaning: its end, where a failure says why.
OUTPUT_LIMIT = 4000
# The reason a failed cleaning records: one line.
REASON_LIMIT = 200


@dataclass(frozen=True)
class CleaningOutcome:
    """How one cleaning ended: ``reason`` is empty when it succeeded."""

    address: str
    reason: str
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.reason


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:REASON_LIMIT] if lines else ""


def run_command(command: tuple[str, ...], address: str, timeout: float
                ) -> tuple[str, str]:
    """Run a cleaning command on ``address``: (why it failed, empty when it
    succeeded; its output, stdout and stderr together)."""
    try:
        done = subprocess.run([*command, address], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        output = (e.output or b"").decode(errors="replace")
        return f"timed out after {timeout:g} s", output
    except OSError as e:
        return f"cannot run {command[0]}: {e.strerror}", ""
    output = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        why = last_line(output)
        return (f"exit status {done.returncode}" + (f": {why}" if why else "")), output
    return "", output


class Cleaner:
    def __init__(self, tracker: Tracker, on_change: Callable[[], None],
                 run: Callable[[tuple[str, ...], str, float], tuple[str, str]] = run_command
                 ) -> None:
        """``on_change`` wakes the update loop; ``run`` runs one command."""
        self._tracker = tracker
        self._on_change = on_change
        self._run = run
        self._lock = threading.Lock()
        # Each one-time-use device's spec, from the latest cycle's tree.
        self._specs: Mapping[str, DeviceSpec] = {}
        self._running: set[str] = set()
        self._waiting_told: set[str] = set()
        # Cleaned, but their end not written (the store failed): cleaned
        # again at the next start or an operator's ask, not at every wake.
        self._unrecorded: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        tracker.on_uses_changed = self._uses_changed

    def set_specs(self, specs: Mapping[str, DeviceSpec]) -> None:
        """The one-time-use devices' specs, each cycle; a device new to
        them may be waiting, so the cleaner looks."""
        with self._lock:
            changed, self._specs = specs != self._specs, dict(specs)
        if changed:
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    def _uses_changed(self) -> None:
        """A device used or freed: the update loop reports it (a whole
        device out from its claim on, a VF from its release), and a freed
        one waits for its cleaning."""
        self._on_change()
        self.wake()

    def running(self, address: str) -> bool:
        with self._lock:
            return address in self._running

    def clean_again(self, address: str) -> None:
        """``compute-agent-manage device clean``: the device waits to be
        cleaned again, its command started now. InvalidRequest when it is
        not a used device no one holds, or no command cleans it."""
        with self._lock:
            spec = self._specs.get(address)
            self._refuse_running(address)
            if spec is None or spec.clean_command is None:
                raise InvalidRequest("address", address, "has no clean_command in "
                                     "[pci] device_spec; once cleaned by hand, "
                                     "release it")
            self._tracker.clean_again(address)
            self._unrecorded.discard(address)
        self.wake()

    def give_back(self, address: str) -> None:
        """``compute-agent-manage device release``: an operator cleaned the
        device by hand; back in scheduling. InvalidRequest when it is not
        a used device no one holds, or its cleaning runs now."""
        with self._lock:
            self._refuse_running(address)
            self._tracker.give_back_device(address)

    def _refuse_running(self, address: str) -> None:
        """Called under the lock: what the operator asks waits for the
        cleaning that runs."""
        if address in self._running:
            raise InvalidRequest("address", address, "is being cleaned now")

    def _start_due(self) -> None:
        """Start a cleaning for every device that waits for one. Under the
        lock from the tracker's answer until the device is marked running,
        so that no operator's release comes between (a device given back
        may be claimed at once, and must not be cleaned then)."""
        with self._lock:
            due = self._tracker.awaiting_cleaning()
            self._waiting_told &= set(due)
            for address in due:
                spec = self._specs.get(address)
                if address in self._running or address in self._unrecorded or spec is None:
                    continue
                if spec.clean_command is None:
                    if address not in self._waiting_told:
                        self._waiting_told.add(address)
                        LOG.info("Device %s used: it waits to be cleaned by hand, then "
                                 "released (compute-agent-manage device release)",
                                 address)
                    continue
                self._running.add(address)
                threading.Thread(target=self._clean, args=(address, spec), daemon=True,
                                 name=f"clean-{address}").start()

    def _clean(self, address: str, spec: DeviceSpec) -> None:
        try:
            outcome = self.clean(address, spec)
            self._record(outcome)
        except InvalidRequest as e:
            LOG.info("Device %s: its cleaning's end not recorded: %s", address, e)
        except StoreError as e:
            with self._lock:
                self._unrecorded.add(address)
            LOG.warning("Device %s: its cleaning's end not recorded, it runs again "
                        "at the next start: %s", address, e)
        except Exception:  # a cleaning must not take the agent down
            LOG.exception("Cleaning device %s failed", address)
        finally:
            with self._lock:
                self._running.discard(address)
        self._on_change()

    def clean(self, address: str, spec: DeviceSpec) -> CleaningOutcome:
        """Run the device's cleaning command and log its output."""
        command = spec.clean_command
        assert command is not None  # its callers run only a spec that names one
        LOG.info("Device %s used: cleaning it with %s", address, " ".join(command))
        started = time.monotonic()
        reason, output = self._run(command, address, spec.clean_timeout)
        seconds = time.monotonic() - started
        if output.strip():
            LOG.info("Device %s cleaning output:\n%s", address,
                     output.strip()[-OUTPUT_LIMIT:])
        return CleaningOutcome(address, reason, seconds)

    def _record(self, outcome: CleaningOutcome) -> None:
        if outcome.ok:
            self._tracker.give_back_device(outcome.address)
            LOG.info("Device %s cleaned in %.2f s: back in scheduling", outcome.address,
                     outcome.seconds)
            return
        self._tracker.cleaning_failed(outcome.address, outcome.reason)
        LOG.warning("Device %s: cleaning failed (%s); it stays out of scheduling "
                    "until cleaned (compute-agent-manage device clean) or released",
                    outcome.address, outcome.reason)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self._start_due()
            except Exception:  # the cleaner must outlive any bug in a pass
                LOG.exception("Starting device cleanings failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="device-cleaning",
                                        daemon=True)
        self._thread.start()
        self.wake()

    def stop(self, timeout: float = 10) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
