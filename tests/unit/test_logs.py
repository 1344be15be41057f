"""Log readers: real files with tqdm `\\r` bars, truncation and rotation; captured journald JSON."""
import json
import os

from ansible_collections.modelwake.serving.plugins.module_utils.host import logs

BAR = "Loading safetensors checkpoint shards:  %d%% Completed | %d/64 [00:10<01:00, 1.0s/it]"


def append(path, data):
    with open(path, "ab") as handle:
        handle.write(data)


def test_tqdm_carriage_returns_become_lines_and_a_partial_line_waits(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"[TP0] Load weight begin. avail mem=85 GB\n")
    tailer = logs.FileTailer(path)
    assert tailer.read_new() == ["[TP0] Load weight begin. avail mem=85 GB"]
    assert tailer.last_read_context  # the first read may hold an earlier run
    # How tqdm writes to a file: "\r<bar>" per update, the bar still unfinished.
    append(path, ("\r" + BAR % (0, 0) + "\r" + BAR % (2, 1) + "\r" + (BAR % (3, 2))[:20]).encode())
    assert tailer.read_new() == [BAR % (0, 0), BAR % (2, 1)]  # "\r" ends a record; the last is unfinished
    assert not tailer.last_read_context
    append(path, (BAR % (3, 2))[20:].encode() + b"\r\n[TP0] Load weight end.\r\n")
    assert tailer.read_new() == [BAR % (3, 2), "[TP0] Load weight end."]
    assert tailer.read_new() == []


def test_multibyte_character_split_across_reads(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"")
    tailer = logs.FileTailer(path)
    tailer.read_new()
    text = "temp \u00b0C \u2713\n".encode("utf-8")
    append(path, text[:7])
    assert tailer.read_new() == []
    append(path, text[7:])
    assert tailer.read_new() == ["temp \u00b0C \u2713"]


def test_truncation_restarts_from_the_beginning(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"old line one\nold line two\n")
    tailer = logs.FileTailer(path)
    tailer.read_new()
    with open(path, "wb") as handle:  # copytruncate
        handle.write(b"new\n")
    assert tailer.read_new() == ["new"]


def test_rotation_reads_the_rest_of_the_old_file_then_the_new_one(tmp_path):
    path = str(tmp_path / "server.log")
    append(path, b"first\n")
    tailer = logs.FileTailer(path)
    assert tailer.read_new() == ["first"]
    append(path, b"last of old\n")
    os.rename(path, path + ".1")
    append(path, b"first of new\n")
    assert tailer.read_new() == ["last of old", "first of new"]


def test_missing_file_is_read_once_it_appears(tmp_path):
    path = str(tmp_path / "later.log")
    tailer = logs.FileTailer(path)
    assert tailer.read_new() == []
    append(path, b"hello\n")
    assert tailer.read_new() == ["hello"]
    assert not tailer.last_read_context  # created after we started: this run's lines


def test_large_existing_file_reads_only_its_tail_as_context(tmp_path):
    path = str(tmp_path / "big.log")
    append(path, b"".join(b"line %06d\n" % i for i in range(10000)))
    tailer = logs.FileTailer(path, context_bytes=1000)
    lines = tailer.read_new()
    assert lines[-1] == "line 009999"
    assert len(lines) < 100 and all(line.startswith("line ") and len(line) == 11 for line in lines)


# Captured `journalctl -u sglang-k26.service -o json` lines (fields trimmed): MESSAGE as a
# string, and as a list of byte values when it holds control characters (tqdm's \r).
TQDM_BYTES = list(("\r" + BAR % (45, 29) + "\r" + BAR % (46, 30)).encode())
JOURNAL = [
    {"__CURSOR": "s=a;i=1", "_SYSTEMD_INVOCATION_ID": "old", "MESSAGE": "Scheduler hit an exception: old run"},
    {"__CURSOR": "s=a;i=2", "_SYSTEMD_INVOCATION_ID": "inv1", "MESSAGE": "[2026-05-25 19:06:14 TP0] Load weight begin."},
    {"__CURSOR": "s=a;i=3", "_SYSTEMD_INVOCATION_ID": "inv1", "MESSAGE": TQDM_BYTES},
    {"__CURSOR": "s=a;i=4", "MESSAGE": None},
]


class ScriptedRunner(object):
    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, argv, timeout=30):
        self.calls.append(argv)
        return self.answers.pop(0)


def as_output(entries):
    return "".join(json.dumps(e) + "\n" for e in entries)


def test_journal_reader_decodes_byte_messages_splits_cr_and_follows_the_cursor():
    runner = ScriptedRunner([(0, as_output(JOURNAL), ""),
                             (0, as_output([{"__CURSOR": "s=a;i=5", "MESSAGE": "Load weight end."}]), ""),
                             (0, "", "")])
    reader = logs.JournalReader("sglang-k26.service", runner=runner, invocation_id="inv1")
    assert reader.read_new() == ["[2026-05-25 19:06:14 TP0] Load weight begin.", BAR % (45, 29), BAR % (46, 30)]
    assert not reader.last_read_context  # filtered by invocation id: only this run
    assert runner.calls[0][:6] == ["journalctl", "-u", "sglang-k26.service", "-o", "json", "--no-pager"]
    assert "-n" in runner.calls[0]
    assert reader.read_new() == ["Load weight end."]
    assert runner.calls[1][-2:] == ["--after-cursor", "s=a;i=4"]
    assert reader.read_new() == []
    assert runner.calls[2][-2:] == ["--after-cursor", "s=a;i=5"]


def test_journal_reader_without_invocation_id_marks_first_read_as_context_and_uses_since_when_empty():
    runner = ScriptedRunner([(0, "", ""), (0, as_output(JOURNAL[:1]), ""), (1, "", "Failed to get journal access")])
    reader = logs.JournalReader("x.service", runner=runner, since_epoch=1700000000)
    assert reader.read_new() == [] and reader.last_read_context
    assert reader.read_new() == ["Scheduler hit an exception: old run"]
    assert runner.calls[1][-2:] == ["--since", "@1700000000"]
    assert reader.read_new() == []
    assert "Failed to get journal access" in reader.error


def test_decode_message_forms():
    assert logs.decode_message("plain") == "plain"
    assert logs.decode_message([104, 105, 13, 10]) == "hi\r\n"
    assert logs.decode_message([0xff, 65]) == "\ufffdA"
    assert logs.decode_message(None) == ""


# A restart while the old run was still starting, as a busy journald records it: the old run's lines
# (its launcher, pid 4100) first with its own id, then its last words read after the new run had
# begun, tagged with the new run's id or none; systemd's own messages name their run.
RESTART = [
    {"__CURSOR": "s=r;i=1", "_PID": "4100", "_SYSTEMD_INVOCATION_ID": "old", "MESSAGE": "Loading weights took 2 s"},
    {"__CURSOR": "s=r;i=2", "_PID": "1", "INVOCATION_ID": "old", "MESSAGE": "Stopping vllm-tiny.service..."},
    {"__CURSOR": "s=r;i=3", "_PID": "1", "INVOCATION_ID": "new", "MESSAGE": "Starting vllm-tiny.service..."},
    {"__CURSOR": "s=r;i=4", "_PID": "4100", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "KeyboardInterrupt: terminated"},
    {"__CURSOR": "s=r;i=5", "_PID": "4100", "MESSAGE": "Exception: WorkerProc initialization failed"},
    {"__CURSOR": "s=r;i=6", "_PID": "5200", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "modelwake: starting vllm"},
]


def test_journal_reader_keeps_an_earlier_runs_late_lines_out_whatever_run_journald_tagged_them_with():
    late = {"__CURSOR": "s=r;i=7", "_PID": "4100", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "Traceback (most recent call last):"}
    crash = {"__CURSOR": "s=r;i=8", "_PID": "5200", "_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": "SafetensorError: incomplete metadata"}
    stopped = {"__CURSOR": "s=r;i=9", "_PID": "1", "INVOCATION_ID": "new", "MESSAGE": "vllm-tiny.service: Main process exited"}
    restarted = {"__CURSOR": "s=r;i=10", "_PID": "5300", "_SYSTEMD_INVOCATION_ID": "next", "MESSAGE": "modelwake: starting vllm"}
    runner = ScriptedRunner([(0, as_output(RESTART), ""), (0, as_output([late, crash, stopped, restarted]), "")])
    reader = logs.JournalReader("vllm-tiny.service", runner=runner, invocation_id="new", main_pid=5200)
    assert reader.read_new() == ["Starting vllm-tiny.service...", "modelwake: starting vllm"]
    # Later reads: the old run's process stays out; this run's crash and the restart after it are in.
    assert reader.read_new() == ["SafetensorError: incomplete metadata", "vllm-tiny.service: Main process exited",
                                 "modelwake: starting vllm"]
    assert runner.calls[1][-2:] == ["--after-cursor", "s=r;i=6"]


def test_journal_reader_without_the_runs_id_keeps_every_line_of_the_first_read_as_context():
    runner = ScriptedRunner([(0, as_output(RESTART), "")])
    reader = logs.JournalReader("vllm-tiny.service", runner=runner, main_pid=5200)
    assert len(reader.read_new()) == len(RESTART) and reader.last_read_context
