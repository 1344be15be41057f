"""GPU holders in containers (preflight/containers.py): NVML lists their host PIDs; the preflight names the
container beside each (from the cgroup's libpod-<id>, or, with Podman's --cgroups=disabled, from the PID
namespace its first process shares), and who may be stopped is still decided by the unit alone.

/proc is a directory tree written by the test (cgroups, and ns/pid as symlinks like the kernel's); the
container list stands in for `podman ps --format json`, and Docker's `docker ps` and `docker inspect` answer
from a script.
"""
import json
import os

from ansible_collections.modelwake.serving.plugins.module_utils.preflight import containers, holders
from ansible_collections.modelwake.serving.plugins.module_utils.host.gpu import GpuReader
from tests.helpers.fakes import ScriptedRun, fresh_nvml_api
from tests.unit.test_gpu_preflight_logic import write_proc

ID_A = "a" * 12 + "0123456789abcdef" * 3 + "b" * 4
ID_B = "c" * 64
HOST_NS = "pid:[4026531836]"


def with_namespace(proc, pid, namespace):
    ns = proc / str(pid) / "ns"
    ns.mkdir(parents=True, exist_ok=True)
    os.symlink(namespace, str(ns / "pid"))


def test_container_id_from_the_cgroup_paths_of_podman_and_docker():
    assert containers.container_id_from_cgroup("0::/machine.slice/libpod-%s.scope\n" % ID_A) == ID_A
    # --cgroups=split: the engine in a sub-cgroup of the unit's.
    assert containers.container_id_from_cgroup("0::/system.slice/sglang-k26.service/libpod-payload-%s\n" % ID_B) == ID_B
    assert containers.container_id_from_cgroup("0::/system.slice/docker-%s.scope\n" % ID_B) == ID_B
    # Docker's cgroupfs driver: docker/<id>.
    assert containers.container_id_from_cgroup("4:memory:/docker/%s\n1:name=systemd:/docker/%s\n"
                                               % (ID_B, ID_B)) == ID_B
    assert containers.container_id_from_cgroup("0::/docker/%s/init\n" % ID_A) == ID_A
    # cgroup v1: the controllers' lines carry it too.
    assert containers.container_id_from_cgroup("4:memory:/machine.slice/libpod-%s.scope/container\n1:name=systemd:/\n"
                                               % ID_A) == ID_A
    assert containers.container_id_from_cgroup("0::/system.slice/sglang-k26.service\n") is None
    # Not a whole ID: no container.
    assert containers.container_id_from_cgroup("0::/machine.slice/libpod-%s.scope\n" % ID_A[:20]) is None
    assert containers.container_id_from_cgroup("") is None


def test_parse_podman_ps_json():
    text = json.dumps([{"Id": ID_A, "Names": ["stray"], "Pid": 4321}, {"Id": ID_B, "Names": ["other"]}])
    assert containers.parse_podman_ps(text) == [{"id": ID_A, "name": "stray", "pid": 4321, "unit": None},
                                                {"id": ID_B, "name": "other", "pid": 0, "unit": None}]
    assert containers.parse_podman_ps("") == [] and containers.parse_podman_ps("not json") == []
    # A modelwake unit's container carries its unit's name (model_service's --label).
    text = json.dumps([{"Id": ID_B, "Names": ["modelwake-sglang-k26"], "Pid": 77,
                        "Labels": {"modelwake.unit": "sglang-k26.service"}}])
    assert containers.parse_podman_ps(text)[0]["unit"] == "sglang-k26.service"


def test_match_container_by_cgroup_id_then_by_pid_namespace():
    listed = [{"id": ID_A, "name": "stray", "pid": 10, "pid_ns": "pid:[1]"},
              {"id": ID_B, "name": "modelwake-other", "pid": 20, "pid_ns": "pid:[2]"}]
    assert containers.match_container(ID_B, "pid:[2]", HOST_NS, listed) == {"id": ID_B, "name": "modelwake-other",
                                                                             "unit": None}
    # A container the runtime does not list (another runtime's): its ID alone.
    assert containers.match_container(ID_B, None, HOST_NS, []) == {"id": ID_B, "name": None, "unit": None}
    assert containers.match_container(None, "pid:[1]", HOST_NS, listed) == {"id": ID_A, "name": "stray", "unit": None}
    # The host's namespace, or nothing readable: not in a container.
    assert containers.match_container(None, HOST_NS, HOST_NS, listed) is None
    assert containers.match_container(None, None, HOST_NS, listed) is None
    # Another namespace nobody lists.
    assert containers.match_container(None, "pid:[9]", HOST_NS, listed) == {"id": None, "name": None, "unit": None}


def test_describe():
    assert containers.describe({"id": ID_A, "name": "stray", "unit": None}) == "container stray (%s)" % ID_A[:12]
    assert containers.describe({"id": ID_A, "name": None, "unit": None}) == "container %s" % ID_A[:12]
    assert containers.describe({"id": None, "name": None, "unit": None}) == \
        "container (another PID namespace, not Podman's or Docker's)"
    assert containers.describe(None) == ""


def test_survey_names_containers_beside_host_pids_and_stops_only_through_units(tmp_path):
    nvml = fresh_nvml_api()
    nvml.configure(devices=[
        {"uuid": "GPU-a", "memory_used_mib": 40000, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 5001, "used_mib": 30000}, {"pid": 6001, "used_mib": 9000}]},
        {"uuid": "GPU-b", "memory_used_mib": 100, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 7001, "used_mib": 20000}]},
    ])
    proc = tmp_path / "proc"
    write_proc(proc, 1, ["/sbin/init"], cgroup="0::/init.scope\n")
    with_namespace(proc, 1, HOST_NS)
    # A container started by hand (--cgroups=disabled: in the session's cgroup), found by its namespace.
    write_proc(proc, 5001, ["python3", "serve.py"])
    with_namespace(proc, 5001, "pid:[4026532001]")
    write_proc(proc, 5000, ["catatonit", "--", "python3", "serve.py"])
    with_namespace(proc, 5000, "pid:[4026532001]")
    # A modelwake unit's container (split: in a sub-cgroup of its unit), found by its cgroup.
    write_proc(proc, 6001, ["python3", "-m", "sglang.launch_server"],
               cgroup="0::/system.slice/sglang-other.service/libpod-payload-%s\n" % ID_B)
    with_namespace(proc, 6001, "pid:[4026532002]")
    # A plain process on the host.
    write_proc(proc, 7001, ["python", "ddtree.py"])
    with_namespace(proc, 7001, HOST_NS)
    asked = []

    def podman_ps():
        asked.append(True)
        return [{"id": ID_A, "name": "stray", "pid": 5000, "unit": None},
                {"id": ID_B, "name": "modelwake-sglang-other", "pid": 6000, "unit": None}]

    result = holders.survey(needed=[0, 1], service_unit="sglang-k26", stop_units=["sglang-other"],
                            reader=GpuReader(nvml=nvml), proc_root=str(proc), list_containers=podman_ps)
    assert len(asked) == 1  # the runtime asked once
    by_pid = dict((h["pid"], h) for h in result["holders"])
    assert by_pid[5001]["container"] == {"id": ID_A, "name": "stray", "unit": None}
    assert by_pid[5001]["label"] == "5001 in container stray (%s)" % ID_A[:12]
    assert by_pid[6001]["container"] == {"id": ID_B, "name": "modelwake-sglang-other", "unit": None}
    assert by_pid[7001]["container"] is None and by_pid[7001]["label"] == "7001"
    # The unit decides: the modelwake unit's container is stopped through its unit, the stray one refused.
    assert result["stop_units"] == ["sglang-other.service"]
    assert sorted(h["pid"] for h in result["blocking"]) == [5001, 7001]
    rows = dict((line.split()[0], line) for line in result["blocking_table"][1:])
    assert "foreign" in rows["5001"] and "[container stray (%s)] python3 serve.py" % ID_A[:12] in rows["5001"]
    assert "[container" not in rows["7001"]


def test_no_container_no_question_to_the_runtime(tmp_path):
    nvml = fresh_nvml_api()
    nvml.configure(devices=[{"uuid": "GPU-a", "memory_used_mib": 100, "memory_total_mib": 97887, "utilization": 0,
                             "processes": [{"pid": 4242, "used_mib": 50}]}])
    proc = tmp_path / "proc"
    write_proc(proc, 4242, ["python"])

    def podman_ps():
        raise AssertionError("podman asked for a holder in no container")

    result = holders.survey(needed=[0], reader=GpuReader(nvml=nvml), proc_root=str(proc), list_containers=podman_ps)
    assert result["holders"][0]["container"] is None and result["holders"][0]["label"] == "4242"


def executable(tmp_path, name, script="#!/bin/sh\nexit 1\n"):
    path = tmp_path / name
    path.write_text(script)
    path.chmod(0o755)
    return str(path)


INSPECT = ["inspect", "--type", "container", "--format", "{{.Id}} {{.State.Pid}} {{.Name}} {{json .Config.Labels}}"]


def test_parse_docker_inspect_lines():
    text = "%s 4321 /stray\n%s 0 /modelwake-sglang-dock\nnot a container line\n" % (ID_A, ID_B)
    assert containers.parse_docker_inspect(text) == [{"id": ID_A, "name": "stray", "pid": 4321, "unit": None},
                                                     {"id": ID_B, "name": "modelwake-sglang-dock", "pid": 0,
                                                      "unit": None}]
    assert containers.parse_docker_inspect("") == [] and containers.parse_docker_inspect(None) == []
    labelled = '%s 77 /modelwake-sglang-k26 {"modelwake.unit":"sglang-k26.service","note":"a b"}\n' % ID_B
    assert containers.parse_docker_inspect(labelled)[0]["unit"] == "sglang-k26.service"
    # A container without labels (null), or with others only.
    assert containers.parse_docker_inspect("%s 77 /x null\n%s 78 /y {\"a\":\"b\"}\n" % (ID_A, ID_B)) == [
        {"id": ID_A, "name": "x", "pid": 77, "unit": None}, {"id": ID_B, "name": "y", "pid": 78, "unit": None}]


def test_docker_containers_lists_the_running_ones_then_inspects_them_for_names_and_host_pids(tmp_path):
    docker = executable(tmp_path, "docker")
    run = ScriptedRun((0, "%s\n%s\n" % (ID_A, ID_B)), (0, "%s 4321 /stray\n%s 5432 /modelwake-sglang-dock\n"
                                                               % (ID_A, ID_B)))
    assert containers.docker_containers(docker, run) == [{"id": ID_A, "name": "stray", "pid": 4321, "unit": None},
                                                         {"id": ID_B, "name": "modelwake-sglang-dock", "pid": 5432,
                                                          "unit": None}]
    assert run.commands == [[docker, "ps", "--quiet", "--no-trunc"], [docker] + INSPECT + [ID_A, ID_B]]


def test_docker_containers_answers_what_it_could_read(tmp_path):
    docker = executable(tmp_path, "docker")
    # No container running: nothing to inspect.
    run = ScriptedRun((0, ""))
    assert containers.docker_containers(docker, run) == [] and len(run.commands) == 1
    # The daemon does not answer.
    run = ScriptedRun((1, ""))
    assert containers.docker_containers(docker, run) == [] and len(run.commands) == 1
    # A container gone between ps and inspect: inspect fails for it, the other is still named.
    run = ScriptedRun((0, "%s\n%s\n" % (ID_A, ID_B)), (1, "%s 4321 /stray\n" % ID_A))
    assert containers.docker_containers(docker, run) == [{"id": ID_A, "name": "stray", "pid": 4321, "unit": None}]
    # No Docker on the host: not asked.
    run = ScriptedRun()
    assert containers.docker_containers(str(tmp_path / "absent"), run) == [] and run.commands == []


def test_runtime_containers_asks_both_runtimes_present(tmp_path):
    podman = executable(tmp_path, "podman", "#!/bin/sh\necho '%s'\n" % json.dumps([{"Id": ID_A, "Names": ["stray"],
                                                                                     "Pid": 4321}]))
    docker = executable(tmp_path, "docker", "#!/bin/sh\nif [ \"$1\" = ps ]; then echo %s; "
                                            "else echo '%s 5432 /modelwake-sglang-dock'; fi\n" % (ID_B, ID_B))
    assert containers.runtime_containers(podman, docker) == [{"id": ID_A, "name": "stray", "pid": 4321, "unit": None},
                                                             {"id": ID_B, "name": "modelwake-sglang-dock", "pid": 5432,
                                                          "unit": None}]
    assert containers.runtime_containers(str(tmp_path / "absent"), docker) == [
        {"id": ID_B, "name": "modelwake-sglang-dock", "pid": 5432, "unit": None}]


def test_survey_names_docker_containers_by_their_cgroup_or_their_pid_namespace(tmp_path):
    nvml = fresh_nvml_api()
    nvml.configure(devices=[
        {"uuid": "GPU-a", "memory_used_mib": 40000, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 5001, "used_mib": 30000}, {"pid": 6001, "used_mib": 9000}]},
    ])
    proc = tmp_path / "proc"
    write_proc(proc, 1, ["/sbin/init"], cgroup="0::/init.scope\n")
    with_namespace(proc, 1, HOST_NS)
    # Docker's systemd cgroup driver: the container's own scope names it.
    write_proc(proc, 5001, ["python3", "serve.py"], cgroup="0::/system.slice/docker-%s.scope\n" % ID_A)
    with_namespace(proc, 5001, "pid:[4026532001]")
    # A cgroup without the container's ID (runc given no cgroup path: below containerd's): found by the PID
    # namespace it shares with the container's init (docker-init, `docker inspect`'s State.Pid).
    write_proc(proc, 6001, ["python3", "-m", "sglang.launch_server"],
               cgroup="1:name=systemd:/system.slice/containerd.service/c0ffee\n")
    with_namespace(proc, 6001, "pid:[4026532002]")
    write_proc(proc, 6000, ["docker-init", "--", "python3"],
               cgroup="1:name=systemd:/system.slice/containerd.service/c0ffee\n")
    with_namespace(proc, 6000, "pid:[4026532002]")
    docker = executable(tmp_path, "docker")
    run = ScriptedRun((0, "%s\n%s\n" % (ID_A, ID_B)),
                         (0, "%s 5000 /stray\n%s 6000 /modelwake-sglang-other\n" % (ID_A, ID_B)))
    result = holders.survey(needed=[0], service_unit="sglang-k26", stop_units=["sglang-other"],
                            reader=GpuReader(nvml=nvml), proc_root=str(proc),
                            list_containers=lambda: containers.docker_containers(docker, run))
    assert len(run.commands) == 2  # asked once for both holders
    by_pid = dict((h["pid"], h) for h in result["holders"])
    assert by_pid[5001]["container"] == {"id": ID_A, "name": "stray", "unit": None}
    assert by_pid[5001]["label"] == "5001 in container stray (%s)" % ID_A[:12]
    assert by_pid[6001]["container"] == {"id": ID_B, "name": "modelwake-sglang-other", "unit": None}
    assert by_pid[6001]["label"] == "6001 in container modelwake-sglang-other (%s)" % ID_B[:12]
    # Named only: neither holder's cgroup is a unit of the stop list, so both are foreign and refused.
    assert result["stop_units"] == []
    assert sorted(h["pid"] for h in result["blocking"]) == [5001, 6001]
    rows = dict((line.split()[0], line) for line in result["blocking_table"][1:])
    assert "[container stray (%s)] python3 serve.py" % ID_A[:12] in rows["5001"]


def test_a_units_own_docker_container_is_its_units_by_the_label(tmp_path):
    # Docker's containers are containerd's, outside the unit's cgroup: without the label a re-run would find
    # the running service's own engine foreign and refuse it, and could not stop a stale one through its unit.
    nvml = fresh_nvml_api()
    nvml.configure(devices=[
        {"uuid": "GPU-a", "memory_used_mib": 80000, "memory_total_mib": 97887, "utilization": 0,
         "processes": [{"pid": 5001, "used_mib": 70000}, {"pid": 6001, "used_mib": 9000},
                       {"pid": 7001, "used_mib": 900}]},
    ])
    proc = tmp_path / "proc"
    write_proc(proc, 1, ["/sbin/init"], cgroup="0::/init.scope\n")
    with_namespace(proc, 1, HOST_NS)
    for pid, container in ((5001, ID_A), (6001, ID_B), (7001, "d" * 64)):
        write_proc(proc, pid, ["python3", "-m", "sglang.launch_server"],
                   cgroup="0::/system.slice/docker-%s.scope\n" % container)
        with_namespace(proc, pid, "pid:[%d]" % pid)
    docker = executable(tmp_path, "docker")
    run = ScriptedRun((0, "%s\n%s\n%s\n" % (ID_A, ID_B, "d" * 64)),
                         (0, '%s 5000 /modelwake-sglang-k26 {"modelwake.unit":"sglang-k26.service"}\n'
                             '%s 6000 /modelwake-sglang-other {"modelwake.unit":"sglang-other.service"}\n'
                             '%s 7000 /by-hand null\n' % (ID_A, ID_B, "d" * 64)))
    result = holders.survey(needed=[0], service_unit="sglang-k26", stop_units=["sglang-other"],
                            reader=GpuReader(nvml=nvml), proc_root=str(proc),
                            list_containers=lambda: containers.docker_containers(docker, run))
    by_pid = dict((h["pid"], h) for h in result["holders"])
    assert (by_pid[5001]["unit"], by_pid[5001]["verdict"]) == ("sglang-k26.service", holders.OWN)
    assert (by_pid[6001]["unit"], by_pid[6001]["verdict"]) == ("sglang-other.service", holders.STOPPABLE)
    # A container without the label stays its cgroup's (docker-<id>.scope): foreign, named.
    assert by_pid[7001]["unit"] == "docker-%s.scope" % ("d" * 64) and by_pid[7001]["verdict"] == holders.FOREIGN
    assert result["stop_units"] == ["sglang-other.service"]
    assert [h["pid"] for h in result["blocking"]] == [] and result["blocking_gpus"] == []
