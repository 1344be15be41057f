"""Command line: `python -m modelwake_sim make-model DIR ...`, `... serve ...` and `... hub DIR ...`."""
import argparse
import os
import sys

from . import __version__, churn, faults, hub, model, nodes, ranks, work

# Defaults scaled from the K2.6 start (548 GB at ~575 MiB/s = ~16 min of reading, then ~10 min of
# silent JIT, then a short warm-up) down to ~75 s for the default 2 GiB model.
DEFAULT_LOAD_RATE_MIB = 50.0
DEFAULT_START_SECONDS = 3.0
DEFAULT_INIT_SECONDS = 25.0
DEFAULT_WARMUP_SECONDS = 4.0


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("expected a number, got %r" % text)
        if value < 0:
            raise argparse.ArgumentTypeError("must be 0 or more, got %r" % text)
        return value
    return parse


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m modelwake_sim",
                                     description="Simulated SGLang/vLLM engine for modelwake's tests and demo.")
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    make = sub.add_parser("make-model", help="write a K2.6-like model directory with real safetensors shards",
                          description="Write (or complete) a Kimi-K2.6-like model directory: config.json with a "
                                      "compressed-tensors quantization_config, model.safetensors.index.json and "
                                      "N real safetensors shards. Complete files are kept (idempotent).")
    make.add_argument("directory", help="model directory to create; nothing is written outside it")
    make.add_argument("--size-mib", type=int, default=2048, help="total size of the shards in MiB (default 2048)")
    make.add_argument("--shards", type=int, default=64, help="number of shard files (default 64, like K2.6)")
    make.add_argument("--quantization", default="nvfp4-pack-quantized", choices=model.QUANTIZATIONS,
                      help="compressed-tensors format of config.json (default nvfp4-pack-quantized; "
                           "'none' writes no quantization_config)")

    serve = sub.add_parser("serve", help="start up and serve like SGLang or vLLM",
                           description="Start up like the real engine (process tree, log lines, port behaviour, "
                                       "real shard reads, silent CPU-bound initialisation) and serve an "
                                       "OpenAI-style API. API key: environment variable MODELWAKE_API_KEY, else where "
                                       "the engine takes it (SGLang: --config's api-key; vLLM: VLLM_API_KEY).")
    serve.add_argument("--engine", choices=("sglang", "vllm"), required=True, help="which engine to imitate")
    serve.add_argument("--model-path", "--model", dest="model_path", required=True,
                       help="model directory (make-model); or a hub id org/name, downloaded first into the hub "
                            "cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub) from $HF_ENDPOINT "
                            "(the `hub` command serves one); or with --load-format runai_streamer an "
                            "http://HOST:PORT/org/name URL streamed from that server")
    serve.add_argument("--load-format", choices=("auto", "runai_streamer"), default="auto",
                       help="auto: read the shards from disk (default); runai_streamer: stream them from the "
                            "http:// --model-path with read(2) on a socket, as the Run:ai model streamer does")
    serve.add_argument("--download-rate-mib", type=_positive(float), default=0.0,
                       help="hub download: receive at most this many MiB/s (default 0: as fast as the server "
                            "sends; the `hub` command's --rate-mib and --stall-after-mib shape it from the "
                            "server side, a stall included)")
    serve.add_argument("--python-work-seconds", type=_positive(float), default=0.0,
                       help="at the start of initialisation every rank executes pure Python on one hot line "
                            "for this long (GIL held, no log, disk or new memory), then goes on (default 0)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=30000, help="port to serve on (default 30000)")
    serve.add_argument("--tp", "--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1,
                       help="tensor-parallel ranks: one scheduler (SGLang) or worker (vLLM) process each (default 1)")
    serve.add_argument("--served-model-name", default=None,
                       help="model id in /v1/models and completions (default: the model path)")
    serve.add_argument("--load-rate-mib", type=_positive(float), default=DEFAULT_LOAD_RATE_MIB,
                       help="aggregate disk read rate while loading, MiB/s, shared by the ranks (default %g)"
                            % DEFAULT_LOAD_RATE_MIB)
    serve.add_argument("--shard-reads", choices=ranks.SHARD_READS, default=ranks.SLICE,
                       help="slice: each rank reads its 1/tp of every shard with pread at load-rate/tp, after "
                            "dropping that range from the page cache, so every read reaches the disk (default); "
                            "every-rank: each rank reads every shard whole at --load-rate-mib, through the page "
                            "cache and dropping nothing, as a real engine's TP ranks do: they share the cache "
                            "and a prefetch's pages are used (the load takes model/load-rate either way)")
    serve.add_argument("--read-mode", choices=ranks.READ_MODES, default=ranks.PREAD,
                       help="pread: the ranks read the shards with pread(2) into a buffer, as an eager loader "
                            "does (default); mmap: they map each shard and copy from the mapping, so its pages "
                            "fault in as with the engines' default safetensors loader (read_bytes grows, rchar "
                            "does not)")
    serve.add_argument("--start-seconds", type=_positive(float), default=DEFAULT_START_SECONDS,
                       help="imports and distributed init before loading (default %g)" % DEFAULT_START_SECONDS)
    serve.add_argument("--init-seconds", type=_positive(float), default=DEFAULT_INIT_SECONDS,
                       help="silent CPU-bound initialisation after loading, GPUs idle (default %g)"
                            % DEFAULT_INIT_SECONDS)
    serve.add_argument("--warmup-seconds", type=_positive(float), default=DEFAULT_WARMUP_SECONDS,
                       help="warm-up: SGLang's first request with the port open and /health 503; vLLM's "
                            "compilation warm-up with the port closed (default %g)" % DEFAULT_WARMUP_SECONDS)
    serve.add_argument("--token-seconds", type=_positive(float), default=0.025,
                       help="one decode step (a token for every running request), seconds (default 0.025)")
    serve.add_argument("--prefill-seconds-per-token", type=_positive(float), default=0.0002,
                       help="prefill cost per prompt token, seconds (default 0.0002)")
    serve.add_argument("--quiet-load", action="store_true", help="no tqdm shard progress bars while loading")
    serve.add_argument("--disable-cuda-graph", action="store_true",
                       help="SGLang: no graph capture lines; initialisation is K2.6's silent Marlin JIT after "
                            "'Using CompressedTensorsWNA16MarlinMoEMethod'")
    serve.add_argument("--no-access-log", action="store_true", help="no uvicorn access-log line per request")
    # SGLang's own flags, so that a deploy starts the simulator with the real engine's command line.
    serve.add_argument("--enable-metrics", action="store_true",
                       help="SGLang: serve /metrics (accepted; the simulator always serves it)")
    serve.add_argument("--config", default=None, metavar="FILE",
                       help="SGLang: a YAML file of further arguments; the simulator reads its api-key")
    serve.add_argument("--fake-gpus", action="store_true",
                       help="keep holder-<pid>.json files in $MODELWAKE_FAKE_GPU_DIR (default "
                            "/run/modelwake-fake-gpu) for tests/fakes/nvidia-smi; create gpus.json if absent")
    serve.add_argument("--gpu-memory-mib", type=_positive(int), default=76000,
                       help="GPU memory each rank holds once loaded and its KV cache allocated (default 76000)")
    serve.add_argument("--gpu-total-mib", type=_positive(int), default=97887,
                       help="memory of each fake GPU when gpus.json is created (default 97887)")
    serve.add_argument("--fake-gpu-count", type=_positive(int), default=8,
                       help="GPUs in a newly created gpus.json (at least --tp; default 8)")
    serve.add_argument("--fault", default=None, metavar="KIND:PHASE",
                       help="inject a fault: KIND crash1 (traceback, exit 1), crash0 (vLLM's worker death, "
                            "exit 0), hang (everything stops), spin (a busy-waiting collective: every rank but "
                            "the last spins forever in one native call with the GIL released, the last parks "
                            "elsewhere), rankdeath (the last rank logs 'Scheduler hit an exception:' and exits "
                            "1; the others wait for it in a collective; SGLang's launcher runs on and leaves "
                            "it a zombie), rankkill (the same rank SIGKILLed, no log), rankreap (the same SIGKILL, "
                            "and the launcher reaps the rank at once: no zombie, no exit status left to read; "
                            "--engine sglang); the rank deaths need --tp 2 or more; PHASE "
                            "starting|loading|initializing|warmup|ready")
    serve.add_argument("--fault-after", type=_positive(float), default=0.0,
                       help="seconds into PHASE before the fault fires (default 0; at the latest at the "
                            "phase's end)")
    serve.add_argument("--churn", action="append", default=[], choices=churn.KINDS, metavar="KIND",
                       help="a healthy start with process churn that looks like a rank's death, then ready as "
                            "usual (repeatable; --engine sglang): compile-workers (each rank's waves of short "
                            "workers, forked with its title or fork+exec'd, exit 0), loader-chain (before the "
                            "schedulers, a process titled sglang::scheduler_TP0 and its loader_TP0 reading the "
                            "shards through mmap, both exit 0), helper-sigterm (each rank SIGTERMs a hung "
                            "nvidia-smi probe and a forked check at its own timeout), node-rank (with --node-rank 0, "
                            "the API process forks a helper that exits 1); see modelwake_sim/churn.py")
    serve.add_argument("--churn-seconds", type=_positive(float), default=churn.DEFAULT_SECONDS,
                       help="how long each churn kind lasts (default %g)" % churn.DEFAULT_SECONDS)
    serve.add_argument("--churn-record", default=None, metavar="PATH",
                       help="append one JSON line per churn child once reaped (pid, parent, how it was made, its "
                            "title, how it ended, wall time), and the rank a rankkill or rankreap fault kills, "
                            "with the kill's wall time")
    serve.add_argument("--benign-error-lines", action="store_true",
                       help="a healthy start that logs lines looking like a crash, as the real engines do: "
                            "SGLang's 'Unexpected error during package walk: cutlass.cute.experimental' (CuTe DSL's "
                            "import check) from every rank as initialisation begins; vLLM's ulimit warning quoting "
                            "`OSError: [Errno 24] Too many open files` at start")
    serve.add_argument("--repack-seconds", type=_positive(float), default=0.0,
                       help="a silent weight post-processing phase after loading (K2.6's Marlin repack): "
                            "layer after layer, a long native call on a fresh buffer (default 0: none)")
    serve.add_argument("--repack-layer-seconds", type=_positive(float), default=2.5,
                       help="how long each layer's native call takes (default 2.5)")
    serve.add_argument("--hold-load", default=None, metavar="FILE",
                       help="while FILE exists the load pauses before its last shard (no reads, no CPU, no "
                            "output); tests hold a start in 'loading' with it and release it by removing FILE")
    serve.add_argument("--nnodes", type=int, default=1,
                       help="SGLang: nodes of a multi-node server; --tp counts the ranks of all of them (default 1)")
    serve.add_argument("--node-rank", type=int, default=0, help="SGLang: this node's rank, 0 serves HTTP (default 0)")
    serve.add_argument("--dist-init-addr", default=None, metavar="HOST:PORT",
                       help="SGLang: node 0's address; node 0 listens on its port, the others connect")
    serve.add_argument("--dist-timeout", type=_positive(float), default=1800.0,
                       help="seconds a rank waits in a collective for the other nodes (default 1800, gloo's)")
    serve.add_argument("--survive-parent-kill", action="store_true",
                       help="ranks keep running when the API process is SIGKILLed (vLLM's orphans, #55510)")

    work.add_options(serve)

    hub_cmd = sub.add_parser("hub", help="serve a make-model directory as a Hugging Face hub repository",
                             description="Serve DIR as hub repository REPO for `serve --model-path REPO` with "
                                         "HF_ENDPOINT=http://HOST:PORT (revision info, HEAD/GET resolve with "
                                         "ETag, X-Repo-Commit and Content-Length), and its files by path at "
                                         "http://HOST:PORT/REPO/FILE (Range requests) for --load-format "
                                         "runai_streamer. Standard library only; runs until interrupted.")
    hub_cmd.add_argument("directory", help="a make-model directory")
    hub_cmd.add_argument("--repo", default="modelwake/k26-sim",
                         help="repository id org/name (default modelwake/k26-sim)")
    hub_cmd.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    hub_cmd.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed at start)")
    hub_cmd.add_argument("--rate-mib", type=_positive(float), default=0.0,
                         help="send at most this many MiB/s on each connection (default 0: unlimited)")
    hub_cmd.add_argument("--stall-after-mib", type=_positive(float), default=None,
                         help="stop sending file bodies after this many MiB in all, leaving the connections "
                              "open: a network stall mid-download (default: never)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "make-model":
        try:
            result = model.make_model(args.directory, args.size_mib, args.shards, args.quantization)
        except model.ModelError as exc:
            parser.error(str(exc))
        if result["written"]:
            print("modelwake_sim: wrote %d files in %s (%d MiB in %d shards, %s); kept %d"
                  % (len(result["written"]), os.path.abspath(args.directory), args.size_mib, args.shards,
                     args.quantization, len(result["kept"])))
        else:
            print("modelwake_sim: model %s already complete" % os.path.abspath(args.directory))
        return 0
    if args.command == "hub":
        if not os.path.isdir(args.directory):
            parser.error("hub: %s is not a directory (make one with make-model)" % args.directory)
        if not hub.HUB_ID.match(args.repo):
            parser.error("--repo must be org/name (got %r)" % args.repo)
        return hub.serve(args.directory, args.repo, args.host, args.port, args.rate_mib, args.stall_after_mib)
    try:
        args.fault = faults.Fault.parse(args.fault, args.fault_after)
    except faults.FaultError as exc:
        parser.error(str(exc))
    if args.tp < 1:
        parser.error("--tp must be at least 1 (got %d)" % args.tp)
    if args.fault is not None and args.fault.kind in faults.RANK_DEATHS and args.tp < 2:
        parser.error("--fault %s: the last rank dies while the others wait, so --tp must be 2 or more"
                     % args.fault.kind)
    if args.fault is not None and args.fault.kind == "rankreap" and args.engine != "sglang":
        parser.error("--fault rankreap: the launcher that reaps a dead scheduler at once is SGLang's (--engine sglang)")
    if args.churn and args.engine != "sglang":
        parser.error("--churn: the churn is SGLang's process tree here (--engine sglang)")
    given = sys.argv[1:] if argv is None else argv
    if "node-rank" in args.churn and not any(a == "--node-rank" or a.startswith("--node-rank=") for a in given):
        parser.error("--churn node-rank: start with --node-rank 0, so that the helper's command line holds it")
    if (args.load_format == "runai_streamer") != hub.is_stream_url(args.model_path):
        parser.error("--load-format runai_streamer and an http:// --model-path go together (got %s and %r)"
                     % (args.load_format, args.model_path))
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535 (got %d)" % args.port)
    if args.nnodes > 1:
        if args.engine != "sglang":
            parser.error("--nnodes: multi-node serving is SGLang's here (--engine sglang)")
        if not 0 <= args.node_rank < args.nnodes:
            parser.error("--node-rank must be between 0 and --nnodes - 1 (got %d)" % args.node_rank)
        if not args.dist_init_addr:
            parser.error("--dist-init-addr is required with --nnodes %d" % args.nnodes)
        if args.tp % args.nnodes:
            parser.error("--tp %d must be a multiple of --nnodes %d (each node runs tp / nnodes ranks)"
                         % (args.tp, args.nnodes))
        try:
            nodes.parse_addr(args.dist_init_addr)
        except nodes.GroupError as exc:
            parser.error(str(exc))
    elif args.nnodes < 1:
        parser.error("--nnodes must be at least 1 (got %d)" % args.nnodes)
    args.model_path = args.model_path.rstrip("/") or "/"
    if args.engine == "sglang":
        from .sglang import SGLangServer as server_class
    else:
        from .vllm import VLLMServer as server_class
    return server_class(args).run()


if __name__ == "__main__":
    sys.exit(main())
