"""The inventories deploy-k26.yml runs with: read by ansible-inventory itself, never contacted.

Production must only name documentation addresses (RFC 5737 / RFC 3849), every catalog entry must
carry the keys playbooks/vars/catalog-entry.yml maps, and every host's model must be in the catalog.
"""
import ipaddress
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INVENTORY = os.path.join(ROOT, ".venv", "bin", "ansible-inventory")
DOC_NETS = [ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("198.51.100.0/24"),
            ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_network("2001:db8::/32")]
REQUIRED = {"engine", "unit", "port", "model_path"}


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


@pytest.mark.parametrize("name", ["production", "demo"])
def test_every_host_model_is_a_complete_catalog_entry(name):
    hosts = inventory(name)["_meta"]["hostvars"]
    for host, hostvars in hosts.items():
        if "modelwake_models" not in hostvars:
            continue
        catalog = hostvars["modelwake_models"]
        for key, entry in catalog.items():
            assert REQUIRED <= set(entry), "%s: modelwake_models.%s lacks %s" % (name, key, REQUIRED - set(entry))
            assert entry["engine"] in ("sglang", "vllm", "sim")
        for model in hostvars.get("modelwake_host_models", []) + [hostvars.get("modelwake_deploy_model")]:
            assert model in catalog, "%s: %s serves %s, which is not in the catalog" % (name, host, model)


def test_production_models_the_k26_story():
    hostvars = inventory("production")["_meta"]["hostvars"]["k26-gpu01"]
    k26 = hostvars["modelwake_models"][hostvars["modelwake_deploy_model"]]
    assert (k26["unit"], k26["port"], k26["tp"], k26["gpus"]) == ("sglang-k26", 30001, 8, list(range(8)))
    assert "sglang-k26-ddtree" in k26["conflicts"]
    units = set(m["unit"] for m in hostvars["modelwake_models"].values())
    assert {"sglang-k26-ddtree", "sglang-qwen36"} <= units


def test_demo_deploys_the_simulated_k26_on_30001():
    hostvars = inventory("demo")["_meta"]["hostvars"]["demo-k26"]
    k26 = hostvars["modelwake_models"][hostvars["modelwake_deploy_model"]]
    assert (k26["engine"], k26["sim_protocol"], k26["unit"], k26["port"], k26["tp"]) == ("sim", "sglang", "sglang-k26",
                                                                                         30001, 8)
    assert hostvars["modelwake_demo_model_shards"] == 64
