"""How long the command has run, counted against --timeout
(compute_agent/cmd/common.py process_age)."""
from __future__ import annotations

from compute_agent.cmd.common import process_age

# proc(5): pid (comm) state ppid ...; field 22 is starttime in clock ticks.
# A command name with spaces and a parenthesis, as a process may name itself.
STAT = ("4242 (compute-agent (ctl) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 5 2 0 0 20 0 "
        "3 0 {start} 50000000 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0")


def test_the_age_is_the_boot_clock_less_the_start_time():
    assert process_age(STAT.format(start=12_300), now=125.5, ticks_per_second=100) == 2.5


def test_an_unreadable_stat_is_no_age():
    assert process_age("garbage", now=125.5, ticks_per_second=100) == 0.0
    assert process_age(STAT.format(start="x"), now=125.5, ticks_per_second=100) == 0.0


def test_this_process_has_run_a_while_and_not_longer_than_the_machine():
    age = process_age()
    assert 0 < age < 10 ** 7
