"""The start-up check's rules on one value (compute_agent/cmd/config_check/
value_rules.py), one by one (the sweep in test_whole.py runs them over every
option of the sample), and the one line of a refusal."""
from __future__ import annotations

import pytest
from oslo_config import cfg

from compute_agent.cmd.common import load_config
from compute_agent.cmd.config_check import options, value_rules
from compute_agent.cmd.errors import BadValue
from tests.unit.cmd.config_check.configs import ABSENT, conf_argv, owned, refused

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


def test_a_secret_is_never_shown(tmp_path):
    line = refused(tmp_path, "[oslo_messaging_kafka]\nssl_client_key_password = x\n"
                   "[placement]\nauth_type = password\nauth_url = nope\n"
                   "password = s3cret\nusername = u\n")
    assert line.startswith("[placement] auth_url:") and "s3cret" not in line
    option = options.Option("placement", cfg.StrOpt("password", secret=True))
    conf = load_config(conf_argv(tmp_path, "[placement]\npassword = s3cret\n"))
    assert str(value_rules.refusal(conf, option, "bad")).endswith("(value: ***)")


def test_an_empty_number_is_refused_where_unset_is_not_the_default(tmp_path):
    line = refused(tmp_path, "update_interval =\n", placement_required=False)
    assert line.startswith("[DEFAULT] update_interval: empty")


def test_a_ca_file_takes_a_pem_ca_and_refuses_a_key(tls_files):
    value_rules.certificate_authorities(tls_files["ca"])
    with pytest.raises(BadValue, match="no CA certificate OpenSSL can read"):
        value_rules.certificate_authorities(tls_files["key"])


def host_conf(tmp_path, host: str) -> cfg.ConfigOpts:
    """A config with [DEFAULT] host written as ``host``, read, unchecked."""
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nhost = {host}\n")
    conf = cfg.ConfigOpts()
    conf.register_opt(cfg.StrOpt("host"))
    conf(["--config-file", str(path)])
    return conf


def test_a_long_value_quoted_by_the_reason_is_shown_once_and_cut(tmp_path):
    long = "h" * 120
    conf = host_conf(tmp_path, long)
    option = options.Option("DEFAULT", cfg.StrOpt("host"))
    line = str(value_rules.refusal(conf, option, f"{long!r} is not a host name"))
    assert line == (f"[DEFAULT] host: the value is not a host name (value: '{'h' * 76}... "
                    "(120 characters))")


def test_a_long_reason_is_cut_to_keep_the_refusal_one_line_of_its_length(tmp_path):
    conf = host_conf(tmp_path, "h1")
    option = options.Option("DEFAULT", cfg.StrOpt("host"))
    line = str(value_rules.refusal(conf, option, "because " * 100))
    assert len(line) == value_rules.REFUSAL_LENGTH
    assert line.startswith("[DEFAULT] host: because because ")
    assert line.endswith("... (value: 'h1')")


def test_a_substitution_of_an_option_nobody_has_is_refused_naming_it(tmp_path):
    line = refused(tmp_path, "host = $no_such_option\n", placement_required=False)
    assert line.startswith("[DEFAULT] host: ") and "no_such_option" in line
