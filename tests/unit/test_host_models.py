"""host_models_problems: the models one host serves must fit side by side, refused before any change."""
from ansible_collections.modelwake.serving.plugins.lookup.host_models_problems import host_models_problems

BASE = {"engine": "sglang", "engine_version": "0.5.23", "model_path": "/srv/models/m"}
CATALOG = {
    "k26": dict(BASE, unit="sglang-k26", port=30001, gpus=[0, 1, 2, 3, 4, 5, 6, 7], conflicts=["sglang-qwen36"]),
    "qwen36": dict(BASE, unit="sglang-qwen36", port=30002, gpus=[0], conflicts=["sglang-k26"]),
    "left": dict(BASE, unit="sglang-left", port=30011, gpus=[0, 1, 2, 3]),
    "right": dict(BASE, unit="sglang-right", port=30012, gpus=[4, 5, 6, 7]),
}


def problems(models, **changes):
    catalog = {name: dict(entry, **changes.get(name, {})) for name, entry in CATALOG.items()}
    return host_models_problems(catalog, models, "gpu01")


def test_models_on_their_own_gpus_ports_and_units_fit():
    assert problems(["left", "right"]) == []
    assert problems(["k26"]) == []
    assert problems([]) == []


HOW = ("give each model its own GPUs, serve them from different hosts, or set share_gpus: true in both entries "
       "to share them, started one at a time")


def test_the_same_gpu_is_refused_naming_both_models_and_the_gpu():
    found = problems(["left", "right"], right={"gpus": [3, 4]})
    assert found == ["modelwake_host_models on gpu01: left and right both use GPU 3 (modelwake_models.left.gpus, "
                     "modelwake_models.right.gpus): " + HOW]


def test_an_empty_gpu_list_is_every_gpu_of_the_host_beside_a_list_and_beside_another_empty_one():
    # The roles read an empty list as every GPU (gpu_preflight, model_service, the launcher's turns): so does the check.
    found = problems(["left", "right"], left={"gpus": []})
    assert found == ["modelwake_host_models on gpu01: left and right both use GPU 4, 5, 6, 7 (modelwake_models.left.gpus, "
                     "modelwake_models.right.gpus; an empty left.gpus: every GPU of the host): " + HOW]
    found = problems(["left", "right"], left={"gpus": []}, right={"gpus": None})
    assert found == ["modelwake_host_models on gpu01: left and right both use every GPU of the host "
                     "(modelwake_models.left.gpus, modelwake_models.right.gpus; an empty left.gpus and an empty "
                     "right.gpus: every GPU of the host): " + HOW]
    absent = {name: {key: value for key, value in CATALOG[name].items() if key != "gpus"} for name in ("left", "right")}
    assert host_models_problems(absent, ["left", "right"], "gpu01") == [found[0]]


def test_models_share_gpus_only_when_both_entries_say_so():
    shared = {"left": {"gpus": [], "share_gpus": True}, "right": {"share_gpus": True}}
    assert problems(["left", "right"], **shared) == []
    assert problems(["left", "right"], left={"gpus": [3], "share_gpus": True}, right={"gpus": [3], "share_gpus": True}) == []
    # One entry alone does not decide for the other; a string is not true.
    assert len(problems(["left", "right"], left={"gpus": [], "share_gpus": True})) == 1
    assert len(problems(["left", "right"], left={"gpus": [], "share_gpus": "yes"}, right={"share_gpus": True})) == 1
    # Sharing GPUs does not let them share a port or a unit.
    found = problems(["left", "right"], left=dict(shared["left"], port=30012), right=shared["right"])
    assert len(found) == 1 and "both listen on port 30012" in found[0], found


def test_the_same_port_and_the_same_unit_are_refused():
    found = problems(["left", "right"], right={"port": 30011, "unit": "sglang-left"})
    assert len(found) == 2
    assert "left and right are both unit sglang-left" in found[0]
    assert "left and right both listen on port 30011" in found[1] and "give each model its own port" in found[1]


def test_models_that_conflict_replace_each_other():
    found = problems(["k26", "qwen36"])
    assert any("k26 and qwen36 conflict" in line for line in found), found
    assert any("both use GPU 0" in line for line in found), found


def test_a_shared_venv_must_hold_one_engine_release():
    found = problems(["left", "right"], right={"engine_version": "0.5.24"})
    assert found == ["modelwake_host_models on gpu01: left and right share the venv /opt/modelwake/venv but want "
                     "different engine_version: give one of them its own modelwake_models.NAME.venv"]
    assert problems(["left", "right"], right={"engine_version": "0.5.24", "venv": "/opt/modelwake/right"}) == []


def test_unknown_and_repeated_names_and_a_non_list():
    assert problems(["left", "nope", "left"]) == [
        "modelwake_host_models on gpu01: nope is not in the model catalog (modelwake_models: k26, left, qwen36, right)",
        "modelwake_host_models on gpu01 lists left twice"]
    assert host_models_problems(CATALOG, "left", "gpu01") == [
        "modelwake_host_models on gpu01 must be a list of catalog names, got 'left'"]
