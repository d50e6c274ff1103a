"""A generated sweep of invalid values over every option the sample config
lists (ours, oslo.log's, oslo.messaging's, keystoneauth's): each is refused
by the start-up check in one line naming its section, option and value, or
the option is free-form (compute_agent.cmd.config_check.value_rules.FREE_FORM)
and the value is valid. In-process, on one config object reloaded per value, for speed;
tests/functional/test_config_fail_fast.py runs real commands."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check import options, value_rules, whole
from compute_agent.exception import ConfigError, shown
from tests.unit.cmd.config_check.test_value_rules import ABSENT, owned

TOP = Path(__file__).resolve().parents[4]
SAMPLE = TOP / "etc/compute-agent/compute-agent.conf.sample"

# Invalid values for the options each rule checks.
RULE_EXAMPLES = {
    value_rules.absolute_path: ["relative/path", "", "/" + "x" * 5000],
    value_rules.existing_directory: [f"{ABSENT}/directory", "relative", "/etc/hostname"],
    value_rules.readable_file: [f"{ABSENT}/file", "/"],
    value_rules.certificate_authorities: [f"{ABSENT}/file", "/", "/etc/hostname"],
    value_rules.state_directory: ["relative", "/etc/hostname", "/etc/hostname/below"],
    value_rules.host_name: ["", "has space", "x" * 300, "bad/slash"],
    value_rules.http_url: ["", "not a url", "ftp://h/", "http://", "http://h:99999/"],
    value_rules.transport_url: ["nohost", "foo://h/", "rabbit://u:pw@h:99999/",
                                "rabbit://h:abc/", "rabbit://h:0/"],
    value_rules.libvirt_uri: ["", "qemu", "xen:///system", "qemu+bogus://h/system"],
    value_rules.record_format: ["%(", "%(name", "%q", "%(nosuchkey)s"],
    value_rules.context_record_format: ["%(", "%(nosuchkey)s"],
    value_rules.user_identity_format: ["%(", "%(message)s"],
    value_rules.instance_format: ["%(", "%(name)s"],
    value_rules.file_to_write: ["relative", "/", f"{ABSENT}/directory/file", "/tmp/" + "x" * 256],
    value_rules.log_levels: ["noequals", "x=LOUD", "=INFO"],
    value_rules.syslog_facility: ["LOG_NOPE", "nope"],
    value_rules.queue_name: ["", "has space", "x" * 300],
    value_rules.queue_names: ["", "a b"],
    value_rules.notification_drivers: ["nope"],
    value_rules.rabbit_ssl_version: ["tlsv9"],
    value_rules.kombu_compression: ["nope"],
    value_rules.kafka_sasl_mechanism: ["nope"],
    value_rules.tls_ciphers: ["NOPE-CIPHER"],
    value_rules.service_type: ["", "Has Caps", "a b"],
    value_rules.endpoint_interfaces: ["", "private", "public,bogus"],
    value_rules.api_version: ["", "abc", "1.x"],
    value_rules.http_status_codes: ["abc", "99", "600"],
    value_rules.rpc_version: ["abc", "9.9", ""],
    value_rules.keystone_system_scope: ["some"],
    value_rules.listen_address: ["", "9180", "127.0.0.1", "127.0.0.1:", ":9180",
                                 "127.0.0.1:0", "127.0.0.1:65536", "[::1:9180",
                                 "[nope]:9180", "has space:9180"],
}
POLICY_EXAMPLES = {
    "owner_trait": ["owner_nova", "CUSTOM_", "OWNER_ME", ""],
    "cpu_dedicated_set": ["", "1,,2", "0-7,^0-7", "a", "3-1"],
    "cpu_shared_set": ["", "1,,2", "0-7,^0-7", "a", "3-1"],
    "device_spec": ["{", "[]", '{"vendor_id": "80861"}', "{}"],
    "vf_counts": ["0000:81:00.0", "0000:81:00.0=x", "0000:81:00.0=70000", "nope=4",
                  "0000:81:00.0=4,0000:81:00.0=8"],
    "enabled_mdev_types": ["bad type!"],
    "namespaces": ["bad label!:ns0", "nolabel", "L:", "L:ns 0"],
}
CROSS_EXAMPLES = {
    "log_file": [f"{ABSENT}/directory/x.log", "/"],
    "config_source": ["nosuchsection"],
    "auth_type": ["", "nope"],
    "auth_section": ["nosuchsection"],
}
FREE_FORM_EXAMPLES = ["x" * 5000, "any value, even this: !@#$%^&*()"]


def sample_options() -> list[tuple[str, str]]:
    """(section, option) of every option the sample lists."""
    out, section = [], None
    for line in SAMPLE.read_text().splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line):
            section = m[1]
        elif m := re.match(r"#(\w+) = ", line + " "):
            out.append((section, m[1]))
    return out


def baseline(tmp_path: Path, password: bool) -> dict[str, dict[str, str]]:
    """A config every check passes: a fake-driver agent, Placement reached
    with noauth2 or, for the password plugin's options, with Keystone."""
    host_file = tmp_path / "host.yaml"
    host_file.write_text("numa_cells: [{id: 0, cpus: '0-3', memory_mb: 4096}]\n")
    placement = ({"auth_type": "password", "auth_url": "http://keystone:5000/v3",
                  "username": "agent", "password": "s3cret", "user_domain_name": "Default",
                  "project_name": "service", "project_domain_name": "Default"}
                 if password else
                 {"auth_type": "placement_noauth2", "endpoint": "http://127.0.0.1:1"})
    return {"DEFAULT": {"host": "sweep", "state_path": str(tmp_path / "state"),
                        "compute_driver": "fake"},
            "fake": {"host_file": str(host_file)},
            "placement": placement}


def write(path: Path, sections: dict[str, dict[str, str]]) -> None:
    path.write_text("".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in opts.items())
                            for s, opts in sections.items()))


PASSWORD_OPTIONS = {o.dest for o in ks_loading.get_auth_plugin_conf_options("password")}


@dataclass
class Sweep:
    tmp_path: Path
    confs: dict[bool, tuple[Path, cfg.ConfigOpts]] = field(default_factory=dict)

    def conf_for(self, password: bool) -> tuple[Path, cfg.ConfigOpts]:
        if password not in self.confs:
            path = self.tmp_path / f"sweep-{password}.conf"
            write(path, baseline(self.tmp_path, password))
            self.confs[password] = path, load_config(["--config-file", str(path)],
                                                     placement_required=True)
        return self.confs[password]

    def check(self, section: str, name: str, value: str) -> ConfigError | None:
        """The check's verdict on the baseline with ``value`` given."""
        password = section == "placement" and name in PASSWORD_OPTIONS
        path, conf = self.conf_for(password)
        sections = baseline(self.tmp_path, password)
        sections.setdefault(section, {})[name] = value
        write(path, sections)
        try:
            if is_cli_option(conf, section, name):
                load_config(["--config-file", str(path)], placement_required=True)
            else:
                assert conf.reload_config_files()
                whole.check_config(conf, placement_required=True)
        except ConfigError as e:
            return e
        return None


def is_cli_option(conf: cfg.ConfigOpts, section: str, name: str) -> bool:
    return any(opt.dest == name and (group.name if group else "DEFAULT") == section
               for opt, group in conf._all_cli_opts())


def registered(conf: cfg.ConfigOpts) -> dict[tuple[str, str], options.Option]:
    return {(o.section, o.name): o for o in options.registered_options(conf)}


def invalid_values(option: options.Option) -> tuple[list[str], bool]:
    """Invalid values for an option, by its type and rule; and whether it
    is free-form (then the values are valid ones)."""
    t, key = option.opt.type, (option.section, option.name)
    if isinstance(t, (cfg.types.Integer, cfg.types.Float)):
        low, high = value_rules.number_bounds(option)
        # Empty reads as unset: invalid only where unset is not the default.
        values = ["abc", "1.5" if isinstance(t, cfg.types.Integer) else "nan",
                  "9" * 30, str(low - 1), str(high + 1)]
        values += [""] if option.opt.default is not None else []
        return values + (["inf", "-inf", "1e400"] if isinstance(t, cfg.types.Float)
                         else []), False
    if isinstance(t, cfg.types.Boolean):
        return ["maybe", "2", "yes please"], False
    if getattr(t, "choices", None):
        return ["not-a-choice", "x" * 300], False
    if key in value_rules.VALUE_RULES:
        return RULE_EXAMPLES[value_rules.VALUE_RULES[key]], False
    if key in value_rules.POLICY_OPTIONS:
        return POLICY_EXAMPLES[option.name], False
    if key in value_rules.CROSS_OPTIONS:
        return CROSS_EXAMPLES[option.name], False
    assert key in value_rules.FREE_FORM, f"[{key[0]}] {key[1]}: no rule, and not listed free-form"
    return FREE_FORM_EXAMPLES, True


def names_it(error: ConfigError, option: options.Option, value: str) -> bool:
    text = str(error)
    expected = "***" if option.opt.secret and "url" not in option.name else shown(
        options.masked_url(value))
    # [pci] device_spec names the entry, whose field it names too; a list
    # may name the item that is wrong.
    items = value.split(",") if isinstance(option.opt.type, cfg.types.List) else []
    return ("\n" not in text and text.startswith(f"[{option.section}] {option.name}: ")
            and (f"(value: {expected})" in text or f"entry: {value})" in text
                 or any(f"(value: {shown(item)})" in text for item in items)))


def test_every_option_of_the_sample_is_refused_when_invalid_or_is_free_form(tmp_path):
    sweep = Sweep(tmp_path)
    by_key = {**registered(sweep.conf_for(False)[1]), **registered(sweep.conf_for(True)[1])}
    listed = sample_options()
    tried = rejected = accepted = 0
    wrong = []
    for section, name in listed:
        option = by_key[(section, name)]
        tried_values, free_form = invalid_values(option)
        for value in (owned(v, tmp_path) for v in tried_values):
            tried += 1
            error = sweep.check(section, name, value)
            if free_form:
                accepted += error is None
                if error is not None:
                    wrong.append(f"free-form [{section}] {name} = {value!r}: {error}")
            elif error is not None and names_it(error, option, value):
                rejected += 1
            else:
                wrong.append(f"[{section}] {name} = {value[:40]!r}: {error}")
    print(f"\nconfig sweep: {len(listed)} options, {tried} values, {rejected} rejected, "
          f"{accepted} accepted as valid (free-form)")
    assert not wrong, "\n".join(wrong)
    assert len(listed) > 150 and rejected + accepted == tried


def test_every_number_is_bounded_on_both_sides(tmp_path):
    conf = Sweep(tmp_path).conf_for(True)[1]
    unbounded = [f"[{o.section}] {o.name}" for o in options.registered_options(conf)
                 if isinstance(o.opt.type, (cfg.types.Integer, cfg.types.Float))
                 and None in value_rules.number_bounds(o)]
    assert unbounded == []


@pytest.mark.parametrize("password", [False, True])
def test_every_default_passes_the_check(tmp_path, password):
    """A rule that refuses a default would refuse every config."""
    Sweep(tmp_path).conf_for(password)
