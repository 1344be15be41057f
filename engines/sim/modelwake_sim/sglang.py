"""SGLang's start-up: schedulers load and initialise, then uvicorn binds, then the warm-up request."""
import os
import signal
import threading
import time
import urllib.request

from . import churn, engine, faults, logs, nodes, ranks

DESC = "Loading safetensors checkpoint shards"
SITE = engine.SITE
# Where a rank waits for the other nodes, and what torch says when they never come.
RENDEZVOUS_FRAMES = [
    ("%s/sglang/srt/model_executor/model_runner.py" % SITE, 612, "init_torch_distributed",
     "init_distributed_environment("),
    ("%s/torch/distributed/rendezvous.py" % SITE, 189, "_create_c10d_store",
     "return TCPStore("),
]
RENDEZVOUS_TIMEOUT = ("torch.distributed.DistStoreError: Timed out after %(seconds)d seconds waiting for clients "
                      "(%(what)s)")
COLLECTIVE_FRAMES = [
    ("%s/sglang/srt/utils/common.py" % SITE, 421, "get_available_gpu_memory",
     "torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN, group=cpu_group)"),
    ("%s/torch/distributed/distributed_c10d.py" % SITE, 2806, "all_reduce", "work.wait()"),
]
COLLECTIVE_TIMEOUT = ("torch.distributed.DistBackendError: [%(what)s] Watchdog caught collective operation timeout: "
                      "WorkGloo(OpType=ALLREDUCE) ran for %(seconds)d000 milliseconds before timing out.")


class SGLangServer(engine.ApiServer):
    """`python -m sglang.launch_server`, scaled down."""

    def run(self):
        opts = self.opts
        # A multi-node server runs tp / nnodes ranks on each node: TP0-7 on node 0, TP8-15 on node 1.
        local_tp = opts.tp // opts.nnodes
        first_rank = opts.node_rank * local_tp
        self._startup_pause()
        self.log.info(engine.server_args_line(opts))
        problem = self._check_model()
        if problem:
            self.log.traceback(*problem)
            return 1
        if opts.node_rank == 0:
            # SGLang only binds when uvicorn starts; check now so a port conflict does not cost a load.
            self._bind().close()
        self._ensure_gpus()
        if "loader-chain" in opts.churn:
            churn.loader_chain(opts)  # gone, exit 0 and reaped, before the real schedulers start
        self._setup_pipes_and_signals()
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        group = None
        self.group_pipes = {}
        if opts.nnodes > 1:
            self.group_pipes = {rank: os.pipe() for rank in range(first_rank, first_rank + local_tp)}
            group = nodes.NodeGroup(opts.nnodes, opts.node_rank, opts.dist_init_addr, self._group_complete).start()
        for rank in range(first_rank, first_rank + local_tp):
            self._fork(lambda rank=rank: self._scheduler(rank, rank - first_rank))
        if opts.fault is not None and opts.fault.kind in faults.RANK_DEATHS:
            # The launcher waits on rank 0's pipe and polls no other scheduler: one that dies stays
            # a zombie (its exit status readable in /proc/<pid>/stat) while the launcher runs on.
            self.unwatched.update(self.children[1:])
            if opts.fault.kind == "rankreap":
                # This launcher reaps any scheduler that ends at once and says nothing: the killed
                # rank leaves no zombie, so no exit status is left to read.
                for index, pid in enumerate(self.children[1:], start=first_rank + 1):
                    churn.reap_later(pid, opts.churn_record, reaped="rank", rank=index)
        if "node-rank" in opts.churn:
            churn.node_rank_helper(opts)  # forked before _after_fork's threads start
        self._after_fork()
        ready_ranks = set()
        reached = {stage: set() for stage in nodes.STAGES}
        while True:
            event = self.next_event()
            kind = event.get("ev")
            if kind == "reached":
                reached[event["stage"]].add(event["rank"])
                if len(reached[event["stage"]]) == local_tp:
                    group.reached(event["stage"])
            elif kind == "init_done":
                ready_ranks.add(event["rank"])
                # The other nodes serve no HTTP: their ranks follow node 0's batches.
                if len(ready_ranks) == local_tp and opts.node_rank == 0:
                    self._open_port()
            elif kind == "warmup_done":
                self.state = "ready"
                self._tell_rank0({"cmd": "ready"})
                self.log.info("The server is fired up and ready to roll!")
            elif kind == "warmup_failed":
                self.log.error("Initialization failed. warmup error: %s" % event.get("error", ""))
                self._die(1)
            elif kind == "exit":
                # A scheduler that vanished without SIGQUIT (killed, or crash0): say which and leave.
                rank = self.children.index(event["pid"]) if event["pid"] in self.children else 0
                self.log.error("Rank %d scheduler is dead. Please check if there are relevant logs." % rank)
                self.log.error("Exit code: %d" % event["code"])
                self._die(0)

    def _group_complete(self, stage):
        """The whole group reached `stage` (a link thread): release this node's ranks."""
        for _, write_end in self.group_pipes.values():
            try:
                os.write(write_end, b"g")
            except OSError:
                pass

    def _on_sigquit(self, signum, frame):
        self.log.error("Received sigquit from a child proces. It usually means the child failed.")
        self._die(1)

    def _open_port(self):
        self.state = "warmup"
        self.sock = self._bind()
        self.log.uvicorn("Started server process [%d]" % os.getpid())
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        self._start_http()
        self.log.uvicorn("Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (self.opts.host, self.opts.port))
        threading.Thread(target=self._warmup, daemon=True).start()

    def _warmup(self):
        """`_wait_and_warmup`: poll /get_model_info, then one real /generate (600 s timeout)."""
        base = "http://%s:%d" % (self.opts.host if ":" not in self.opts.host else "[%s]" % self.opts.host, self.opts.port)
        headers = {"Authorization": "Bearer " + self.api_key} if self.api_key else {}
        try:
            for _ in range(120):
                try:
                    req = urllib.request.Request(base + "/get_model_info", headers=headers)
                    urllib.request.urlopen(req, timeout=5).read()
                    break
                except OSError:
                    time.sleep(1)
            body = b'{"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}'
            req = urllib.request.Request(base + "/generate", data=body, method="POST",
                                         headers=dict(headers, **{"Content-Type": "application/json"}))
            urllib.request.urlopen(req, timeout=600).read()
        except Exception as exc:  # any failure of the warm-up request is fatal in SGLang too
            self.events.put({"ev": "warmup_failed", "error": "%s: %s" % (type(exc).__name__, exc)})
            return
        self.events.put({"ev": "warmup_done"})

    # --- the scheduler process ------------------------------------------------------------------
    def _scheduler(self, rank, local_rank):
        opts = self.opts
        log = logs.Logger("sglang", rank=rank)
        request_fd = self.request_r if rank == 0 else None
        if rank != 0:
            os.close(self.request_r)
        title = "sglang::scheduler_TP%d" % rank
        group_fd = self.group_pipes[rank][0] if self.group_pipes else None
        r = ranks.Rank(opts, rank, log, self.status_w, request_fd, title, title, local_rank=local_rank,
                       group_fd=group_fd)
        try:
            return self._scheduler_phases(r, log)
        except ranks.RankCrash as crash:
            log.traceback(crash.frames, crash.exc_line, header="Scheduler hit an exception: ",
                          intro="Traceback (most recent call last):")
            if crash.alone:
                # rankdeath: this rank dies on its own; the launcher, blocked reading rank 0's pipe
                # (rank 0 waits for this rank in a collective), never hears of it.
                return 1
            os.kill(os.getppid(), signal.SIGQUIT)
            # The API process now kills the whole tree; wait for it rather than race it with an exit.
            time.sleep(5)
            return 1

    def _scheduler_phases(self, r, log):
        opts = self.opts
        total = opts.gpu_total_mib / engine.GB
        started = time.monotonic()
        log.info("Init torch distributed begin.")
        if opts.nnodes > 1:
            r.wait_for_group(nodes.RENDEZVOUS, "%d nodes at %s" % (opts.nnodes, opts.dist_init_addr),
                             RENDEZVOUS_FRAMES, RENDEZVOUS_TIMEOUT)
        r.sleep(opts.start_seconds * 0.3, "starting", started)
        r.gpu(memory_mib=ranks.CONTEXT_MIB, util=0, force=True)
        log.info("Init torch distributed ends. mem usage=%.2f GB" % (ranks.CONTEXT_MIB / engine.GB))
        log.info("Multimodal attention backend not set. Use triton_attn.")
        log.info("Using triton_attn as multimodal attention backend.")
        r.sleep(opts.start_seconds * 0.3, "starting", started)
        r.check_fault("starting", started, phase_over=True)

        avail = total - ranks.CONTEXT_MIB / engine.GB
        log.info("Load weight begin. avail mem=%.2f GB" % avail)
        if opts.load_format == "runai_streamer":
            elapsed, _ = r.stream_weights(opts.model_path, show_bar=(r.rank == 0))
        else:
            model_dir = opts.model_path
            if self.from_hub:
                # SGLang's download_weights_from_hf logs the format and then nothing until loading.
                log.info("Using model weights format ['*.safetensors']")
                model_dir, _ = r.download_from_hub()
            elapsed = r.load_weights(ranks.shard_paths(model_dir), DESC, show_bar=(r.rank == 0))
        weights = opts.gpu_memory_mib * ranks.WEIGHTS_SHARE / engine.GB
        log.info("Load weight end. elapsed=%.2f s, type=DeepseekV3ForCausalLM, quant=compressed-tensors, "
                 "dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB." % (elapsed, total - weights, weights))
        if opts.nnodes > 1:
            # The memory profile's all_reduce over every rank of every node: a node that died while
            # loading leaves the others here, silent.
            r.wait_for_group(nodes.AFTER_LOAD, "Rank %d" % r.rank, COLLECTIVE_FRAMES, COLLECTIVE_TIMEOUT)

        init_started = time.monotonic()
        if opts.benign_error_lines:
            log.benign_errors()  # CuTe DSL's import check, as the graph capture imports it
        churn.in_rank(r, opts)  # --churn compile-workers, helper-sigterm: children made, ended, reaped
        if opts.python_work_seconds:
            r.python_work(opts.python_work_seconds)
        if opts.repack_seconds:
            r.repack_marlin_weights(opts.repack_seconds, "initializing", init_started)
        kv = opts.gpu_memory_mib * (1 - ranks.WEIGHTS_SHARE) / engine.GB
        tokens = int(kv * 1024 * 1024 / 70)
        log.info("Using KV cache dtype: torch.bfloat16")
        log.info("KV Cache is allocated. #tokens: %d, KV size: %.2f GB" % (tokens, kv))
        r.gpu(memory_mib=opts.gpu_memory_mib, util=0, force=True)
        log.info("Memory pool end. avail mem=%.2f GB" % (total - opts.gpu_memory_mib / engine.GB))
        duty = 1.0 if r.rank == 0 else 0.2
        if opts.disable_cuda_graph:
            # K2.6: the Marlin MoE kernels are JIT-compiled, with no log output and idle GPUs.
            log.info("Using CompressedTensorsWNA16MarlinMoEMethod")
            r.burn(opts.init_seconds, "initializing", init_started, duty=duty)
        else:
            log.info("Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB"
                     % (total - opts.gpu_memory_mib / engine.GB))
            sizes = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
            log.info("Capture cuda graph bs %s" % sizes)
            for i, bs in enumerate(reversed(sizes)):
                if r.rank == 0:
                    log.progress("Capturing batches (bs=%d avail_mem=%.2f GB): %3d%%|%s| %d/%d"
                                 % (bs, total - opts.gpu_memory_mib / engine.GB, 100 * i // len(sizes),
                                    "#" * i, i, len(sizes)))
                r.burn(opts.init_seconds / len(sizes), "initializing", init_started, duty=duty)
            log.info("Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB."
                     % (time.monotonic() - init_started, 0.5, total - opts.gpu_memory_mib / engine.GB))
        r.check_fault("initializing", init_started, phase_over=True)
        if r.rank == 0:
            log.info("max_total_num_tokens=%d, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                     "max_running_requests=64, context_len=%d, available_gpu_mem=%.2f GB"
                     % (tokens, engine.MAX_MODEL_LEN, total - opts.gpu_memory_mib / engine.GB))
        ranks.send(self.status_w, {"ev": "init_done", "rank": r.rank})
        if r.rank != 0:
            # Other ranks follow rank 0's batches over NCCL; here they simply wait, idle.
            while not r.parent_gone():
                time.sleep(1.0)
            return 1

        def warmup():
            warm_started = time.monotonic()
            r.burn(opts.warmup_seconds, "warmup", warm_started, duty=0.5, util_burst=True)
            r.check_fault("warmup", warm_started, phase_over=True)

        r.serve(warmup=warmup)
        return 0


__all__ = ["SGLangServer", "faults"]
