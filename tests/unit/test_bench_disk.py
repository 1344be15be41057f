"""bench/disk.py's pure parts: the generated model's size, vLLM's load seconds from its own lines,
the load rate against the disk's, the goal; and bench/report.py's disk section."""
import json
import struct

import pytest

from bench import disk, report
from ansible_collections.modelwake.serving.plugins.module_utils.host import storage

GB = 1000 ** 3

# Lines of the pinned vLLM CPU build (0.32.0) loading the bench model with --safetensors-load-strategy eager.
VLLM_EAGER = """\
(Worker pid=17694) INFO 12-05 02:27:03 [base_loader.py:82] Initializing model took 0.191910 seconds
(Worker pid=17694) INFO 12-05 02:27:03 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 2.83 GiB. Available RAM: 21.36 GiB.
Loading safetensors checkpoint shards (eager):   0% Completed | 0/4 [00:00<?, ?it/s]
Loading safetensors checkpoint shards (eager):  25% Completed | 1/4 [00:06<00:18,  6.15s/it]
Loading safetensors checkpoint shards (eager): 100% Completed | 4/4 [00:20<00:00,  5.03s/it]
(Worker pid=17694) INFO 12-05 02:27:23 [default_loader.py:501] Loading weights took 20.19 seconds
(EngineCore pid=17535) INFO 12-05 02:27:31 [core.py:402] init engine (profile, create kv cache, warmup model) took 2.72 s
"""
# The simulated TP-8 engine: one line per rank, in the order the ranks finish.
SIM_TP8 = """\
(Worker_TP2 pid=22495) INFO 12-05 02:27:45 [default_loader.py:291] Loading weights took 1.17 seconds
(Worker_TP2 pid=22495) INFO 12-05 02:27:45 [gpu_model_runner.py:2370] Model loading took 59.3750 GiB memory and 1.571903 seconds
(Worker_TP7 pid=22500) INFO 12-05 02:27:45 [default_loader.py:291] Loading weights took 1.21 seconds
(Worker_TP0 pid=22493) INFO 12-05 02:27:45 [default_loader.py:291] Loading weights took 1.27 seconds
"""


def test_the_model_is_about_three_gb_and_its_parameters_are_llamas():
    # The count the generator printed for this config: {"vocab": 240000, "params": 759989248}.
    assert disk.parameter_count(disk.ARCH) == 759989248
    assert 2.8 * GB < disk.planned_bytes(disk.ARCH) < 3.5 * GB
    # Half the size in bfloat16; one more layer adds exactly one layer's q, k, v, o, MLP and norms.
    assert disk.planned_bytes(dict(disk.ARCH, torch_dtype="bfloat16")) * 2 == disk.planned_bytes(disk.ARCH)
    deeper = dict(disk.ARCH, num_hidden_layers=disk.ARCH["num_hidden_layers"] + 1)
    assert disk.parameter_count(deeper) - disk.parameter_count(disk.ARCH) == 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024


def test_no_tensor_outgrows_a_shard_so_the_shards_stay_near_one_gb():
    # transformers puts a tensor larger than max_shard_size alone in an oversized shard: the largest
    # tensors (embedding, lm_head) must fit the ~1 GB shards.
    largest = disk.ARCH["vocab_size"] * disk.ARCH["hidden_size"] * disk.DTYPE_BYTES[disk.ARCH["torch_dtype"]]
    assert largest <= int(disk.MAX_SHARD.rstrip("MB")) * 1000 ** 2
    assert disk.planned_bytes(disk.ARCH) / (int(disk.MAX_SHARD.rstrip("MB")) * 1000 ** 2) >= 3


def _safetensors(path, tensor_bytes):
    """A minimal safetensors file: an 8-byte header length, its JSON, the data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}})
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header.encode() + b"\0" * tensor_bytes)


def test_the_shards_are_the_safetensors_files_with_their_sizes(tmp_path):
    _safetensors(str(tmp_path / "model-00002-of-00002.safetensors"), 4096)
    _safetensors(str(tmp_path / "model-00001-of-00002.safetensors"), 8192)
    (tmp_path / "config.json").write_text("{}")
    found = disk.shards(str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p, _ in found] == ["model-00001-of-00002.safetensors",
                                                      "model-00002-of-00002.safetensors"]
    assert [size for _, size in found] == [8192 + 8 + len(json.dumps({"w": {"dtype": "F32", "shape": [2048],
                                                                         "data_offsets": [0, 8192]}})),
                                           4096 + 8 + len(json.dumps({"w": {"dtype": "F32", "shape": [1024],
                                                                         "data_offsets": [0, 4096]}}))]
    assert found == storage.model_files(str(tmp_path))


def test_the_cache_lives_under_modelwake_cache(monkeypatch):
    monkeypatch.setenv("MODELWAKE_CACHE", "/srv/cache")
    assert disk.cache_dir() == "/srv/cache/bench"


def test_vllms_load_seconds_come_from_its_own_line_not_the_models_initialisation():
    assert disk.load_seconds(VLLM_EAGER) == {"weights_s": 20.19}


def test_the_simulated_tp8_load_ends_with_its_slowest_rank():
    assert disk.load_seconds(SIM_TP8) == {"weights_s": 1.27}


def test_a_log_without_the_line_has_no_load_seconds():
    assert disk.load_seconds(VLLM_EAGER.replace("Loading weights took 20.19 seconds", "")) == {"weights_s": None}


def test_the_share_of_the_disk_is_bytes_over_seconds_over_the_disk_rate():
    rate, share = disk.share_of_disk(3 * GB, 2.0, 2 * GB)
    assert rate == 1.5 * GB and share == 0.75
    assert disk.share_of_disk(3 * GB, None, 2 * GB) == (None, None)
    assert disk.share_of_disk(3 * GB, 2.0, None) == (1.5 * GB, None)


def _run(method, weights_s, ready_s, **extra):
    return dict({"method": method, "weights_s": weights_s, "ready_s": ready_s,
                 "ready_with_prefetch_s": ready_s + extra.get("prefetch_s", 0.0)}, **extra)


def test_summary_medians_and_the_goal_per_method():
    runs = [_run("default", 30.0, 80.0), _run("default", 20.0, 70.0), _run("default", 25.0, 75.0),
            _run("eager", 1.5, 50.0), _run("eager", 1.25, 48.0), _run("eager", 2.0, 51.0),
            _run("prefetch", 1.0, 45.0, prefetch_s=2.0, prefetch_rate=1.5 * GB),
            _run("prefetch", None, 46.0, prefetch_s=1.5, prefetch_rate=2.0 * GB)]
    rows = dict((row["method"], row) for row in disk.summarise(runs, 3 * GB, 2 * GB))
    assert [row["method"] for row in disk.summarise(runs, 3 * GB, 2 * GB)] == ["default", "prefetch", "eager"]
    default, eager, prefetched = rows["default"], rows["eager"], rows["prefetch"]
    assert default["ready_s"] == 75.0 and default["weights_s"] == 25.0
    assert default["load_rate"] == pytest.approx(0.12 * GB) and default["share"] == pytest.approx(0.06)
    assert default["goal_met"] is False and default["goal_runs"] == 0
    # eager: 3 GB in 1.5 s = 2 GB/s = 100 %, in 1.25 s 120 %, in 2 s 75 %: two of three runs at 80 %.
    assert eager["shares"] == pytest.approx([1.0, 1.2, 0.75])
    assert eager["goal_met"] is True and eager["goal_runs"] == 2 and eager["share"] == pytest.approx(1.0)
    # A run without the load line counts in no share; the prefetch's own rate is its median.
    assert prefetched["shares"][1] is None and prefetched["goal_runs"] == 1
    assert prefetched["prefetch_s"] == 1.75 and prefetched["prefetch_share"] == pytest.approx(0.875)
    assert prefetched["ready_with_prefetch_s"] == pytest.approx((47.0 + 47.5) / 2)


def _measured():
    runs = [_run("default", 19.0 + n, 80.0 + n, run=n, resident_after_drop=0) for n in (1, 2, 3)]
    runs += [_run("prefetch", 10.0, 60.0, run=n, prefetch_s=1.8, prefetch_rate=1.7 * GB,
                  resident_after_drop=4 * 1024 * 1024)
             for n in (1, 2, 3)]
    runs += [_run("eager", 20.0, 85.0, run=1, resident_after_drop=0),
             dict(_run("eager", None, 0.0, run=2), ready_s=None, why="no completion answered (exit 1): see x.log")]
    sim = [_run("default", 1.2, 3.0, run=1), _run("prefetch", 1.3, 3.1, run=1, prefetch_s=1.9, prefetch_rate=1.6 * GB),
           _run("eager", 2.5, 4.0, run=1)]
    disk_rate = 2.0 * GB
    reads = [{"readers": 4, "rate": rate, "cold": True} for rate in (1.9 * GB, 2.0 * GB, 2.2 * GB)]
    return {"status": "measured", "runs": 3, "goal_share": 0.8, "prefetch_readers": 4,
            "model": {"bytes": 3 * GB, "shards": [GB, GB, GB], "arch": disk.ARCH},
            "disk": {"rate": disk_rate, "reads": reads + [{"readers": 1, "rate": 0.9 * GB, "cold": True}]},
            "disk_after": {"reads": [{"readers": 4, "rate": 2.1 * GB, "cold": True}]},
            "vllm": runs, "sim": sim,
            "summary": {"vllm": disk.summarise(runs, 3 * GB, disk_rate), "sim": disk.summarise(sim, 3 * GB, disk_rate)}}


def test_the_disk_section_gives_each_way_its_times_rate_share_and_goal():
    text = "\n".join(report._disk_section(_measured()))
    # default: median 21 s of weights for 3 GB = 143 MB/s (136 MiB/s), 7 % of 2 GB/s.
    assert ("| default loader (mmap) | 82.0 (81.0, 82.0, 83.0) | – | 21.00 (20.00, 21.00, 22.00) | 136.2 MiB/s "
            "| 7 % (8 %, 7 %, 7 %) | **missed** (0 of 3 runs) |") in text
    assert "| prefetch, then the default loader | 60.0 (60.0, 60.0, 60.0) | 61.8 (61.8, 61.8, 61.8) |" in text
    assert "| `--safetensors-load-strategy eager` | 85.0 (85.0, –) |" in text
    assert "- eager run 2: no completion answered (exit 1): see x.log" in text
    assert "The prefetch itself (`host/prefetch.prefetch`, 4 readers): 1.80 s at 1.6 GiB/s, 85 % of the disk's rate" in text
    assert "4 readers: 1.8 GiB/s, 1.9 GiB/s, 2.0 GiB/s; the median, **1.9 GiB/s**" in text
    assert "at most 4.0 MiB still resident" in text
    assert "a single reader measured 858.3 MiB/s here (after the runs: 2.0 GiB/s with 4 readers)" in text
    assert "float32: 2.8 GiB (3.00 GB) in 3 safetensors shards" in text
    # The prefetch rows are the warm ceiling: 3 GB in 10 s; the cold ways against it.
    assert "vLLM's load phase still took 10.00 s, 286.1 MiB/s, 15 % of the disk's rate" in text
    assert "Cold, the load phase took longer by: default loader 2.1×, `--safetensors-load-strategy eager` 2.0×." in text
    # The simulator's rows: every rank reads every shard through the page cache, three ways.
    assert "`--tp 8 --shard-reads every-rank --load-rate-mib 1000000 (unpaced)`" in text
    assert "Each of its 8 ranks reads every shard whole through the page cache and drops nothing" in text
    assert "| its reads through mmap | 3.0 (3.0) | – | 1.20 (1.20) | 2.3 GiB/s | 125 % (125 %) | met (1 of 1 runs) |" in text
    assert "| prefetch, then its reads through mmap | 3.1 (3.1) | 5.0 (5.0) | 1.30 (1.30) |" in text
    assert "| its reads with `pread` (eager) | 4.0 (4.0) | – | 2.50 (2.50) | 1.1 GiB/s | 60 % (60 %) |" in text
    assert "eighth" not in text and "undone" not in text
    assert "This run measured" not in text  # both engines


def test_a_run_of_the_simulator_alone_says_so_and_has_no_vllm_table():
    measured = _measured()
    measured.update(engines=["sim"], vllm=[], summary=dict(measured["summary"], vllm=[]))
    text = "\n".join(report._disk_section(measured))
    assert "This run measured the simulated TP 8 only (`bench/run.py --only disk --disk-engines sim`)." in text
    assert "The real vLLM CPU server" not in text and "| its reads through mmap |" in text


def test_a_disk_read_that_was_not_cold_is_said():
    measured = _measured()
    measured["disk"]["reads"][1]["cold"] = False
    text = "\n".join(report._disk_section(measured))
    assert "**not all cold** (mincore: 1 of 4 reads found the sample cached)" in text
    assert "cold (mincore-checked)" not in text


def test_the_goal_rows_per_engine_and_way():
    rows = report._disk_targets(_measured())
    assert [(label.split(": ", 1)[1], met) for label, met, _ in rows] == [
        ("real vLLM CPU, default loader (mmap)", False), ("real vLLM CPU, prefetch, then the default loader", False),
        ("real vLLM CPU, `--safetensors-load-strategy eager`", False),
        ("simulated TP 8, its reads through mmap", True),
        ("simulated TP 8, prefetch, then its reads through mmap", True),
        ("simulated TP 8, its reads with `pread` (eager)", False)]
    assert rows[3][2] == "125 % of the disk (median), 1 of 1 runs at the goal"
    assert report._disk_targets({"status": "not measured", "why": "no venv"}) == []


def test_a_disk_step_not_measured_says_why():
    assert report._disk_section({"status": "not measured", "why": "dropping the page cache needs root"}) == [
        "## Loading from this disk", "", "Not measured: dropping the page cache needs root", ""]
    assert report._disk_section(None) == []


def test_the_simulator_runs_every_rank_reading_every_shard_each_way_with_its_read_mode():
    from modelwake_sim import __main__ as sim_cli  # engines/sim: on sys.path by pytest.ini
    for method, mode in (("default", "mmap"), ("prefetch", "mmap"), ("eager", "pread")):
        opts = sim_cli.build_parser().parse_args(["serve", "--engine", "vllm", "--model-path", "/m"]
                                                 + disk.sim_args(method))
        assert (opts.tp, opts.shard_reads, opts.read_mode) == (8, "every-rank", mode)
        assert opts.load_rate_mib == 1000000


def test_the_step_measures_only_the_engines_asked_for(tmp_path, monkeypatch):
    """disk.measure with engines=("sim",): the simulator's three ways, interleaved over the runs,
    and no real vLLM start (the measurement's own pieces replaced: they need root and minutes)."""
    from tools import vllm_cpu
    model = tmp_path / "model"
    model.mkdir()
    _safetensors(str(model / "model-00001-of-00001.safetensors"), 4096)
    started = []

    def run_sim(model_dir, files, method, log_path, work):
        started.append(("sim", method))
        return {"method": method, "weights_s": 1.0, "ready_s": 2.0, "ready_with_prefetch_s": 2.0}

    def run_vllm(*args):
        raise AssertionError("the real vLLM was started")

    monkeypatch.setattr(vllm_cpu, "venv_python", lambda: str(model / "model-00001-of-00001.safetensors"))
    monkeypatch.setattr(disk.os, "geteuid", lambda: 0)
    monkeypatch.setattr(disk, "make_model", lambda: str(model))
    monkeypatch.setattr(disk, "measure_disk", lambda files, rounds=3: {"reads": [], "rate": 2.0 * GB})
    monkeypatch.setattr(disk, "run_sim", run_sim)
    monkeypatch.setattr(disk, "run_vllm", run_vllm)
    result = disk.measure(str(tmp_path / "work"), runs=2, progress=lambda line: None, engines=("sim",))
    assert started == [("sim", m) for m in ("default", "prefetch", "eager")] * 2
    assert result["engines"] == ["sim"] and result["vllm"] == [] and result["summary"]["vllm"] == []
    assert [row["method"] for row in result["summary"]["sim"]] == ["default", "prefetch", "eager"]
    assert [r["run"] for r in result["sim"]] == [1, 1, 1, 2, 2, 2]


def test_the_bench_refuses_an_unknown_disk_engine(capsys):
    from bench import run
    with pytest.raises(SystemExit):
        run.main(["--only", "disk", "--disk-engines", "sim,sglang"])
    assert "--disk-engines: choose from vllm, sim (got 'sim,sglang')" in capsys.readouterr().err
