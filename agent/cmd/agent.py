"""compute-agent: the daemon.

    compute-agent --config-file F          run until SIGTERM
    compute-agent --config-file F --once   run one update cycle and exit,
                                           with a one-line summary

This module is the entry point and imports nothing but the standard library:
SIGHUP's default action ends a process, a SIGHUP can come as soon as the
process exists (logrotate, a ``kill -HUP`` right after a start), and the
daemon's own modules take half a second or more to import. So the handler is
installed first and the daemon (agent.cmd.daemon) is imported after it.
Only the interpreter's own start-up (tens of milliseconds) comes before; under
systemd (Type=notify) a reload waits for READY=1 anyway.
"""
from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.daemon.service import Agent


class ReloadSignal:
    """SIGHUP asks the agent to drop its Placement cache. One that comes
    before the agent exists is noted and handed to the agent once it does."""

    def __init__(self) -> None:
        self._agent: Agent | None = None
        self._early = False

    def install(self) -> None:
        signal.signal(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self, signum, frame) -> None:
        if self._agent is None:
            self._early = True
        else:
            self._agent.drop_cache()

    def deliver_to(self, agent: Agent) -> bool:
        """From now on SIGHUP drops ``agent``'s cache; one that came
        earlier drops it now, and the answer is True."""
        self._agent = agent
        if not self._early:
            return False
        self._early = False
        agent.drop_cache()
        return True


def main(argv=None) -> int:
    reload_signal = ReloadSignal()
    reload_signal.install()
    # Imported only now, on purpose: see the module's docstring.
    from agent.cmd import daemon
    return daemon.main(reload_signal, argv)


if __name__ == "__main__":
    sys.exit(main())
