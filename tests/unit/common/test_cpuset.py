"""CPU list syntax: parse_cpu_set and format_cpu_set."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compute_agent.common.cpuset import format_cpu_set, parse_cpu_set


@pytest.mark.parametrize("text,cpus", [
    ("0", {0}),
    ("0-3", {0, 1, 2, 3}),
    ("0-3,8", {0, 1, 2, 3, 8}),
    ("0-3,8,^2", {0, 1, 3, 8}),
    ("^2,0-3", {0, 1, 3}),
    ("0-7,^2-5", {0, 1, 6, 7}),
    (" 1 , 3 - 4 ", {1, 3, 4}),
    ("1,,2,", {1, 2}),
    ("", set()),
    ("4-4", {4}),
])
def test_parse(text, cpus):
    assert parse_cpu_set(text) == frozenset(cpus)


@pytest.mark.parametrize("text,bad", [
    ("a", "'a'"),
    ("1-b", "'1-b'"),
    ("-1", "'-1'"),
    ("3-1", "'3-1'"),
    ("1.5", "'1.5'"),
    ("0-3,x-4", "'x-4'"),
])
def test_parse_rejects_bad_part_naming_it(text, bad):
    with pytest.raises(ValueError) as err:
        parse_cpu_set(text)
    assert bad in str(err.value)


def test_exclusions_can_be_refused():
    with pytest.raises(ValueError, match=r"exclusion.*\^2"):
        parse_cpu_set("0-3,^2", allow_exclusions=False)
    assert parse_cpu_set("0-3", allow_exclusions=False) == frozenset(range(4))


@given(st.frozensets(st.integers(0, 300)), st.frozensets(st.integers(0, 300)))
def test_exclusions_subtract_whatever_the_order(include, exclude):
    parts = [str(c) for c in include] + [f"^{c}" for c in exclude]
    assert parse_cpu_set(",".join(parts)) == include - exclude
    assert parse_cpu_set(",".join(reversed(parts))) == include - exclude


def test_a_range_beyond_any_host_is_refused_before_it_is_built():
    with pytest.raises(ValueError, match="0-999999999"):
        parse_cpu_set("0-999999999")
    assert max(parse_cpu_set("65530-65535")) == 65535


@pytest.mark.parametrize("cpus,text", [
    ({0, 1, 2, 3, 8}, "0-3,8"), ({5}, "5"), ({4, 5}, "4-5"), (set(), ""),
    ({1, 3, 5}, "1,3,5"), ({9, 0, 1, 10}, "0-1,9-10"),
])
def test_format(cpus, text):
    assert format_cpu_set(cpus) == text


@given(st.frozensets(st.integers(0, 300)))
def test_format_reads_back(cpus):
    text = format_cpu_set(cpus)
    assert parse_cpu_set(text, allow_exclusions=False) == cpus
    assert "^" not in text
