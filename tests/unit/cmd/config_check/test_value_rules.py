"""The start-up check's rules, one by one (the sweep in
test_whole.py runs them over every option of the sample)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check import names, options, value_rules
from compute_agent.cmd.errors import BadValue
from compute_agent.exception import ConfigError
from compute_agent.store.errors import StoreError
from compute_agent.store.inspection import inspect_store
from tests.tls import Authority

# Stands for a path under the test's own tmp_path that nothing creates: an
# absolute path such as /nonexistent may exist on a shared machine.
ABSENT = "<absent>"


def owned(value, tmp_path: Path):
    """``value`` with ABSENT made tmp_path / "absent"."""
    return value.replace(ABSENT, str(tmp_path / "absent")) if isinstance(value, str) else value


GOOD = {
    value_rules.absolute_path: ["/var/lib/compute-agent"],
    value_rules.existing_directory: ["/tmp"],
    value_rules.readable_file: ["/etc/hostname", ""],
    value_rules.certificate_authorities: [""],
    value_rules.state_directory: ["/tmp", f"{ABSENT}/not/yet/there"],
    value_rules.host_name: ["compute-1.example.org", "host_1"],
    value_rules.http_url: ["http://127.0.0.1:8778", "https://keystone.example.org/v3"],
    value_rules.transport_url: ["rabbit://", "rabbit://u:p@h1:5672,u:p@h2:5672/vhost", "fake://"],
    value_rules.libvirt_uri: ["qemu:///system", "qemu+ssh://root@h/system", "test:///default"],
    value_rules.record_format: ["%(asctime)s %(levelname)s %(message)s",
                                "%(funcName)s %(lineno)d"],
    value_rules.context_record_format: [
        "%(asctime)s [%(request_id)s %(user_identity)s] %(message)s"],
    value_rules.user_identity_format: ["%(user)s %(project)s %(domain)s"],
    value_rules.instance_format: ["[instance: %(uuid)s] "],
    value_rules.file_to_write: ["/tmp/fake-state.json", f"{ABSENT}"],
    value_rules.log_levels: [["amqp=WARN", "oslo.messaging=INFO"]],
    value_rules.syslog_facility: ["LOG_USER", "local0"],
    value_rules.queue_name: ["openstack", "compute-agent.v1"],
    value_rules.queue_names: [["notifications"]],
    value_rules.notification_drivers: [["messagingv2", "noop"]],
    value_rules.rabbit_ssl_version: ["", "tlsv1_2"],
    value_rules.kombu_compression: ["gzip"],
    value_rules.kafka_sasl_mechanism: ["PLAIN"],
    value_rules.tls_ciphers: ["HIGH:!aNULL"],
    value_rules.service_type: ["placement"],
    value_rules.endpoint_interfaces: [["internal", "public"]],
    value_rules.api_version: ["1.0", "latest"],
    value_rules.http_status_codes: [[503, 502]],
    value_rules.rpc_version: ["1.0", "1.1"],
    value_rules.keystone_system_scope: ["all"],
    value_rules.listen_address: ["127.0.0.1:9180", "0.0.0.0:1", "metrics.example.org:65535",
                                 "[::1]:9180", "[::]:9180"],
}
BAD = {
    value_rules.absolute_path: ["relative", " ", "/tmp/" + "x" * 256, "/x" * 2048],
    value_rules.existing_directory: [ABSENT, "/etc/hostname"],
    value_rules.readable_file: [ABSENT, "/tmp", "/tmp/" + "x" * 256],
    value_rules.certificate_authorities: [ABSENT, "/tmp", "/etc/hostname"],
    value_rules.state_directory: ["relative", "/etc/hostname", "/etc/hostname/x"],
    value_rules.host_name: ["", "a b", "x" * 101, "-x/y"],
    value_rules.http_url: ["", "127.0.0.1:8778", "ftp://h/", "http://h:0/", "http://h:70000/"],
    value_rules.transport_url: ["h:5672", "amqp1://h/", "rabbit://h:0/", "rabbit://h:x/",
                                "rabbit://bad host/", "kafka://h:9092/"],
    value_rules.libvirt_uri: ["", "qemu", "xen:///system", "qemu+bogus://h/system"],
    value_rules.record_format: ["%(", "%(x)q", "%(nosuchkey)s", "%(request_id)s", "%(message)d"],
    value_rules.context_record_format: ["%(nosuchkey)s"],
    value_rules.user_identity_format: ["%(message)s"],
    value_rules.instance_format: ["%(name)s"],
    value_rules.file_to_write: ["relative", "/tmp", f"{ABSENT}/no/such/dir/file", "/" + "x" * 256],
    value_rules.log_levels: [["amqp"], ["amqp=LOUD"], ["=INFO"]],
    value_rules.syslog_facility: ["LOG_NOPE"],
    value_rules.queue_name: ["", "a b"],
    value_rules.queue_names: [[], ["a b"]],
    value_rules.notification_drivers: [["nope"]],
    value_rules.rabbit_ssl_version: ["tlsv9"],
    value_rules.kombu_compression: ["zip"],
    value_rules.kafka_sasl_mechanism: ["plain"],
    value_rules.tls_ciphers: ["NOPE"],
    value_rules.service_type: ["", "Placement"],
    value_rules.endpoint_interfaces: [[], ["private"]],
    value_rules.api_version: ["", "one"],
    value_rules.http_status_codes: [[99], [600]],
    value_rules.rpc_version: ["", "2.0", "abc"],
    value_rules.keystone_system_scope: ["some"],
    value_rules.listen_address: ["", "9180", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536",
                                 "::1:9180", "[::1]", "[::g]:9180", "a b:9180"],
}


@pytest.mark.parametrize("rule,value", [(r, v) for r, vs in GOOD.items() for v in vs])
def test_a_rule_takes_a_good_value(rule, value, tmp_path):
    rule(owned(value, tmp_path))


@pytest.mark.parametrize("rule,value", [(r, v) for r, vs in BAD.items() for v in vs])
def test_a_rule_refuses_a_bad_value(rule, value, tmp_path):
    with pytest.raises(BadValue):
        rule(owned(value, tmp_path))


def test_every_rule_is_tested():
    assert set(value_rules.VALUE_RULES.values()) <= set(GOOD) & set(BAD)


def test_a_url_is_shown_with_its_passwords_masked():
    assert options.masked_url("rabbit://a:pw1@h1:5672,b:pw2@h2/v") == (
        "rabbit://a:***@h1:5672,b:***@h2/v")


def conf_file(tmp_path, text: str) -> list[str]:
    host = tmp_path / "host.yaml"
    host.write_text("numa_cells: [{id: 0, cpus: '0-3', memory_mb: 4096}]\n")
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path}/state\ncompute_driver = fake\n"
                    f"[fake]\nhost_file = {host}\n[DEFAULT]\n" + text)
    return ["--config-file", str(path)]


def refused(tmp_path, text: str, placement_required: bool = True) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(conf_file(tmp_path, text), placement_required=placement_required)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_auth_type_is_required_only_where_placement_is_used(tmp_path):
    assert refused(tmp_path, "").startswith("[placement] auth_type: missing")
    load_config(conf_file(tmp_path, ""), placement_required=False)


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
    load_config(conf_file(tmp_path, "[placement]\nauth_type = password\n"
                          "auth_url = http://k/v3\nusername = u\npassword = p\n"
                          "default_domain_name = Default\nproject_name = service\n"),
                placement_required=True)


def test_auth_options_may_live_in_an_auth_section(tmp_path):
    load_config(conf_file(tmp_path, "[placement]\nauth_section = keystone\n"
                          "[keystone]\nauth_type = placement_noauth2\n"
                          "endpoint = http://127.0.0.1:1\n"), placement_required=True)
    assert refused(tmp_path, "[placement]\nauth_section = nowhere\n").startswith(
        "[placement] auth_section: no such section")


def test_a_secret_is_never_shown(tmp_path):
    line = refused(tmp_path, "[oslo_messaging_kafka]\nssl_client_key_password = x\n"
                   "[placement]\nauth_type = password\nauth_url = nope\n"
                   "password = s3cret\nusername = u\n")
    assert line.startswith("[placement] auth_url:") and "s3cret" not in line
    option = options.Option("placement", cfg.StrOpt("password", secret=True))
    conf = load_config(conf_file(tmp_path, "[placement]\npassword = s3cret\n"))
    assert str(value_rules.refusal(conf, option, "bad")).endswith("(value: ***)")


def test_an_empty_number_is_refused_where_unset_is_not_the_default(tmp_path):
    line = refused(tmp_path, "update_interval =\n", placement_required=False)
    assert line.startswith("[DEFAULT] update_interval: empty")


def test_a_bad_value_of_a_command_line_option_in_a_file_names_it(tmp_path):
    line = refused(tmp_path, "debug = maybe\n", placement_required=False)
    assert line == "[DEFAULT] debug: Invalid Boolean (value: 'maybe')"


def test_fuzz_bug_an_empty_value_of_a_command_line_option_in_a_file_names_it(tmp_path):
    """Found by tests/reliability: oslo.config's message then ends in
    "value: ", which did not match, so the command exited 1 with
    oslo.config's own words instead of the one line and exit 2."""
    line = refused(tmp_path, "debug =\n", placement_required=False)
    assert line == "[DEFAULT] debug: Invalid Boolean (value: '')"


def test_fuzz_bug_a_config_file_not_in_utf8_names_the_file(tmp_path):
    """Found by tools/reliability (fuzz, config files): a value written as
    an unpaired surrogate (bytes ED A0 80) escaped oslo.config's parse as a
    UnicodeDecodeError traceback, not the one line and exit 2."""
    argv = conf_file(tmp_path, "")
    path = Path(argv[1])
    path.write_bytes(path.read_bytes() + b"update_interval = \xed\xa0\x80\n")
    with pytest.raises(ConfigError) as e:
        load_config(argv, placement_required=False)
    assert str(e.value).startswith(f"{path}: not UTF-8 text (invalid continuation byte "
                                   "at byte ")


def test_fuzz_bug_a_config_dir_that_cannot_be_read_is_named(tmp_path):
    """Found by tools/reliability (fuzz, config files): a config_dir whose
    name is too long for the kernel escaped as an OSError traceback."""
    line = refused(tmp_path, f"config_dir = {'9' * 300}\n", placement_required=False)
    assert line.startswith("[DEFAULT] config_dir: cannot be read (File name too long) "
                           "(value: '999")


@pytest.mark.parametrize("text,reason", [
    (f"log_file = {ABSENT}/dir/agent.log\n", "[DEFAULT] log_file: no such directory"),
    ("config_source = remote\n", "[DEFAULT] config_source: no section [remote]"),
    ("compute_driver = fake\n[fake]\nhost_file =\n", "[fake] host_file: missing"),
    ("[placement]\nversion = 1.0\nmax_version = 1.0\n", "[placement] version: give"),
])
def test_rules_over_several_options(tmp_path, text, reason):
    assert refused(tmp_path, owned(text, tmp_path), placement_required=False).startswith(reason)


@pytest.fixture
def tls_files(tmp_path) -> dict[str, str]:
    """A CA, and a client's certificate and key it signed, as PEM files."""
    authority = Authority.make(tmp_path / "tls", "test-ca")
    client = authority.issue(tmp_path / "tls", "agent")
    return {"ca": str(authority.certificate), "cert": str(client.certificate),
            "key": str(client.key)}


def test_a_ca_file_takes_a_pem_ca_and_refuses_a_key(tls_files):
    value_rules.certificate_authorities(tls_files["ca"])
    with pytest.raises(BadValue, match="no CA certificate OpenSSL can read"):
        value_rules.certificate_authorities(tls_files["key"])


def rabbit_tls(files: dict[str, str], ssl: bool = True, **named: str) -> str:
    """[oslo_messaging_rabbit] with ``ssl`` and each of ``named``
    (ssl_cert_file="cert": the file made as "cert")."""
    return (f"[oslo_messaging_rabbit]\nssl = {ssl}\n"
            + "".join(f"{option} = {files[made]}\n" for option, made in named.items()))


def test_a_client_certificate_and_its_key_pass(tmp_path, tls_files):
    load_config(conf_file(tmp_path, rabbit_tls(tls_files, ssl_cert_file="cert",
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
    load_config(conf_file(tmp_path, rabbit_tls(tls_files, ssl=False, ssl_key_file="key")))


def test_a_store_in_the_place_of_a_directory_is_named(tmp_path):
    (tmp_path / "state.db").mkdir()
    with pytest.raises(StoreError, match=r"store .*state.db: cannot be opened: not a "
                                         r"regular file"):
        inspect_store(tmp_path / "state.db")


def test_a_store_the_agent_may_not_read_is_named(tmp_path, monkeypatch):
    """Root reads any file, so the refusal is simulated."""
    path = tmp_path / "state.db"
    path.write_bytes(b"x")
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(StoreError, match=r"state.db: cannot be opened: permission denied"):
        inspect_store(path)


@pytest.mark.parametrize("a,b,distance", [
    ("pmem", "pmem", 0), ("pmemm", "pmem", 1), ("enabled_mdev_type", "enabled_mdev_types", 1),
    ("debgu", "debug", 1), ("api", "pci", 2), ("update_interval_max", "update_interval", 4),
    ("", "abc", 3),
])
def test_edit_distance_counts_each_typing_slip_once(a, b, distance):
    assert names.edit_distance(a, b) == names.edit_distance(b, a) == distance


@pytest.mark.parametrize("name,known", [
    ("pmemm", "pmem"), ("enabled_mdev_type", "enabled_mdev_types"),
    ("UPDATE_INTERVAL", "update_interval"), ("default", "DEFAULT"),
    ("reconcile_intreval", "reconcile_interval"), ("pcii", "pci"),
    # Not misspellings: a short name of another service, and a newer
    # version's name that extends one of ours.
    ("api", None), ("update_interval_max", None), ("newer_feature", None),
])
def test_a_misspelling_is_a_typing_slip_or_two_from_a_name_read(name, known):
    read = ["pmem", "pci", "DEFAULT", "devices", "enabled_mdev_types", "update_interval",
            "reconcile_interval", "update_jitter"]
    assert names.misspelling_of(name, read) == known


def unknown(tmp_path, text: str) -> list[tuple[str, str | None, str | None]]:
    """The names read as the check reads them, unchecked otherwise."""
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf(conf_file(tmp_path, text + "[placement]\nauth_type = placement_noauth2\n"))
    return [(u.where(), u.known, u.file) for u in names.unknown_names(conf)]


def test_every_name_the_agent_reads_is_known(tmp_path):
    """Ours, a deprecated (nova's) name, oslo.log's, oslo.messaging's and
    its drivers', keystoneauth's and the chosen plugin's, [mdev_<type>]
    of an enabled type, and a section a config_source names."""
    assert unknown(tmp_path, "reserved_host_memory_mb = 512\ndebug = true\n"
                   "config_source = remote\n"
                   "[pci]\npassthrough_whitelist = {\"vendor_id\": \"8086\"}\n"
                   "[oslo_messaging_rabbit]\nheartbeat_rate = 3\n"
                   "[oslo_messaging_kafka]\nconsumer_group = agents\n"
                   "[devices]\nenabled_mdev_types = nvidia-35\n"
                   "[mdev_nvidia-35]\ndevice_addresses = 0000:81:00.0\n"
                   "[remote]\ndriver = remote_file\nuri = http://config/agent.conf\n"
                   "[Placement]\ntimeout = 10\n") == []


def test_unknown_names_are_listed_and_only_a_misspelling_names_a_known_one(tmp_path):
    path = str(tmp_path / "agent.conf")
    assert unknown(tmp_path, "update_interval_max = 5\n[devices]\nenabled_mdev_type = a\n"
                   "[mdev_nvidia-36]\nmdev_class = VGPU\n[newer]\nx = 1\n"
                   "[placement]\nusername = other-plugin\n") == [
        ("[DEFAULT] update_interval_max", None, path),
        ("[devices] enabled_mdev_type", "enabled_mdev_types", path),
        ("[mdev_nvidia-36]", None, path),
        ("[newer]", None, path),
        ("[placement] username", None, path),
    ]


def test_a_misspelt_name_is_refused_before_any_value(tmp_path):
    line = refused(tmp_path, "update_interval = 0\n[pmemm]\nnamespaces = L:ns0\n")
    assert line == f"{tmp_path / 'agent.conf'}: [pmemm]: unknown section; did you mean [pmem]?"


def test_the_unknown_names_line_is_one_line_of_at_most_300_characters():
    unknown = [names.UnknownName("/etc/compute-agent/compute-agent.conf", f"section_{i}")
               for i in range(100)]
    line = names.unknown_names_line(unknown)
    assert len(line) == 300 and line.endswith("... (100 names in all)")
