"""compute-agent: the daemon.

    compute-agent --config-file F          run until SIGTERM
    compute-agent --config-file F --once   run one update cycle and exit,
                                           with a one-line summary

This module is the entry point and imports nothing but the standard library
and compute_agent.daemon.reload_signal (standard library only itself):
SIGHUP's default action ends a process, a SIGHUP can come as soon as the
process exists (logrotate, a ``kill -HUP`` right after a start), and the
daemon's own modules take half a second or more to import. So the handler is
installed first and the daemon (compute_agent.cmd.daemon) is imported after it.
Only the interpreter's own start-up (tens of milliseconds) comes before; under
systemd (Type=notify) a reload waits for READY=1 anyway.
"""
from __future__ import annotations

import sys

from compute_agent.daemon.reload_signal import ReloadSignal


def main(argv=None) -> int:
    reload_signal = ReloadSignal()
    reload_signal.install()
    # Imported only now, on purpose: see the module's docstring.
    from compute_agent.cmd import daemon
    return daemon.main(reload_signal, argv)


if __name__ == "__main__":
    sys.exit(main())
