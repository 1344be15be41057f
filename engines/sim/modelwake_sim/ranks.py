"""The work of a rank process (an SGLang scheduler or a vLLM worker): load, initialise, serve.

A rank reads its slice of every shard for real (page cache dropped first, so /proc/<pid>/io
read_bytes grows; or with --shard-reads every-rank every shard whole, through the shared page
cache, as the real engines' TP ranks do), burns CPU silently while "compiling", and then paces
generation requests that the API process sends it, batching them like a real engine so throughput
grows with concurrency.
"""
import ctypes
import hashlib
import json
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import time

from . import faults, hub, logs, safetensors, work
from .gpus import Holder, visible_gpu, fake_gpu_dir

MIB = 1024 * 1024
CHUNK = 1 * MIB
HOLDER_INTERVAL = 0.25
# A busy-wait inside one native call that releases the GIL, as a hung collective does in torch's
# c10d bindings: PBKDF2 over a tiny constant input (CPython's _hashopenssl drops the GIL around it),
# no memory touched, ~0.2 s per call, repeated from one line.
SPIN_INPUT = (b"peer", b"all_reduce")
SPIN_CALL_SECONDS = 0.2
REPACK_LAYER_MIB = 32
PAGE_FILL = b"\x01" * 4096
CONTEXT_MIB = 512
STREAMER_DESC = "Loading safetensors using Runai Model Streamer"
STREAMER_FRAMES = [
    ("/opt/modelwake/venv/lib/python3.11/site-packages/runai_model_streamer/file_streamer/file_streamer.py",
     160, "get_chunks", "raise StreamerError(")]
WEIGHTS_SHARE = 0.8
# --shard-reads: each rank its 1/tp of every shard, page cache dropped first (the default), or
# every rank every shard whole through the shared page cache (the real engines' TP loading).
SLICE = "slice"
EVERY_RANK = "every-rank"
SHARD_READS = (SLICE, EVERY_RANK)
# --read-mode: pread(2) into a buffer (the default; an eager loader's read), or mmap (the pages
# faulted in through a mapping, as the engines' default safetensors loader does).
PREAD = "pread"
MMAP = "mmap"
READ_MODES = (PREAD, MMAP)


class RankCrash(Exception):
    """A crash1 fault or a real loading error: (frames, exception line) to print as a traceback.
    `alone`: only this rank fails (rankdeath); it tells nobody, so its parent never hears of it."""

    def __init__(self, frames, exc_line, alone=False):
        Exception.__init__(self, exc_line)
        self.frames = frames
        self.exc_line = exc_line
        self.alone = alone


def calibrated_rounds(seconds):
    """PBKDF2 rounds that take about `seconds` on this machine now."""
    probe = time.monotonic()
    hashlib.pbkdf2_hmac("sha256", SPIN_INPUT[0], SPIN_INPUT[1], 20000)
    return max(1000, int(20000 * seconds / max(1e-3, time.monotonic() - probe)))


def set_title(title):
    """Title the process as the engines do with setproctitle: /proc/<pid>/comm (the kernel keeps
    15 characters) and the command line (`ps -o args`, /proc/<pid>/cmdline), where a watcher reads
    the full name and the rank (`sglang::scheduler_TP3`)."""
    try:
        with open("/proc/self/comm", "w") as fileobj:
            fileobj.write(title[:15])
    except OSError:
        pass
    _set_cmdline(title)


def _set_cmdline(title):
    """Overwrite the argv area the kernel shows as /proc/self/cmdline (what setproctitle does on
    Linux): its bounds are fields 48-49 of /proc/self/stat; the title and NULs fill it."""
    try:
        with open("/proc/self/stat") as fileobj:
            stat = fileobj.read()
        fields = stat[stat.rfind(")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return
    data = title.encode("utf-8")[:max(0, end - start - 1)]
    if not start or not data:
        return
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def send(fd, event):
    """One JSON line to the API process; a single write under PIPE_BUF is atomic between writers."""
    data = (json.dumps(event, separators=(",", ":")) + "\n").encode("utf-8")
    try:
        os.write(fd, data)
    except OSError:
        pass


class Rank:
    """State shared by the phases of one rank process."""

    def __init__(self, opts, rank, logger, status_fd, request_fd, title, holder_name, local_rank=None,
                 group_fd=None):
        self.opts = opts
        self.rank = rank  # the global TP rank (TP8 is node 1's first with 8 ranks a node)
        self.group_fd = group_fd  # multi-node: a byte arrives here when the group completes a collective
        self.log = logger
        self.status_fd = status_fd
        self.request_fd = request_fd
        self.parent = os.getppid()
        self.holder = None
        self.memory = 0.0
        self.util = 0
        self.last_holder = 0.0
        self.children = []
        self.title = title
        set_title(title)
        if opts.fake_gpus:
            self.holder = Holder(fake_gpu_dir(), holder_name, visible_gpu(rank if local_rank is None else local_rank))
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        work.keep_serving_on_sigterm(opts)
        send(status_fd, {"ev": "hello", "pid": os.getpid(), "rank": rank})

    # --- housekeeping -------------------------------------------------------------------------
    def _on_sigterm(self, signum, frame):
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.holder:
            self.holder.remove()
        os._exit(0)

    def parent_gone(self):
        """A rank whose API process died goes too, unless told to imitate vLLM's orphans (#55510)."""
        return os.getppid() != self.parent and not self.opts.survive_parent_kill

    def gpu(self, memory_mib=None, util=None, force=False):
        if memory_mib is not None:
            self.memory = memory_mib
        if util is not None:
            # A change of utilisation is written at once; memory climbing while loading is throttled.
            force = force or util != self.util
            self.util = util
        now = time.monotonic()
        if self.holder and (force or now - self.last_holder >= HOLDER_INTERVAL):
            self.last_holder = now
            self.holder.update(self.memory, self.util)

    # --- faults -------------------------------------------------------------------------------
    def check_fault(self, phase, started, phase_over=False):
        fault = self.opts.fault
        if fault is None or not fault.due(phase, time.monotonic() - started, phase_over):
            return
        if fault.kind == "hang":
            self.hang()
        if fault.kind == "spin":
            if self.opts.tp > 1 and self.rank == self.opts.tp - 1:
                self.hang()  # the rank that never arrives: parked, in its own phase's frames
            self.all_reduce()
        if fault.kind in faults.RANK_DEATHS:
            if self.rank != self.opts.tp - 1:
                self.wait_for_dead_peer()
            if fault.kind in faults.RANK_KILLS:
                # Killed from outside (the OOM killer): no word in the log; the kill's time recorded.
                faults.record(self.opts.churn_record, fault=fault.kind, rank=self.rank, pid=os.getpid(),
                              killed="signal 9 (SIGKILL)")
                os.kill(os.getpid(), signal.SIGKILL)
            frames, exc_line = faults.CRASH_CAUSES[phase]
            raise RankCrash(frames, exc_line, alone=True)
        if self.rank != 0:
            return  # rank 0 crashes; the others are taken down with the tree
        if fault.kind == "crash0":
            os.kill(os.getpid(), signal.SIGKILL)
        frames, exc_line = faults.CRASH_CAUSES[phase]
        raise RankCrash(frames, exc_line)

    def hang(self):
        """Stop everything: no CPU, no reads, no output, no GPU-picture change. Only SIGTERM or the
        API process's death ends it."""
        while not self.parent_gone():
            time.sleep(1.0)
        os._exit(1)

    def all_reduce(self):
        """The spin fault: a rank that waits for a peer the way NCCL does, burning one core inside a
        native call that never returns to its caller's code: CPU busy, no memory touched, no output,
        the Python stack standing still. Only SIGTERM or the API process's death ends it."""
        self.gpu(util=100, force=True)  # a hung collective's GPU-Util is 100 % (vllm#8087)
        rounds = calibrated_rounds(SPIN_CALL_SECONDS)
        while not self.parent_gone():
            hashlib.pbkdf2_hmac("sha256", SPIN_INPUT[0], SPIN_INPUT[1], rounds)
        os._exit(1)

    def wait_for_dead_peer(self):
        """rankdeath: the collective the last rank never joins. Parked in a blocking wait on a peer
        that will never answer (select(2) on a pipe nobody writes), as gloo/NCCL wait: no CPU, no
        output, no memory. Only SIGTERM or the API process's death ends it."""
        never, keep_open = os.pipe()
        while not self.parent_gone():
            select.select([never], [], [], 1.0)
        os._exit(1)

    def python_work(self, seconds):
        """--python-work-seconds: pure Python at work on one hot line (a tokenizer or a weight-map
        build would be): the GIL held, the interpreter executing, no log, no disk, no new memory."""
        x, end = 1, time.monotonic() + seconds
        while time.monotonic() < end: x = (x * 1103515245 + 12345) & 0xFFFFFFFF  # noqa: E701
        return x

    def wait_for_group(self, stage, what, frames, timeout_line):
        """Multi-node: tell the API process this rank reached the collective `stage`, then wait until
        every node has (nodes.py). Parked in a blocking wait, like NCCL's: no CPU, no output. After
        --dist-timeout, the timeout torch raises."""
        send(self.status_fd, {"ev": "reached", "stage": stage, "rank": self.rank})
        deadline = time.monotonic() + self.opts.dist_timeout
        while True:
            ready, _, _ = select.select([self.group_fd], [], [], 1.0)
            if ready and os.read(self.group_fd, 1):
                return
            if self.parent_gone():
                os._exit(1)
            if time.monotonic() >= deadline:
                raise RankCrash(frames, timeout_line % {"what": what, "seconds": int(self.opts.dist_timeout)})

    def repack_marlin_weights(self, seconds, phase, started):
        """--repack-seconds: silent post-processing, layer after layer: a fresh buffer (its pages
        fault in) and one long native call on it, always from the same line, as a repack or a
        per-layer JIT does. To a watcher: CPU busy, the stack the same from one look to the next,
        memory touched at every layer."""
        layer_seconds = self.opts.repack_layer_seconds
        probe = time.monotonic()
        hashlib.pbkdf2_hmac("sha256", b"calibrate", b"marlin", 20000)
        rounds = max(1000, int(20000 * layer_seconds / max(1e-3, time.monotonic() - probe)))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check_fault(phase, started)
            if self.parent_gone():
                os._exit(1)
            # A new mapping each layer, so its pages really are new (malloc would hand back the last
            # layer's): filling it faults them in, as a freshly allocated layer does.
            fresh = mmap.mmap(-1, REPACK_LAYER_MIB * MIB)
            fresh.write(PAGE_FILL * (REPACK_LAYER_MIB * MIB // len(PAGE_FILL)))
            hashlib.pbkdf2_hmac("sha256", fresh, b"marlin", rounds)
            fresh.close()

    def sleep(self, seconds, phase, started):
        """Idle wait that still honours faults and the parent's death."""
        end = time.monotonic() + seconds
        while True:
            self.check_fault(phase, started)
            left = end - time.monotonic()
            if left <= 0:
                return
            if self.parent_gone():
                os._exit(1)
            time.sleep(min(left, 0.1))

    def burn(self, seconds, phase, started, duty=1.0, util_burst=False, spawn_compilers=False):
        """Silent CPU work (JIT compilation, weight post-processing): a busy loop at `duty`."""
        end = time.monotonic() + seconds
        tick = 0
        while True:
            self.check_fault(phase, started)
            now = time.monotonic()
            if now >= end:
                return
            if self.parent_gone():
                os._exit(1)
            if util_burst:
                self.gpu(util=85 if tick % 2 else 0)
            if spawn_compilers and tick % 4 == 0:
                self._spawn_compiler(min(0.3, end - now))
            slice_end = min(end, now + 0.1 * duty)
            while time.monotonic() < slice_end:
                for _ in range(2000):
                    pass
            if duty < 1.0:
                time.sleep(min(0.1 * (1 - duty), max(0.0, end - time.monotonic())))
            self._reap_compilers()
            tick += 1

    def _spawn_compiler(self, seconds):
        """A short-lived child burning CPU, like vLLM's g++ runs: its CPU time only shows up in the
        parent's reaped-children counters (cutime/cstime)."""
        code = "import time\nend=time.monotonic()+%f\nwhile time.monotonic()<end: pass\n" % seconds
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
        self.children.append(proc.pid)
        self._compilers = getattr(self, "_compilers", []) + [proc]

    def _reap_compilers(self):
        for proc in list(getattr(self, "_compilers", [])):
            if proc.poll() is not None:
                self._compilers.remove(proc)
                self.children.remove(proc.pid)

    # --- loading ------------------------------------------------------------------------------
    def load_weights(self, shards, desc, show_bar):
        """Read the weights, checking each shard's header first. --shard-reads slice (the default):
        this rank's 1/tp of every shard at load_rate/tp, its range dropped from the page cache first
        so the read reaches the disk. every-rank: every shard whole at load_rate, nothing dropped,
        as each rank process of a real TP engine reads the whole model: the ranks share the page
        cache, the first to reach a page reads it from the disk and a prefetch's pages are kept.
        Either way the load takes model/load_rate when the pace is the limit."""
        opts = self.opts
        every_rank = opts.shard_reads == EVERY_RANK
        started = time.monotonic()
        rate = max(1.0, opts.load_rate_mib * MIB / (1 if every_rank else opts.tp))
        done_bytes = 0
        target = opts.gpu_memory_mib * WEIGHTS_SHARE
        buf = bytearray(CHUNK)
        if show_bar and not opts.quiet_load:
            self.log.progress(logs.format_tqdm(desc, 0, len(shards), 0.0))
        for index, path in enumerate(shards):
            self.check_fault("loading", started)
            if index == len(shards) - 1:
                self.wait_while_held()
            try:
                with open(path, "rb") as fileobj:
                    size = os.fstat(fileobj.fileno()).st_size
                    header, data_start = safetensors.read_header(fileobj, size)
                    length = size - data_start
                    fd = fileobj.fileno()
                    if every_rank:
                        lo, hi = data_start, size
                    else:
                        lo = data_start + length * self.rank // opts.tp
                        hi = data_start + length * (self.rank + 1) // opts.tp
                        # Drop this slice from the page cache so the read reaches the disk and
                        # read_bytes grows, as with a cold 548 GB model.
                        os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
                    # --read-mode mmap: the pages fault in through a mapping, as the engines'
                    # default safetensors loader does (read_bytes grows, rchar does not).
                    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if opts.read_mode == MMAP else None
                    offset = lo
                    while offset < hi:
                        want = min(CHUNK, hi - offset)
                        if mapped is None:
                            got = os.preadv(fd, [memoryview(buf)[:want]], offset)
                        else:
                            buf[:want] = mapped[offset:offset + want]
                            got = want
                        if got <= 0:
                            break
                        offset += got
                        done_bytes += got
                        # Pace to the configured rate: the sleep is what makes a slow disk.
                        ahead = started + done_bytes / rate - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
                        fraction = (index + (offset - lo) / max(1, hi - lo)) / len(shards)
                        self.gpu(memory_mib=CONTEXT_MIB + (target - CONTEXT_MIB) * fraction, util=2)
                        self.check_fault("loading", started)
                        if self.parent_gone():
                            os._exit(1)
                    if mapped is not None:
                        mapped.close()
            except safetensors.SafetensorError as exc:
                site = "/opt/modelwake/venv/lib/python3.11/site-packages/"
                loader = "vllm/model_executor" if self.log.engine == logs.VLLM else "sglang/srt"
                frames = [
                    (site + loader + "/model_loader/loader.py", 449, "load_weights",
                     "model.load_weights(self._get_all_weights(model_config, model))"),
                    (site + loader + "/model_loader/weight_utils.py", 682, "safetensors_weights_iterator",
                     "with safe_open(st_file, framework=\"pt\") as f:"),
                ]
                raise RankCrash(frames, "safetensors_rust.SafetensorError: %s" % exc)
            if show_bar and not opts.quiet_load:
                self.log.progress(logs.format_tqdm(desc, index + 1, len(shards), time.monotonic() - started))
        self.gpu(memory_mib=target, util=0, force=True)
        self.check_fault("loading", started, phase_over=True)
        return time.monotonic() - started

    def download_from_hub(self):
        """A hub id with HF_ENDPOINT set: download the weights into the hub cache first, as the
        engines' download_weights_from_hf does: under a file lock, so one rank downloads and the
        others wait on it (parked in flock(2)) and then find the blobs there. Returns (snapshot
        directory, seconds including the wait)."""
        opts = self.opts
        started = time.monotonic()

        def between_chunks():
            self.check_fault("loading", started)
            if self.parent_gone():
                os._exit(1)

        cache = hub.cache_root()
        lock = hub.download_lock(opts.model_path, cache)
        try:
            download = hub.HubDownload(os.environ["HF_ENDPOINT"], opts.model_path, cache=cache,
                                       rate_mib=opts.download_rate_mib, check=between_chunks)
            snapshot = download.snapshot((".safetensors", ".json"))
        finally:
            lock.close()
        return snapshot, time.monotonic() - started

    def stream_weights(self, url, show_bar):
        """--load-format runai_streamer from http://: this rank's slice of every shard over one TCP
        connection, received with read(2) on the socket (rchar grows; no file is read or written),
        paced like a disk load. Returns (seconds, bytes streamed)."""
        opts = self.opts
        started = time.monotonic()
        rate = max(1.0, opts.load_rate_mib * MIB / opts.tp)
        conn = hub.StreamConnection(url)
        done = [0]

        def between_chunks():
            self.check_fault("loading", started)
            if self.parent_gone():
                os._exit(1)

        def received(chunk):
            done[0] += len(chunk)
            ahead = started + done[0] / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

        try:
            index = json.loads(conn.get("model.safetensors.index.json", check=between_chunks).decode("utf-8"))
            shards = sorted(set(index["weight_map"].values()))
            tensors_total, tensors_done = len(index["weight_map"]), 0
            target = opts.gpu_memory_mib * WEIGHTS_SHARE
            if show_bar:
                self.log.progress(logs.format_tqdm(STREAMER_DESC, 0, tensors_total, 0.0))
            for number, name in enumerate(shards):
                if number == len(shards) - 1:
                    self.wait_while_held()
                (length,) = struct.unpack("<Q", conn.get(name, 0, 8, check=between_chunks))
                header = json.loads(conn.get(name, 8, 8 + length, check=between_chunks).decode("utf-8"))
                data_start = 8 + length
                size = safetensors.data_size(header)
                lo = data_start + size * self.rank // opts.tp
                hi = data_start + size * (self.rank + 1) // opts.tp
                done[0] += 8 + length
                conn.get(name, lo, hi, into=received, check=between_chunks)
                tensors_done += len([k for k in header if k != "__metadata__"])
                self.gpu(memory_mib=CONTEXT_MIB + (target - CONTEXT_MIB) * (number + 1) / len(shards), util=2)
                if show_bar:
                    self.log.progress(logs.format_tqdm(STREAMER_DESC, tensors_done, tensors_total,
                                                       time.monotonic() - started))
        except (OSError, hub.HubError, ValueError, KeyError) as exc:
            raise RankCrash(STREAMER_FRAMES, "runai_model_streamer.exceptions.StreamerError: %s" % exc)
        finally:
            conn.close()
        elapsed = time.monotonic() - started
        # The streamer's own logger, from every rank (file_streamer.py's summary line).
        self.log.raw("[%s] INFO file_streamer.py:66: [RunAI Streamer] Overall time to stream %s of all files "
                     "to cpu: %ss, %s/s" % (time.strftime("%Y-%m-%d %H:%M:%S"), hub.human_binary(done[0]),
                                            round(elapsed, 2), hub.human_binary(done[0] / max(elapsed, 1e-6))))
        self.gpu(memory_mib=opts.gpu_memory_mib * WEIGHTS_SHARE, util=0, force=True)
        self.check_fault("loading", started, phase_over=True)
        return elapsed, done[0]

    def wait_while_held(self):
        """--hold-load FILE: while FILE exists the load pauses before its last shard (no reads, no
        CPU, no output: a stuck read, to a watcher no progress), so a test can keep a start in
        `loading` for as long as it needs, whatever this machine's speed, and let it go by removing
        the file. The test releases it within the watcher's stall_timeout."""
        hold = self.opts.hold_load
        while hold and os.path.exists(hold):
            if self.parent_gone():
                os._exit(1)
            time.sleep(0.2)

    # --- serving ------------------------------------------------------------------------------
    def serve(self, warmup=None):
        """Answer generation requests from the API process until SIGTERM.

        `warmup` (SGLang): callable run before the first request is answered.
        Requests: {"cmd": "gen", "id", "n", "prompt_tokens", "quiet"} and {"cmd": "ready"}.
        """
        opts = self.opts
        active = []  # [id, remaining, total]
        pending = b""
        ready_since = None if warmup else time.monotonic()
        warmed = warmup is None
        tokens = work.TokenReporter(lambda event: send(self.status_fd, event))
        while True:
            if ready_since is not None:
                self.check_fault("ready", ready_since)
            if self.parent_gone():
                os._exit(1)
            timeout = 0 if active else 1.0
            readable, _, _ = select.select([self.request_fd], [], [], timeout)
            new = []
            if readable:
                chunk = os.read(self.request_fd, 65536)
                if not chunk:
                    os._exit(0)  # the API process closed its end: it is gone
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    msg = json.loads(line.decode("utf-8"))
                    if msg["cmd"] == "ready":
                        ready_since = time.monotonic()
                    else:
                        new.append(msg)
            if new:
                if not warmed:
                    warmup()
                    warmed = True
                loud = [m for m in new if not m.get("quiet")]
                if loud and self.log.engine == logs.SGLANG:
                    self.log.info("Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: 0.00, "
                                  "#running-req: %d, #queue-req: 0, " % (len(loud), sum(m["prompt_tokens"] for m in loud),
                                                                        len(active)))
                time.sleep(opts.prefill_seconds_per_token * sum(m["prompt_tokens"] for m in new))
                tokens.step(prompt=sum(m["prompt_tokens"] for m in new))
                for msg in new:
                    if msg["n"] <= 0:
                        send(self.status_fd, {"ev": "gen", "id": msg["id"], "ntok": 0})
                    else:
                        active.append([msg["id"], msg["n"], msg["n"]])
            if active:
                self.gpu(util=90)
                # One decode step yields a token for every running request; a bigger batch makes the
                # step a little slower, so throughput grows sub-linearly with concurrency.
                time.sleep(opts.token_seconds * (1 + 0.02 * (len(active) - 1)))
                for item in active:
                    item[1] -= 1
                tokens.step(generated=len(active))
                finished = [a for a in active if a[1] <= 0]
                if finished:
                    tokens.flush()  # counted before the answer goes out, as an engine's own counters are
                for item in finished:
                    active.remove(item)
                    send(self.status_fd, {"ev": "gen", "id": item[0], "ntok": item[2]})
            else:
                tokens.flush()
                self.gpu(util=0)


def shard_paths(model_path):
    """The checkpoint's shards in file order (what the loaders glob)."""
    names = sorted(n for n in os.listdir(model_path) if n.endswith(".safetensors"))
    return [os.path.join(model_path, n) for n in names]
