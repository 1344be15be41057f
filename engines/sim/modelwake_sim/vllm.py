"""vLLM's start-up: API server -> EngineCore -> Worker(s); the port listens only when ready."""
import json
import os
import queue
import signal
import threading
import time

from . import engine, logs, ranks, work

DESC = "Loading safetensors checkpoint shards"
SITE = engine.SITE
WORKER_FAILED = ("Exception: WorkerProc initialization failed due to an exception in a background process. "
                 "See stack trace for root cause.")
ENGINE_DEAD = ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
               "See stack trace (above) for the root cause.")


class VLLMServer(engine.ApiServer):
    """`python -m vllm.entrypoints.openai.api_server`, scaled down."""

    def run(self):
        opts = self.opts
        self._startup_pause()
        self.log.info("vLLM API server version %s" % engine.VLLM_VERSION, "api_server.py:1839")
        self.log.info("non-default args: %s" % self._non_default_args(), "utils.py:253")
        if opts.benign_error_lines:
            self.log.benign_errors()
        # vLLM binds early (create_server_socket) but does not listen: connects are refused.
        self.sock = self._bind()
        problem = self._check_model()
        if problem:
            self.log.traceback(*problem)
            return 1
        self._ensure_gpus()
        self._setup_pipes_and_signals()
        core = self._fork(self._engine_core)
        self._after_fork()
        while True:
            event = self.next_event()
            kind = event.get("ev")
            if kind == "engine_ready":
                self._open_port()
            elif kind == "engine_failed":
                self.log.traceback(
                    [("%s/vllm/v1/engine/core_client.py" % SITE, 98, "make_async_mp_client",
                      "return AsyncMPClient(*client_args)"),
                     ("%s/vllm/v1/engine/utils.py" % SITE, 1023, "wait_for_engine_startup",
                      "raise RuntimeError(")],
                    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}")
                self._die(1)
            elif kind == "engine_dead":
                self._engine_dead(event.get("code", 0))
            elif kind == "exit" and event["pid"] == core:
                # EngineCore reports how it failed before exiting, but through the status pipe's
                # reader thread: give that report the chance to arrive first.
                late = self._late_event(("engine_failed", "engine_dead"))
                if late is not None:
                    self.events.put(late)
                    continue
                if self.state == "ready":
                    self._engine_dead(0)
                self.log.traceback(
                    [("%s/vllm/v1/engine/utils.py" % SITE, 1023, "wait_for_engine_startup", "raise RuntimeError(")],
                    "RuntimeError: Engine core initialization failed. See root cause above. "
                    "Failed core proc(s): {'EngineCore': %d}" % event["code"])
                self._die(1)

    def _late_event(self, kinds, wait=0.5):
        """The first queued event of `kinds` arriving within `wait` seconds, or None."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if event.get("ev") in kinds:
                return event
        return None

    def _non_default_args(self):
        args = {"model": self.opts.model_path, "trust_remote_code": True,
                "host": self.opts.host, "port": self.opts.port}
        if self.opts.served_model_name:
            args["served_model_name"] = [self.opts.served_model_name]
        if self.opts.tp != 1:
            args["tensor_parallel_size"] = self.opts.tp
        if self.api_key:
            args["api_key"] = ["********"]
        return repr(args)

    def _open_port(self):
        host = self.opts.host if ":" not in self.opts.host else "[%s]" % self.opts.host
        self.log.info("Supported tasks: ['generate']", "api_server.py:1611")
        self.log.info("Starting vLLM server on http://%s:%d" % (host, self.opts.port), "api_server.py:1912")
        self.log.info("Available routes are:", "launcher.py:37")
        for path, methods in (("/health", "GET"), ("/v1/models", "GET"), ("/version", "GET"),
                              ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/metrics", "GET")):
            self.log.info("Route: %s, Methods: %s" % (path, methods), "launcher.py:45")
        self.log.uvicorn("Started server process [%d]" % os.getpid())
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        self.state = "ready"
        self._start_http()

    def _engine_dead(self, code):
        self.state = "dead"
        self.log.traceback(
            [("%s/vllm/v1/engine/async_llm.py" % SITE, 476, "output_handler",
              "outputs = await engine_core.get_output_async()"),
             ("%s/vllm/v1/engine/core_client.py" % SITE, 891, "get_output_async",
              "raise self._format_exception(outputs) from None")],
            ENGINE_DEAD, header="AsyncLLM output_handler failed.", source="async_llm.py:480")
        if self.httpd is not None:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn("Finished server process [%d]" % os.getpid())
        self._die(code)

    # --- the EngineCore process ---------------------------------------------------------------
    def _engine_core(self):
        opts = self.opts
        ranks.set_title("VLLM::EngineCore")
        log = logs.Logger("vllm", role="EngineCore")
        ranks.send(self.status_w, {"ev": "hello", "pid": os.getpid(), "rank": -1})
        started = time.monotonic()
        log.info("Initializing a V1 LLM engine (v%s) with config: model='%s', speculative_config=None, "
                 "tokenizer='%s', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
                 "trust_remote_code=True, dtype=torch.bfloat16, max_seq_len=%d, download_dir=None, "
                 "load_format=%s, tensor_parallel_size=%d, pipeline_parallel_size=1, "
                 "quantization=compressed-tensors, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, "
                 "served_model_name=%s, enable_prefix_caching=True"
                 % (engine.VLLM_VERSION, opts.model_path, opts.model_path, engine.MAX_MODEL_LEN, opts.load_format,
                    opts.tp, self.served_model_name), "core.py:93")
        core_r, core_w = os.pipe()
        workers = []
        for rank in range(opts.tp):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(core_r)
                    code = self._worker(rank, core_w)
                finally:
                    os._exit(code)
            workers.append(pid)
        os.close(core_w)
        events = queue.Queue()

        def on_sigterm(signum, frame):
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and any(engine._alive(p) for p in workers):
                time.sleep(0.05)
            for pid in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os._exit(0)

        signal.signal(signal.SIGTERM, on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        work.keep_serving_on_sigterm(opts)

        def read_workers():
            buf = b""
            while True:
                chunk = os.read(core_r, 65536)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    events.put(json.loads(line.decode("utf-8")))

        def watch(pid, rank):
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            events.put({"ev": "exit", "rank": rank, "code": code})

        def watch_parent():
            # The API process gone means we go too, unless told to imitate vLLM's orphans (#55510).
            parent = os.getppid()
            while os.getppid() == parent or opts.survive_parent_kill:
                time.sleep(1.0)
            on_sigterm(None, None)

        threading.Thread(target=watch_parent, daemon=True).start()
        threading.Thread(target=read_workers, daemon=True).start()
        for rank, pid in enumerate(workers):
            threading.Thread(target=watch, args=(pid, rank), daemon=True).start()
        done, failed, fatal = set(), False, False
        while True:
            event = events.get()
            kind = event["ev"]
            if kind == "init_done":
                done.add(event["rank"])
                if len(done) == opts.tp:
                    log.info("init engine (profile, create kv cache, warmup model) took %.2f seconds"
                             % (time.monotonic() - started), "core.py:250")
                    ranks.send(self.status_w, {"ev": "engine_ready"})
            elif kind == "init_failed":
                failed = True
            elif kind == "runtime_error":
                fatal = True
            elif kind == "exit":
                # The worker reports its failure before exiting, but through another thread: let
                # that report arrive before deciding how the worker died.
                deadline = time.monotonic() + 0.5
                while not (failed or fatal) and time.monotonic() < deadline:
                    try:
                        late = events.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    failed = failed or late["ev"] == "init_failed"
                    fatal = fatal or late["ev"] == "runtime_error"
                if failed:
                    log.traceback(
                        [("%s/vllm/v1/engine/core.py" % SITE, 711, "run_engine_core",
                          "engine_core = EngineCoreProc(*args, **kwargs)"),
                         ("%s/vllm/v1/executor/multiproc_executor.py" % SITE, 615, "wait_for_ready",
                          "raise e from None")],
                        WORKER_FAILED, header="EngineCore failed to start.", source="core.py:720")
                    ranks.send(self.status_w, {"ev": "engine_failed"})
                elif fatal:
                    log.traceback(
                        [("%s/vllm/v1/engine/core.py" % SITE, 760, "run_engine_core", "engine_core.run_busy_loop()"),
                         ("%s/vllm/v1/executor/multiproc_executor.py" % SITE, 290, "collective_rpc",
                          "raise RuntimeError(f\"Worker failed with error '{e}'\")")],
                        "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered'",
                        header="EngineCore encountered a fatal error.", source="core.py:769")
                    ranks.send(self.status_w, {"ev": "engine_dead", "code": 1})
                else:
                    log.error("Worker proc VllmWorker-%d died unexpectedly (exit code: %d)"
                              % (event["rank"], event["code"]), "multiproc_executor.py:183")
                    ranks.send(self.status_w, {"ev": "engine_dead", "code": 0})
                on_sigterm(None, None)

    # --- the Worker process -------------------------------------------------------------------
    def _worker(self, rank, core_w):
        opts = self.opts
        role = "Worker" if opts.tp == 1 else "Worker_TP%d" % rank
        log = logs.Logger("vllm", role=role)
        if rank != 0:
            os.close(self.request_r)
        r = ranks.Rank(opts, rank, log, self.status_w, self.request_r if rank == 0 else None,
                       "VLLM::" + role, "VLLM::" + role)
        serving = False
        try:
            self._worker_phases(r, log)
            serving = True
            ranks.send(core_w, {"ev": "init_done", "rank": rank})
            if rank != 0:
                while not r.parent_gone():
                    time.sleep(1.0)
                return 1
            r.serve()
            return 0
        except ranks.RankCrash as crash:
            if serving:
                log.traceback(crash.frames, crash.exc_line, header="WorkerProc hit an exception.",
                              source="multiproc_executor.py:771")
                ranks.send(core_w, {"ev": "runtime_error", "rank": rank})
            else:
                log.traceback(crash.frames, crash.exc_line, header="WorkerProc failed to start.",
                              source="multiproc_executor.py:743")
                ranks.send(core_w, {"ev": "init_failed", "rank": rank})
            return 1

    def _worker_phases(self, r, log):
        opts = self.opts
        started = time.monotonic()
        log.info("world_size=%d rank=%d local_rank=%d distributed_init_method=tcp://127.0.0.1:%d backend=nccl"
                 % (opts.tp, r.rank, r.rank, 40000 + opts.port % 20000), "parallel_state.py:1208")
        r.sleep(opts.start_seconds * 0.6, "starting", started)
        r.gpu(memory_mib=ranks.CONTEXT_MIB, util=0, force=True)
        r.check_fault("starting", started, phase_over=True)

        log.info("Starting to load model %s..." % opts.model_path, "gpu_model_runner.py:2338")
        if opts.load_format == "runai_streamer":
            elapsed, _ = r.stream_weights(opts.model_path, show_bar=(r.rank == 0))
        else:
            log.info("Using model weights format ['*.safetensors']", "default_loader.py:267")
            model_dir = opts.model_path
            if self.from_hub:
                # Downloaded with progress bars off (DisabledTqdm): nothing until the end, and then
                # only when it took over half a second (weight_utils.download_weights_from_hf).
                model_dir, seconds = r.download_from_hub()
                if seconds > 0.5:
                    log.info("Time spent downloading weights for %s: %.6f seconds" % (opts.model_path, seconds),
                             "weight_utils.py:581")
            elapsed = r.load_weights(ranks.shard_paths(model_dir), DESC, show_bar=(r.rank == 0))
        log.info("Loading weights took %.2f seconds" % elapsed, "default_loader.py:291")
        log.info("Model loading took %.4f GiB memory and %.6f seconds"
                 % (opts.gpu_memory_mib * ranks.WEIGHTS_SHARE / engine.GB, elapsed + 0.4), "gpu_model_runner.py:2370")

        # Weight post-processing (repacking for Marlin): CPU busy, nothing logged, GPUs idle.
        init_started = time.monotonic()
        if opts.python_work_seconds:
            r.python_work(opts.python_work_seconds)
        if opts.repack_seconds:
            r.repack_marlin_weights(opts.repack_seconds, "initializing", init_started)
        r.burn(opts.init_seconds, "initializing", init_started, duty=1.0 if r.rank == 0 else 0.2)
        r.check_fault("initializing", init_started, phase_over=True)

        warm_started = time.monotonic()
        log.info("Warming up model for the compilation...", "gpu_worker.py:412")
        r.burn(opts.warmup_seconds, "warmup", warm_started, duty=0.3, util_burst=True,
               spawn_compilers=(r.rank == 0))
        log.info("Initial profiling/warmup run took %.2f s" % (time.monotonic() - warm_started), "gpu_worker.py:430")
        kv = opts.gpu_memory_mib * (1 - ranks.WEIGHTS_SHARE) / engine.GB
        tokens = int(kv * 1024 * 1024 / 70)
        r.gpu(memory_mib=opts.gpu_memory_mib, util=0, force=True)
        log.info("Available KV cache memory: %.2f GiB" % kv, "gpu_worker.py:298")
        log.info("GPU KV cache size: %s tokens" % format(tokens, ","), "kv_cache_utils.py:1087")
        log.info("Maximum concurrency for %s tokens per request: %.2fx"
                 % (format(engine.MAX_MODEL_LEN, ","), tokens / float(engine.MAX_MODEL_LEN)), "kv_cache_utils.py:1091")
        r.check_fault("warmup", warm_started, phase_over=True)
