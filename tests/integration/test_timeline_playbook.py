"""playbooks/timeline.yml by real Ansible: fetch a host's progress file, render it on the controller."""
import json
import os
import shutil
import subprocess
import sys

from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, FIXTURES, ROOT

FIXTURE = os.path.join(FIXTURES, "timeline", "sglang-start.jsonl")
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


def run(tmp_path, extra):
    inventory = tmp_path / "hosts"
    inventory.write_text("tl-host ansible_connection=local ansible_python_interpreter=%s\n" % sys.executable)
    extra = dict({"modelwake_deploy_hosts": "tl-host", "modelwake_timeline_out": str(tmp_path / "out")}, **extra)
    return subprocess.run([PLAYBOOK, "-i", str(inventory), os.path.join(ROOT, "playbooks", "timeline.yml"),
                           "-e", json.dumps(extra)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=180)


def test_fetches_and_renders_png_and_html(tmp_path):
    on_host = tmp_path / "host" / "k26-progress.jsonl"
    on_host.parent.mkdir()
    shutil.copy(FIXTURE, str(on_host))
    proc = run(tmp_path, {"modelwake_timeline_progress_path": str(on_host)})
    assert proc.returncode == 0, proc.stdout
    out = tmp_path / "out"
    assert (out / "tl-host-progress.jsonl").read_text() == on_host.read_text()
    assert (out / "tl-host-timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "tl-host-timeline.html").read_text()
    assert "tl-host: k26-progress.jsonl" in page and "data:image/png;base64," in page


def test_without_a_progress_path_it_says_how_to_give_one(tmp_path):
    proc = run(tmp_path, {})
    assert proc.returncode != 0
    assert "modelwake_timeline_progress_path is empty" in proc.stdout
    assert not (tmp_path / "out").exists()
