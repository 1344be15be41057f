"""modelwake_sim: a simulated SGLang / vLLM inference engine (standard library only).

It starts up like the real engines (process tree, log lines, port behaviour, disk reads of real
safetensors shards, CPU-bound silent initialisation, a scripted GPU picture) so that modelwake's
readiness module can be tested end to end on a host without GPUs or a 548 GB model.

Faults (`--fault KIND:PHASE`, faults.py) make a start crash, hang or lose a rank. Churn
(`--churn KIND`, churn.py) is their negative control: a healthy start whose short-lived processes
look like a rank's death (compile workers forked with a rank's title, a pseudo-scheduler and its
loader that exit 0, helpers a rank SIGTERMs on purpose, a helper exiting 1 with `--node-rank 0` in
its command line) and that still ends ready; `--churn-record PATH` lists every such child and how
it ended, and the rank a fault killed, with the kill's time. `--benign-error-lines` is the negative
control of "a crash line fails the start": lines of a healthy start that look like a crash (logs.py).
"""
__version__ = "0.1.0"
