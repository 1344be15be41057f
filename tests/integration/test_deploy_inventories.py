"""The inventories deploy-k26.yml runs with: read by ansible-inventory itself, never contacted.

Production must only name documentation addresses (RFC 5737 / RFC 3849), every catalog entry must
pass the catalog's spec (the lookup catalog_entry_problems), and every host's model must be in the
catalog. A misspelt key is refused by deploy-k26.yml before any task reaches a host.
"""
import ipaddress
import json
import os
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


def test_production_addresses_are_documentation_only():
    hosts = inventory("production")["_meta"]["hostvars"]
    assert hosts
    for name, hostvars in hosts.items():
        address = ipaddress.ip_address(hostvars["ansible_host"])
        assert any(address in net for net in DOC_NETS), "%s has a real address %s" % (name, address)


@pytest.mark.parametrize("name", ["production", "demo", "vllm-cpu"])
def test_every_host_model_is_a_valid_catalog_entry(name):
    hosts = inventory(name)["_meta"]["hostvars"]
    for host, hostvars in hosts.items():
        if "modelwake_models" not in hostvars:
            continue
        catalog = hostvars["modelwake_models"]
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
