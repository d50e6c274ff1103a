"""The whole start-up check (compute_agent/cmd/config_check/whole.py): the
rules on several options (the auth plugin and its options, the log file,
config sources, a command-line option's value in a file), then a generated
sweep of invalid values over every option the sample config lists (ours,
oslo.log's, oslo.messaging's, keystoneauth's): each is refused in one line
naming its section, option and value, or the option is free-form
(compute_agent.cmd.config_check.value_rules.FREE_FORM) and the value is
valid. The sweep runs in-process, on one config object reloaded per value,
for speed; tests/functional/test_config_fail_fast.py runs real commands."""
from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check import options, value_rules, whole
from compute_agent.exception import ConfigError, shown
from tests.unit.cmd.config_check.configs import ABSENT, conf_argv, owned, refused


def test_auth_type_is_required_only_where_placement_is_used(tmp_path):
    assert refused(tmp_path, "").startswith("[placement] auth_type: missing")
    load_config(conf_argv(tmp_path, ""), placement_required=False)


def test_an_unknown_auth_plugin_is_one_line_listing_the_known_ones(tmp_path):
    line = refused(tmp_path, "[placement]\nauth_type = nosuchplugin\n",
                   placement_required=False)
    assert "unknown auth plugin; known: admin_token," in line
    assert "(value: 'nosuchplugin')" in line and len(line) < 270


def test_a_misspelt_auth_plugin_is_named_with_the_one_it_misspells(tmp_path):
    line = refused(tmp_path, "[placement]\nauth_type = pasword\n", placement_required=False)
    assert "unknown auth plugin; did you mean password?; known: " in line


@pytest.mark.parametrize("placement,missing", [
    ("auth_type = placement_noauth2\n", "endpoint"),
    ("auth_type = admin_token\ntoken = t\n", "endpoint"),
    ("auth_type = none\n", "endpoint"),
    ("auth_type = password\nusername = u\npassword = p\n", "auth_url"),
    ("auth_type = password\nauth_url = http://k/v3\npassword = p\n", "username"),
    ("auth_type = password\nauth_url = http://k/v3\nusername = u\n", "password"),
    ("auth_type = password\nauth_url = http://k/v3\nusername = u\npassword = p\n"
     "project_name = service\nproject_domain_name = Default\n", "user_domain_name"),
    ("auth_type = password\nauth_url = http://k/v3\nusername = u\npassword = p\n"
     "user_domain_name = Default\nproject_name = service\n", "project_domain_name"),
    ("auth_type = password\nauth_url = http://k/v3\nusername = u\npassword = p\n"
     "user_domain_name = Default\n", "project_name"),
])
def test_an_auth_plugin_s_missing_option_is_named(tmp_path, placement, missing):
    line = refused(tmp_path, "[placement]\n" + placement)
    assert line.startswith(f"[placement] {missing}: missing, and auth_type = ")


def test_a_complete_keystone_password_config_passes(tmp_path):
    load_config(conf_argv(tmp_path, "[placement]\nauth_type = password\n"
                          "auth_url = http://k/v3\nusername = u\npassword = p\n"
                          "default_domain_name = Default\nproject_name = service\n"),
                placement_required=True)


def test_auth_options_may_live_in_an_auth_section(tmp_path):
    load_config(conf_argv(tmp_path, "[placement]\nauth_section = keystone\n"
                          "[keystone]\nauth_type = placement_noauth2\n"
                          "endpoint = http://127.0.0.1:1\n"), placement_required=True)
    assert refused(tmp_path, "[placement]\nauth_section = nowhere\n").startswith(
        "[placement] auth_section: no such section")


def test_a_bad_value_of_a_command_line_option_in_a_file_names_it(tmp_path):
    line = refused(tmp_path, "debug = maybe\n", placement_required=False)
    assert line == "[DEFAULT] debug: Invalid Boolean (value: 'maybe')"


def test_fuzz_bug_an_empty_value_of_a_command_line_option_in_a_file_names_it(tmp_path):
    """Found by tests/reliability: oslo.config's message then ends in
    "value: ", which did not match, so the command exited 1 with
    oslo.config's own words instead of the one line and exit 2."""
    line = refused(tmp_path, "debug =\n", placement_required=False)
    assert line == "[DEFAULT] debug: Invalid Boolean (value: '')"


RABBIT = "[oslo_messaging_rabbit]\n"


@pytest.mark.parametrize("text,reason", [
    (f"log_file = {ABSENT}/dir/agent.log\n", "[DEFAULT] log_file: no such directory"),
    ("config_source = remote\n", "[DEFAULT] config_source: no section [remote]"),
    ("compute_driver = fake\n[fake]\nhost_file =\n", "[fake] host_file: missing"),
    ("[placement]\nversion = 1.0\nmax_version = 1.0\n", "[placement] version: give"),
    (f"{RABBIT}rabbit_stream_fanout = true\nrabbit_transient_quorum_queue = true\n",
     "[oslo_messaging_rabbit] rabbit_qos_prefetch_count: must be more than 0 with "
     "rabbit_stream_fanout = true (a stream's consumer needs a prefetch) (value: 0)"),
    (f"{RABBIT}rabbit_stream_fanout = true\nrabbit_qos_prefetch_count = 10\n",
     "[oslo_messaging_rabbit] rabbit_transient_quorum_queue: must be true with "
     "rabbit_stream_fanout = true (value: False)"),
    (f"{RABBIT}rabbit_transient_quorum_queue = true\nrabbit_ha_queues = true\n",
     "[oslo_messaging_rabbit] rabbit_ha_queues: must be false with "
     "rabbit_transient_quorum_queue = true: a queue is quorum or mirrored (HA), not both "
     "(value: 'true')"),
    (f"{RABBIT}rabbit_quorum_queue = true\namqp_auto_delete = true\n",
     "[oslo_messaging_rabbit] amqp_auto_delete: must be false with rabbit_quorum_queue = "
     "true: RabbitMQ refuses a quorum queue that deletes itself (value: 'true')"),
    (f"{RABBIT}conn_pool_min_size = 5\nrpc_conn_pool_size = 4\n",
     "[oslo_messaging_rabbit] rpc_conn_pool_size: must be at least conn_pool_min_size (5) "
     "(value: '4')"),
])
def test_rules_over_several_options(tmp_path, text, reason):
    assert refused(tmp_path, owned(text, tmp_path), placement_required=False).startswith(reason)


def test_the_quorum_settings_operators_use_pass(tmp_path):
    """docs/operations.md's recommended [oslo_messaging_rabbit] for a cluster."""
    load_config(conf_argv(tmp_path, f"{RABBIT}rabbit_quorum_queue = true\n"
                          "rabbit_transient_quorum_queue = true\n"
                          "rabbit_stream_fanout = true\nrabbit_qos_prefetch_count = 10\n"
                          "use_queue_manager = true\nheartbeat_timeout_threshold = 15\n"),
                placement_required=False)


def rabbit_tls(files: dict[str, str], ssl: bool = True, **named: str) -> str:
    """[oslo_messaging_rabbit] with ``ssl`` and each of ``named``
    (ssl_cert_file="cert": the file made as "cert")."""
    return (f"[oslo_messaging_rabbit]\nssl = {ssl}\n"
            + "".join(f"{option} = {files[made]}\n" for option, made in named.items()))


def test_a_client_certificate_and_its_key_pass(tmp_path, tls_files):
    load_config(conf_argv(tmp_path, rabbit_tls(tls_files, ssl_cert_file="cert",
                                               ssl_key_file="key", ssl_ca_file="ca")))


@pytest.mark.parametrize("named,reason", [
    ({"ssl_key_file": "key"}, "[oslo_messaging_rabbit] ssl_key_file: a key without "
     "ssl_cert_file, its certificate, is not used"),
    ({"ssl_cert_file": "ca", "ssl_key_file": "key"}, "[oslo_messaging_rabbit] "
     "ssl_key_file: not the key of ssl_cert_file's certificate"),
    ({"ssl_cert_file": "cert"}, "[oslo_messaging_rabbit] ssl_cert_file: no certificate "
     "and key OpenSSL can read here and in ssl_key_file"),
    ({"ssl_cert_file": "cert", "ssl_key_file": "encrypted"}, "[oslo_messaging_rabbit] "
     "ssl_key_file: an encrypted key: oslo.messaging gives no password for it"),
])
def test_a_client_certificate_that_does_not_load_is_refused(tmp_path, tls_files, named,
                                                            reason):
    """The driver loads the pair at each connection, and tried again for
    ever when it did not load; an encrypted key made OpenSSL prompt on the
    terminal."""
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", tls_files["key"], "-aes256", "-passout",
                    "pass:secret", "-out", str(encrypted)], check=True, timeout=30)
    files = {**tls_files, "encrypted": str(encrypted)}
    assert refused(tmp_path, rabbit_tls(files, **named), placement_required=False
                   ).startswith(reason)


def test_a_client_certificate_is_not_loaded_without_ssl(tmp_path, tls_files):
    load_config(conf_argv(tmp_path, rabbit_tls(tls_files, ssl=False, ssl_key_file="key")))


def test_a_plugin_that_refuses_its_options_says_so_in_its_words(tmp_path):
    line = refused(tmp_path, "[placement]\nauth_type = v3applicationcredential\n"
                   "auth_url = http://k/v3\napplication_credential_secret = s\n")
    assert line == ("[placement] auth_type: the plugin refuses its options: You must provide "
                    "either an application credential ID or an application credential name "
                    "and user. (value: 'v3applicationcredential')")


def test_the_log_file_is_in_a_directory_the_agent_may_write(tmp_path, monkeypatch):
    """Root writes anywhere, so the refusal is simulated."""
    logs = tmp_path / "logs"
    logs.mkdir()
    assert refused(tmp_path, f"log_file = {logs}\n", placement_required=False) == (
        f"[DEFAULT] log_file: a directory, not a file (value: '{logs}')")
    load_config(conf_argv(tmp_path, f"log_dir = {logs}\nlog_file = agent.log\n"))
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != logs
                        and access(path, mode))
    assert refused(tmp_path, f"log_dir = {logs}\nlog_file = agent.log\n",
                   placement_required=False) == (
        f"[DEFAULT] log_file: {logs} is not writable (value: 'agent.log')")


def test_metrics_are_served_on_an_address_of_this_host(tmp_path):
    line = refused(tmp_path, "[metrics]\nlisten = 192.0.2.1:9180\n", placement_required=False)
    assert line == ("[metrics] listen: cannot serve metrics there: not an address of this "
                    "host (value: '192.0.2.1:9180')")


def test_a_metrics_port_in_use_refuses_the_daemon_only(tmp_path):
    """Beside a running agent, its port is rightly in use: every command
    but the daemon takes it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = load_config(conf_argv(tmp_path, f"[metrics]\nlisten = 127.0.0.1:{port}\n"))
        with pytest.raises(ConfigError) as refusal:
            whole.metrics_port_free(conf)
    assert str(refusal.value) == (f"[metrics] listen: cannot serve metrics there: address "
                                  f"already in use (value: '127.0.0.1:{port}')")


# --- the sweep over every option of the sample --------------------------------

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
