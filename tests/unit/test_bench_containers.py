"""bench/containers.py and bench/container_probe.py: the parts that are not timed (reading the journal and
systemd's timestamps, the deploy's task times, the summary) and the report section they make."""
import json

import pytest

from bench import container_probe, containers, report


def journal(*entries):
    """`journalctl -o json` output: one entry per line (monotonic µs, message)."""
    return "\n".join(json.dumps({"__MONOTONIC_TIMESTAMP": str(stamp), "MESSAGE": message}) for stamp, message in entries)


def test_the_first_line_is_the_first_entry_after_the_command_that_holds_the_marker():
    out = journal((900, "[2026-12-05] server_args=ServerArgs(model_path='/old')"),  # the previous start's
                  (1000, "modelwake: engine started as pid 42: /usr/bin/podman run ..."),
                  (1500, "[2026-12-05] server_args=ServerArgs(model_path='/srv/models/bench-pod-sim')"),
                  (1600, "[2026-12-05] server_args=ServerArgs(again)"))
    assert container_probe.first_line(out, "server_args=", 1000) == 1500


def test_the_first_line_reads_a_message_journald_kept_as_bytes_and_skips_what_is_not_json():
    raw = list("server_args=\u00e9".encode("utf-8")) + [0xff]
    out = "-- No entries --\n" + json.dumps({"__MONOTONIC_TIMESTAMP": "2000", "MESSAGE": raw})
    assert container_probe.first_line(out, "server_args=", 1000) == 2000
    assert container_probe.first_line(journal((2000, "Load weight begin")), "server_args=", 1000) is None


@pytest.mark.parametrize("value, seconds", [("0", None), ("", None), ("3500000", 2.5)])
def test_a_systemd_timestamp_in_seconds_after_the_command(value, seconds):
    assert container_probe.since({"ActiveEnterTimestampMonotonic": value}, "ActiveEnterTimestampMonotonic",
                                 1000000) == seconds


def stamped(*events):
    return [dict(event=kind, task=task, at=at, **({"status": status} if status else {}))
            for kind, task, at, status in events]


def test_a_tasks_time_is_from_its_start_to_its_end_as_the_events_came():
    objects = stamped(("task_start", "Copy the image archive to the host", 10.0, None),
                      ("task_end", "Copy the image archive to the host", 12.25, "changed"),
                      ("task_start", containers.LOAD_TASK, 12.5, None),
                      ("task_end", containers.LOAD_TASK, 19.75, "changed"))
    assert containers.task_seconds(objects, containers.LOAD_TASK) == pytest.approx(7.2, abs=0.05)
    assert containers.task_seconds(objects, containers.COPY_TASK) == pytest.approx(2.2, abs=0.05)


def test_a_skipped_or_absent_task_has_no_time():
    skipped = stamped(("task_start", containers.LOAD_TASK, 1.0, None), ("task_end", containers.LOAD_TASK, 1.1, "skipped"))
    assert containers.task_seconds(skipped, containers.LOAD_TASK) is None
    assert containers.task_seconds([], containers.LOAD_TASK) is None


def trial(runtime, number, first_line, active, stop, state="active", containers_left=(), engines_left=()):
    return {"runtime": runtime, "round": number,
            "start": {"state": state, "main_start_s": 0.01, "first_line_s": first_line, "active_s": active},
            "stop": {"state": "inactive", "returned_s": stop, "engine_ended_s": round(stop / 4, 3), "inactive_s": stop,
                     "containers_left": list(containers_left), "engines_left": list(engines_left)}}


def trials():
    return [trial("venv", 1, 0.30, 5.1, 1.0), trial("podman", 1, 2.9, 7.9, 1.6), trial("docker", 1, 1.8, 6.9, 2.0),
            trial("venv", 2, 0.34, 5.3, 1.2), trial("podman", 2, 3.1, 8.3, 1.4), trial("docker", 2, 1.6, 7.1, 2.4),
            trial("venv", 3, 0.32, 5.2, 1.1), trial("podman", 3, 3.3, 8.0, 1.5), trial("docker", 3, 1.7, 7.0, 2.2)]


def test_the_summary_gives_each_runtimes_median_and_spread_and_what_a_container_adds():
    summary = containers.summarise(trials())
    venv, podman = summary["runtimes"]["venv"], summary["runtimes"]["podman"]
    assert venv["first_line_s"] == {"median": 0.32, "min": 0.30, "max": 0.34, "values": [0.30, 0.34, 0.32]}
    assert podman["active_s"]["median"] == 8.0 and podman["trials"] == 3
    assert summary["added"]["podman"] == {"first_line_s": 2.78, "active_s": 2.8, "stop_engine_s": 0.1, "stop_s": 0.4}
    assert summary["added"]["docker"] == {"first_line_s": 1.38, "active_s": 1.8, "stop_engine_s": 0.27, "stop_s": 1.1}
    assert "venv" not in summary["added"] and summary["left"] == [] and summary["creates"] == {}


def test_the_summary_gives_the_creations_alone_their_median_and_spread():
    creates = containers.summarise(trials(), {"docker": {"create_s": [1.4, 1.0, 1.2], "remove_s": [0.5, 0.3, 0.4]}})["creates"]
    assert creates == {"docker": {"create_s": {"median": 1.2, "min": 1.0, "max": 1.4, "values": [1.4, 1.0, 1.2]},
                                  "remove_s": {"median": 0.4, "min": 0.3, "max": 0.5, "values": [0.5, 0.3, 0.4]}}}


def test_the_summary_names_a_start_that_failed_and_a_stop_that_left_something():
    runs = trials() + [trial("docker", 4, 1.7, None, -300.0, state="failed", containers_left=["modelwake-sglang-bdock"],
                             engines_left=["4242"])]
    summary = containers.summarise(runs)
    assert summary["left"] == ["docker round 4: start ended failed; containers left ['modelwake-sglang-bdock']; "
                               "engine processes left ['4242']"]
    # A start that did not end active counts neither its times nor its stop's (systemd's timestamps of an
    # earlier run); the medians are of the others.
    docker = summary["runtimes"]["docker"]
    assert docker["active_s"]["values"] == [6.9, 7.1, 7.0] and docker["first_line_s"]["values"] == [1.8, 1.6, 1.7]
    assert docker["stop_s"]["values"] == [2.0, 2.4, 2.2] and docker["trials"] == 4


def measured():
    return {"status": "measured", "guest": "bench-ctr", "rounds": 3, "date": "2026-12-05",
            "sim_args": containers.SIM_ARGS, "load_average": ["2.10", "1.90", "1.70"],
            "versions": {"podman": "podman version 4.3.1", "docker": "20.10.24+dfsg1", "kernel": "6.1.0",
                         "podman storage": "overlay", "docker storage": "overlay2"},
            "images": {"podman": {"archive": "/c/sim-image-1.oci.tar", "archive_bytes": 101233152, "bytes": 257000000,
                                  "id": "sha256:ab"},
                       "docker": {"archive": "/c/sim-image-2.docker.tar.gz", "archive_bytes": 59825809,
                                  "bytes": 160000000, "id": "sha256:cd"}},
            "deploys": {"venv": {"rc": 0, "wall_s": 61.0, "copy_s": None, "load_s": None},
                        "podman": {"rc": 0, "wall_s": 48.2, "copy_s": 2.1, "load_s": 9.4},
                        "docker": {"rc": 0, "wall_s": 52.0, "copy_s": 1.5, "load_s": 11.2}},
            "summary": containers.summarise(trials(), {"podman": {"create_s": [2.5, 2.1, 2.3], "remove_s": [1.0, 0.9, 1.2]},
                                                       "docker": {"create_s": [1.1, 1.3, 1.2], "remove_s": [0.4, 0.5, 0.3]}})}


def test_the_report_section_shows_each_runtime_the_difference_and_the_images():
    text = "\n".join(report.containers_section(measured()))
    assert "## The time a container start adds" in text
    assert "| start → active (a completion answered) | 5.20 (5.10–5.30) | 8.00 (7.90–8.30) | 7.00 (6.90–7.10) |" in text
    assert "| start → the engine's first line | +2.78 s | +1.38 s |" in text
    assert "| podman | 96.5 MiB (sim-image-1.oci.tar) |" in text and "| 2.1 | 9.4 | 48.2 |" in text
    assert "no stop left a container or an engine process" in text
    assert ("podman create 2.30 (2.10–2.50) s (against +2.80 s added to ready), rm 1.00 (0.90–1.20) s; "
            "docker create 1.20 (1.10–1.30) s (against +1.80 s added to ready), rm 0.40 (0.30–0.50) s.") in text
    assert "podman version 4.3.1" in text and "--cgroups=disabled" in text
    # The storage drivers as measured: overlay as on a real host, or vfs and what it copies.
    assert "Podman's `overlay` and Docker's `overlay2`, as on a real host" in text
    vfs = measured()
    vfs["versions"].update({"podman storage": "vfs", "docker storage": "vfs"})
    assert "`vfs` copies the image's whole root filesystem for every container" in "\n".join(
        report.containers_section(vfs))
    assert report.container_headline(measured()) == ("podman +2.80 s to ready, +2.78 s to the engine's first line; "
                                                     "docker +1.80 s to ready, +1.38 s to the engine's first line")


def test_the_report_section_says_why_it_was_not_measured():
    lines = report.containers_section({"status": "not measured", "why": "tools/testhosts up failed:\nno space"})
    assert lines[:2] == ["## The time a container start adds", ""]
    assert lines[2] == "Not measured: tools/testhosts up failed: no space"
    assert report.containers_section(None) == []
