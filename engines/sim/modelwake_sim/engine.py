"""`serve`: the API process and its process tree, in SGLang's or vLLM's shape.

SGLang: API process -> one `sglang::scheduler_TP<n>` child per TP rank. The port is bound (and
  listens) only after every scheduler is ready; then /health is 503 during the warm-up request.
vLLM:   API process -> `VLLM::EngineCore` child -> `VLLM::Worker[_TP<n>]` grandchildren. The port
  is bound at once but listens only when the engine is ready (connections refused until then).
Ranks (schedulers / workers) do the reads, the silent CPU work and the generation (ranks.py).
Events travel to the API process as JSON lines over one pipe; requests to rank 0 over another.
"""
import errno
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback

from . import __version__, faults, http, hub, logs, ranks, textgen, work
from .gpus import ensure_gpus, fake_gpu_dir, holder_path, pid_namespace

SGLANG_VERSION = "0.5.23"
VLLM_VERSION = "0.32.0"
SITE = "/opt/modelwake/venv/lib/python3.11/site-packages"
MAX_MODEL_LEN = 262144
GB = 1024.0


class ApiServer:
    """The API process: starts the tree, follows its events, serves HTTP, handles signals."""

    def __init__(self, opts):
        self.opts = opts
        self.engine = opts.engine
        self.version = SGLANG_VERSION if self.engine == "sglang" else VLLM_VERSION
        self.model_path = opts.model_path
        self.served_model_name = opts.served_model_name or opts.model_path
        self.max_model_len = MAX_MODEL_LEN
        self.api_key = api_key(opts)
        self.access_log = not opts.no_access_log
        self.started_wall = time.time()
        self.state = "starting"
        self.role = "APIServer"
        self.log = logs.Logger(self.engine, role=self.role)
        self.events = queue.Queue()
        self.pending = {}
        self.pending_lock = threading.Lock()
        self.request_lock = threading.Lock()
        self.next_id = 0
        self.known_pids = set()
        self.children = []
        self.unwatched = set()  # children whose exit nobody waits for (they stay zombies)
        # A hub id with HF_ENDPOINT set: the ranks download the weights first (hub.py).
        self.from_hub = (opts.load_format != "runai_streamer" and bool(os.environ.get("HF_ENDPOINT"))
                         and hub.is_hub_id(opts.model_path))
        self.sock = None
        self.httpd = None
        self.status_r = self.status_w = self.request_r = self.request_w = None
        self.served_tokens = 0
        self.work = work.WorkCounters()

    # --- helpers ------------------------------------------------------------------------------
    def src(self, name):
        return name if self.engine == "vllm" else ""

    def health(self):
        """(status, body) for /health, following each engine's semantics."""
        if self.state in ("dead", "draining"):
            return 503, b""
        work.slow_health(self)
        if self.engine == "vllm":
            # vLLM only asks "is the engine core alive?": a hung or SIGSTOPped worker still gets 200.
            return 200, b""
        if self.state != "ready":
            return 503, b""
        # SGLang submits a 1-token generate and waits SGLANG_HEALTH_CHECK_TIMEOUT for any output.
        timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        if self.generate("", 1, timeout=timeout, quiet=True) is None:
            self.log.warning("Health check failed. Server couldn't get a response from detokenizer for last "
                             "%d seconds. tic start time: %s. last_heartbeat time: %s"
                             % (timeout, time.strftime("%H:%M:%S"), time.strftime("%H:%M:%S")))
            return 503, b""
        return 200, b""

    def metrics(self):
        return work.metrics_text(self)

    def in_flight(self):
        """Requests sent to rank 0 and not answered yet."""
        with self.pending_lock:
            return len(self.pending)

    def generate(self, prompt, max_tokens, timeout=None, quiet=False):
        """Send one request to rank 0 and wait for it: (tokens, finish_reason), or None if the
        engine died or `timeout` passed."""
        tokens, finish = textgen.continuation(prompt, max_tokens)
        event = threading.Event()
        with self.pending_lock:
            self.next_id += 1
            req_id = self.next_id
            self.pending[req_id] = [event, None]
        msg = {"cmd": "gen", "id": req_id, "n": len(tokens), "prompt_tokens": textgen.count_tokens(prompt),
               "quiet": quiet}
        with self.request_lock:
            try:
                os.write(self.request_w, (json.dumps(msg) + "\n").encode("utf-8"))
            except OSError:
                return None
        finished = event.wait(timeout)
        with self.pending_lock:
            slot = self.pending.pop(req_id, None)
        if not finished or slot is None or slot[1] is None:
            return None
        self.served_tokens += len(tokens)
        return tokens, finish

    def next_event(self):
        """The tree's next event, awaited in short slices: a SIGTERM that the kernel hands to
        another thread runs its Python handler only once the main thread executes again, and a
        drain must begin at once, not at the next event."""
        while True:
            try:
                return self.events.get(timeout=0.2)
            except queue.Empty:
                continue

    def _tell_rank0(self, msg):
        with self.request_lock:
            try:
                os.write(self.request_w, (json.dumps(msg) + "\n").encode("utf-8"))
            except OSError:
                pass

    def _read_status(self):
        """Thread: JSON lines from the tree; answers go to waiting requests, the rest to the queue."""
        buf = b""
        while True:
            try:
                chunk = os.read(self.status_r, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return  # the whole tree closed its ends; the exit watchers report how it ended
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    event = json.loads(line.decode("utf-8"))
                except ValueError:
                    continue
                if event.get("ev") == "tokens":
                    self.work.add(event)
                elif event.get("ev") == "gen":
                    with self.pending_lock:
                        slot = self.pending.get(event["id"])
                        if slot:
                            slot[1] = event
                            slot[0].set()
                else:
                    if event.get("ev") == "hello":
                        self.known_pids.add(event["pid"])
                    self.events.put(event)

    def _watch_child(self, pid):
        """Thread: report the child's exit status to the main loop."""
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                status = 0
                break
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.events.put({"ev": "exit", "pid": pid, "code": code})

    def _fork(self, body):
        """Fork a child that runs `body()` and never returns into the caller's code."""
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGQUIT, signal.SIG_DFL)
                if self.sock is not None:
                    self.sock.close()  # the port belongs to the API process only
                os.close(self.status_r)
                os.close(self.request_w)
                code = body() or 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                # A bug or an unexpected host problem (a fake-GPU file it may not write): say what,
                # as a real engine's rank would, instead of dying silently.
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        self.children.append(pid)
        self.known_pids.add(pid)
        return pid

    def _descendants(self):
        """PIDs below this process, from /proc (catches grandchildren the tree has not announced)."""
        parents = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name) as fileobj:
                    stat = fileobj.read()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
        found, todo = [], [os.getpid()]
        while todo:
            for child in parents.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    def _kill_tree(self, sig, grace):
        """Signal every descendant; after `grace` seconds SIGKILL what is left."""
        pids = set(self._descendants()) | (self.known_pids - {os.getpid()})
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        for pid in pids | set(self._descendants()):
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def _remove_dead_holders(self):
        """Holders of our own processes that were SIGKILLed: nvidia-smi ignores them, but keep tidy."""
        directory, namespace = fake_gpu_dir(), pid_namespace()
        for pid in self.known_pids:
            path = holder_path(directory, pid, namespace)
            if os.path.exists(path) and not _alive(pid):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _on_sigterm(self, signum, frame):
        if self.state == "draining":
            return  # a second SIGTERM (systemd's sweep of the cgroup) during the drain
        if self.state == "ready" and work.drains(self.opts):
            work.drain(self)  # says uvicorn's "Shutting down" itself
        if self.httpd is not None:
            if self.state != "draining":
                self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn("Finished server process [%d]" % os.getpid())
        # Ranks that keep serving through a drain ignore SIGTERM: end them outright.
        self._kill_tree(signal.SIGKILL if work.drains(self.opts) else signal.SIGTERM, 3.0)
        if self.opts.fake_gpus:
            self._remove_dead_holders()
        os._exit(0)

    def _die(self, code, kill=True):
        """Leave after a crash: take the tree down (holders of killed ranks stay, as after a crash)."""
        if self.httpd is not None:
            self.state = "dead"
        if kill:
            self._kill_tree(signal.SIGKILL, 0.5)
        os._exit(code)

    def _bind(self):
        """Bind the port, or fail with Python's own traceback for a port in use."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.opts.host, self.opts.port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                self.log.traceback(self._bind_frames(), "OSError: [Errno 98] Address already in use")
                os._exit(1)
            raise
        return sock

    def _bind_frames(self):
        if self.engine == "vllm":
            return [("%s/vllm/entrypoints/openai/api_server.py" % SITE, 1924, "run_server",
                     "listen_address, sock = setup_server(args)"),
                    ("%s/vllm/entrypoints/openai/api_server.py" % SITE, 1875, "setup_server",
                     "sock = create_server_socket(sock_addr)"),
                    ("%s/vllm/entrypoints/openai/api_server.py" % SITE, 1830, "create_server_socket",
                     "sock.bind(addr)")]
        return [("%s/sglang/srt/entrypoints/http_server.py" % SITE, 1460, "launch_server",
                 "uvicorn.run("),
                ("%s/uvicorn/server.py" % SITE, 163, "startup",
                 "sock.bind((config.host, config.port))")]

    def _check_model(self):
        """Fail like the real engine on a missing directory, config.json or weights."""
        path = self.model_path
        if self.opts.load_format == "runai_streamer":
            return None  # the ranks find the files, or fail, at the object store
        if self.from_hub:
            # The config comes first, fetched into the hub cache by the API process (transformers'
            # AutoConfig); the weights follow in the ranks. An unreachable hub fails here.
            try:
                download = hub.HubDownload(os.environ["HF_ENDPOINT"], path)
                sha, _ = download.info()
                download.download(sha, "config.json")
            except (OSError, hub.HubError, ValueError, KeyError) as exc:
                frames = [("%s/huggingface_hub/file_download.py" % SITE, 1484, "_raise_on_head_call_error",
                           "raise LocalEntryNotFoundError(")]
                return frames, ("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to "
                                "locate the file on the Hub (%s)" % exc)
            return None
        if not os.path.isdir(path):
            if self.engine == "vllm":
                frames = [("%s/huggingface_hub/utils/_validators.py" % SITE, 154, "validate_repo_id",
                           "raise HFValidationError(")]
                exc = ("OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '%s'. "
                       "Use `repo_type` argument if needed." % path)
            else:
                frames = [("%s/transformers/utils/hub.py" % SITE, 470, "cached_files",
                           "resolved_file = hf_hub_download(")]
                exc = ("OSError: Incorrect path_or_model_id: '%s'. Please provide either the path to a local "
                       "folder or the repo_id of a model on the Hub." % path)
            return frames, exc
        if not os.path.isfile(os.path.join(path, "config.json")):
            if self.engine == "vllm":
                frames = [("%s/pydantic/_internal/_dataclasses.py" % SITE, 123, "__init__",
                           "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)")]
                exc = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                       "  Value error, Invalid repository ID or local directory specified: '%s'.\n"
                       "Please verify the following requirements:\n"
                       "1. Provide a valid Hugging Face repository ID.\n"
                       "2. Specify a local directory that contains a recognized configuration file.\n"
                       "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
                       "   - For Mistral models: ensure the presence of a 'params.json'.\n"
                       " [type=value_error, input_value=ArgsKwargs((), {'model': '%s'}), input_type=ArgsKwargs]"
                       % (path, path))
            else:
                frames = [("%s/transformers/utils/hub.py" % SITE, 524, "cached_files",
                           "raise OSError(")]
                exc = ("OSError: %s does not appear to have a file named config.json. Checkout "
                       "'https://huggingface.co/%s/tree/None' for available files." % (path, path))
            return frames, exc
        if not ranks.shard_paths(path):
            frames = [("%s/%s/model_executor/model_loader/default_loader.py" % (SITE, self.engine), 120,
                       "_prepare_weights", "raise RuntimeError(")]
            return frames, "RuntimeError: Cannot find any model weights with `%s`" % path
        return None

    def _start_http(self):
        handler = type("BoundHandler", (http.Handler,), {"app": self})
        self.httpd = http.Server((self.opts.host, self.opts.port), handler, bind_and_activate=False)
        self.httpd.socket.close()
        self.httpd.socket = self.sock
        self.httpd.server_address = self.sock.getsockname()[:2]
        self.sock.listen(128)
        thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
        thread.start()

    def _setup_pipes_and_signals(self):
        self.status_r, self.status_w = os.pipe()
        self.request_r, self.request_w = os.pipe()
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)

    def _after_fork(self):
        """The API process keeps only its ends of the pipes, so EOF means the whole tree is gone."""
        os.close(self.status_w)
        os.close(self.request_r)
        threading.Thread(target=self._read_status, daemon=True).start()
        for pid in list(self.children):
            if pid not in self.unwatched:
                threading.Thread(target=self._watch_child, args=(pid,), daemon=True).start()

    def _ensure_gpus(self):
        if self.opts.fake_gpus:
            ensure_gpus(fake_gpu_dir(), max(self.opts.fake_gpu_count, self.opts.tp), self.opts.gpu_total_mib)

    def _startup_pause(self):
        """Imports: the real engines print nothing for a while, busy on one core."""
        end = time.monotonic() + self.opts.start_seconds * 0.4
        while time.monotonic() < end:
            for _ in range(2000):
                pass


def _alive(pid):
    """True for a live process (a zombie counts as dead: it holds nothing any more)."""
    try:
        with open("/proc/%d/stat" % pid) as fileobj:
            return fileobj.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def api_key(opts):
    """The key clients must send, or None: MODELWAKE_API_KEY, else where the real engine takes it
    (SGLang: the api-key line of --config's YAML, a JSON string as modelwake writes it; vLLM: VLLM_API_KEY)."""
    key = os.environ.get("MODELWAKE_API_KEY")
    if not key and opts.engine == "vllm":
        key = os.environ.get("VLLM_API_KEY")
    if not key and getattr(opts, "config", None):
        with open(opts.config) as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() == "api-key":
                    value = value.strip()
                    key = json.loads(value) if value.startswith('"') else value.strip("'")
    return key or None


def server_args_line(opts):
    """SGLang's one long `server_args=ServerArgs(...)` line (the fields that matter here)."""
    fields = [("model_path", repr(opts.model_path)), ("tokenizer_path", repr(opts.model_path)),
              ("tokenizer_mode", "'auto'"), ("load_format", repr(opts.load_format)), ("trust_remote_code", "True"),
              ("dtype", "'auto'"), ("quantization", "None"), ("context_length", "None"),
              ("served_model_name", repr(opts.served_model_name or opts.model_path)),
              ("host", repr(opts.host)), ("port", str(opts.port)), ("mem_fraction_static", "0.9"),
              ("tp_size", str(opts.tp)), ("nnodes", str(opts.nnodes)), ("node_rank", str(opts.node_rank)),
              ("dist_init_addr", repr(opts.dist_init_addr) if opts.dist_init_addr else "None"),
              ("attention_backend", "'triton'"),
              ("disable_cuda_graph", str(bool(opts.disable_cuda_graph))),
              ("api_key", "'********'" if api_key(opts) else "None"),
              ("watchdog_timeout", "300"), ("skip_server_warmup", "False")]
    return "server_args=ServerArgs(%s)" % ", ".join("%s=%s" % f for f in fields)
