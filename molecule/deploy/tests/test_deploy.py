"""What deploy-k26.yml must leave on each guest (testinfra): one fact per test."""
import json
import os
import re

SECRET = "mol-deploy-secret-4b1d"
UNIT = "sglang-k26"


def test_unit_is_active_and_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled


def test_engine_runs_as_the_non_root_service_user(host):
    main_pid = host.check_output("systemctl show %s -p MainPID --value" % UNIT)
    assert host.check_output("ps -o user= -p %s" % main_pid) == "modelwake"
    assert host.user("modelwake").shell == "/usr/sbin/nologin"


def test_environment_file_is_root_only_and_the_key_in_sglangs_own_file(host):
    env = host.file("/etc/modelwake/%s.env" % UNIT)
    assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
    # SGLang takes its key only from --config's YAML: readable by the engine's group, never writable.
    config = host.file("/etc/modelwake/%s.sglang.yaml" % UNIT)
    assert (config.user, config.group, config.mode) == ("root", "modelwake", 0o640)
    assert 'api-key: "%s"' % SECRET in config.content_string.splitlines()


def test_key_is_in_no_unit_property_and_no_command_line(host):
    assert SECRET not in host.check_output("systemctl show %s" % UNIT)
    assert SECRET not in host.file("/etc/systemd/system/%s.service" % UNIT).content_string
    cmdlines = host.check_output("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert SECRET not in cmdlines


def test_unit_hardening_and_kill_mode(host):
    show = host.check_output("systemctl show %s -p KillMode -p Restart -p NoNewPrivileges -p ProtectSystem "
                             "-p PrivateTmp -p User" % UNIT).splitlines()
    assert set(show) == {"KillMode=control-group", "Restart=always", "NoNewPrivileges=yes",
                         "ProtectSystem=strict", "PrivateTmp=yes", "User=modelwake"}


def test_completion_needs_the_key_and_answers_with_it(host):
    script = (
        "import json, urllib.request, urllib.error\n"
        "def ask(key):\n"
        "    req = urllib.request.Request('http://127.0.0.1:30001/v1/completions', method='POST',\n"
        "        data=json.dumps({'model': '/srv/models/Kimi-K2.6-sim', 'prompt': '2+2=', 'max_tokens': 4,"
        " 'temperature': 0}).encode(),\n"
        "        headers=dict({'Content-Type': 'application/json'}, **({'Authorization': 'Bearer ' + key} if key else {})))\n"
        "    try:\n"
        "        with urllib.request.urlopen(req, timeout=30) as r: return r.status, json.load(r)\n"
        "    except urllib.error.HTTPError as e: return e.code, None\n"
        "print(json.dumps([ask(None), ask('%s')]))\n" % SECRET)
    without, with_key = json.loads(host.check_output("python3 -c %s", script))
    assert without[0] == 401
    assert with_key[0] == 200 and with_key[1]["choices"][0]["text"].strip() == "4"


def test_every_engine_process_lives_in_the_unit_cgroup(host):
    # KillMode=control-group stops what is in the cgroup: the API process, all 8 TP ranks (and the
    # launcher, when the unit runs under it) must be there.
    api = host.check_output("pgrep -u modelwake -f '^/opt/modelwake/venv/bin/python -m modelwake_sim serve'").split()
    ranks = host.check_output("pgrep -u modelwake -f '^sglang::scheduler_TP[0-7]'").split()  # titled like SGLang's
    assert len(api) == 1 and len(ranks) == 8
    for pid in host.check_output("pgrep -u modelwake").split():
        assert "/system.slice/%s.service" % UNIT in host.file("/proc/%s/cgroup" % pid).content_string


def test_rolling_restart_went_host_by_host():
    log_path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "rolling-restart.log")
    with open(log_path) as handle:
        log = handle.read()
    # One play per host (serial: 1); each host's wait ends before the next host's restart begins.
    events = re.findall(r"(RUNNING HANDLER \[model_service : (?:Restart the model service|Wait for the restarted "
                        r"model service to be ready)\][^\n]*\n(?:changed|ok): \[(mol-dep-\d)\])", log)
    order = [(("restart" if "Restart the model" in text else "wait"), name) for text, name in events]
    assert order == [("restart", "mol-dep-1"), ("wait", "mol-dep-1"), ("restart", "mol-dep-2"), ("wait", "mol-dep-2")]
