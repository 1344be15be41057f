"""The inventories deploy-k26.yml runs with: read by ansible-inventory itself, never contacted.

Production must only name documentation addresses (RFC 5737 / RFC 3849), every catalog entry must
pass the catalog's spec (the lookup catalog_entry_problems), and every host's model must be in the
catalog. A misspelt key is refused by deploy-k26.yml before any task reaches a host.
"""
import ipaddress
import json
import os
import re
import subprocess

import pytest

from ansible_collections.modelwake.serving.plugins.lookup.catalog_entry_problems import entry_problems
from ansible_collections.modelwake.serving.plugins.lookup.host_models_problems import host_models_problems

from tests.helpers import ANSIBLE_PLAYBOOK as PLAYBOOK, ROOT, VENV_BIN

INVENTORY = os.path.join(VENV_BIN, "ansible-inventory")
DOC_NETS = [ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("198.51.100.0/24"),
            ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_network("2001:db8::/32")]


def inventory(name):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    out = subprocess.run([INVENTORY, "-i", os.path.join(ROOT, "inventories", name), "--list"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120,
                         check=True).stdout
    return json.loads(out)


def rendered(name, variables, extra=None):
    """{host: {variable: value}} of every host of the inventory, templated by Ansible as a play sees them
    (ansible-inventory shows a catalog entry's templates as written): debug runs on the controller, no host
    is contacted."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1")
    msg = "{{ {%s} }}" % ", ".join("'%s': %s" % (variable, variable) for variable in variables)
    argv = [os.path.join(VENV_BIN, "ansible"), "all", "-i", os.path.join(ROOT, "inventories", name),
            "-m", "ansible.builtin.debug", "-a", json.dumps({"msg": msg})]
    if extra:
        argv += ["-e", json.dumps(extra)]
    out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, timeout=120, check=True).stdout
    hosts = {}
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^(\S+) \| SUCCESS => ", out, re.M):  # the default callback's ad hoc result
        hosts[match.group(1)] = decoder.raw_decode(out, match.end())[0]["msg"]
    assert hosts, out
    return hosts


def test_production_addresses_are_documentation_only():
    hosts = inventory("production")["_meta"]["hostvars"]
    assert hosts
    for name, hostvars in hosts.items():
        address = ipaddress.ip_address(hostvars["ansible_host"])
        assert any(address in net for net in DOC_NETS), "%s has a real address %s" % (name, address)


@pytest.mark.parametrize("name", ["production", "demo", "vllm-cpu"])
def test_every_host_model_is_a_valid_catalog_entry(name):
    hosts = inventory(name)["_meta"]["hostvars"]
    # The demo's entry holds templates (the container demo's extra-vars): checked as a play sees it.
    catalogs = rendered(name, ["modelwake_models"]) if name == "demo" else {}
    for host, hostvars in hosts.items():
        if "modelwake_models" not in hostvars:
            continue
        catalog = catalogs[host]["modelwake_models"] if host in catalogs else hostvars["modelwake_models"]
        for key, entry in catalog.items():
            assert entry_problems(entry, key) == [], name
        assert hostvars.get("modelwake_host_models"), "%s: %s serves nothing" % (name, host)
        for model in hostvars["modelwake_host_models"]:
            assert model in catalog, "%s: %s serves %s, which is not in the catalog" % (name, host, model)
        assert host_models_problems(catalog, hostvars["modelwake_host_models"], host) == [], name


def test_production_models_the_k26_story():
    hostvars = inventory("production")["_meta"]["hostvars"]["k26-gpu01"]
    assert hostvars["modelwake_host_models"] == ["k26"]
    k26 = hostvars["modelwake_models"]["k26"]
    assert (k26["unit"], k26["port"], k26["tp"], k26["gpus"]) == ("sglang-k26", 30001, 8, list(range(8)))
    assert "sglang-k26-ddtree" in k26["conflicts"]
    units = set(m["unit"] for m in hostvars["modelwake_models"].values())
    assert {"sglang-k26-ddtree", "sglang-qwen36"} <= units


def test_demo_deploys_the_simulated_k26_on_30001():
    hostvars = inventory("demo")["_meta"]["hostvars"]["demo-k26"]
    assert hostvars["modelwake_host_models"] == ["k26"]
    k26 = hostvars["modelwake_models"]["k26"]
    assert (k26["engine"], k26["engine_package"], k26["unit"], k26["port"], k26["tp"]) == (
        "sglang", "modelwake-sim", "sglang-k26", 30001, 8)
    assert hostvars["modelwake_demo_model_shards"] == 64


def test_the_demos_entry_runs_from_the_venv_or_in_the_container_make_demo_names():
    # `make demo`: the venv; `make demo RUNTIME=podman|docker`: tools/guest_runtime.py's extra-vars.
    assert rendered("demo", ["modelwake_models"])["demo-k26"]["modelwake_models"]["k26"]["runtime"] == "venv"
    image_id = "sha256:" + "2e" * 32
    for runtime in ("podman", "docker"):
        extra = {"modelwake_demo_runtime": runtime, "modelwake_demo_image_id": image_id,
                 "modelwake_demo_image_archive": "/cache/podman/sim-image.tar",
                 # What playbooks/vars/catalog-entry.yml sets for the model a play deploys.
                 "modelwake_deploy": "{{ modelwake_models.k26 }}"}
        demo = rendered("demo", ["modelwake_models", "model_service_container_extra_args"], extra)["demo-k26"]
        k26 = demo["modelwake_models"]["k26"]
        assert entry_problems(k26, "k26") == []
        assert (k26["runtime"], k26["image_id"], k26["image_archive"]) == (runtime, image_id, extra["modelwake_demo_image_archive"])
        assert k26["container_command"] == ["python3", "-m", "modelwake_sim", "serve", "--engine", "sglang"]
        # Its --fake-gpus ranks write their holders where the host's scripted nvidia-smi reads them.
        assert demo["model_service_container_extra_args"] == ["--volume", "/run/modelwake-fake-gpu:/run/modelwake-fake-gpu"]


def deploy_unreachable_host(tmp_path, name, host_vars):
    """deploy-k26.yml against a host at a documentation address: any task that reached it would fail
    UNREACHABLE instead. Returns the output on one line."""
    inventory_file = tmp_path / "hosts.json"
    inventory_file.write_text(json.dumps({"all": {
        "children": {"model_hosts": {"hosts": {name: dict(host_vars, ansible_host="192.0.2.44")}}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK, "-i", str(inventory_file), os.path.join(ROOT, "deploy-k26.yml")], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=120)
    flat = " ".join(proc.stdout.split())
    assert proc.returncode == 2, flat
    return flat


def test_a_misspelt_catalog_key_is_refused_before_any_host_is_contacted(tmp_path):
    flat = deploy_unreachable_host(tmp_path, "gpu-typo", {"modelwake_deploy_model": "k26", "modelwake_models": {"k26": {
        "engine": "sglang", "engine_version": "0.5.9", "unit": "sglang-k26", "port": 30001,
        "model_path": "/srv/models/k26", "stall_timout": 300}}})
    assert ("The catalog entry is refused, nothing was changed: modelwake_models.k26.stall_timout is not a "
            "catalog key: did you mean stall_timeout?") in flat
    assert "gpu-typo : ok=1 changed=0 unreachable=0 failed=1" in flat, flat


def test_models_sharing_gpus_or_a_port_are_refused_before_any_host_is_contacted(tmp_path):
    entry = {"engine": "sglang", "engine_version": "0.5.9", "model_path": "/srv/models/m", "tp": 2}
    flat = deploy_unreachable_host(tmp_path, "gpu-crowded", {
        "modelwake_host_models": ["big", "small"],
        "modelwake_models": {"big": dict(entry, unit="sglang-big", port=30001, gpus=[0, 1]),
                             "small": dict(entry, unit="sglang-small", port=30001, gpus=[1, 2])}})
    assert ("The host's models are refused, nothing was changed: modelwake_host_models on gpu-crowded: big and "
            "small both listen on port 30001 (modelwake_models.big.port, modelwake_models.small.port): give each "
            "model its own port; modelwake_host_models on gpu-crowded: big and small both use GPU 1") in flat, flat
    assert "gpu-crowded : ok=2 changed=0 unreachable=0 failed=1" in flat, flat
