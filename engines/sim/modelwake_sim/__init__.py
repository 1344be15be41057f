"""modelwake_sim: a simulated SGLang / vLLM inference engine (standard library only).

It starts up like the real engines (process tree, log lines, port behaviour, disk reads of real
safetensors shards, CPU-bound silent initialisation, a scripted GPU picture) so that modelwake's
readiness module can be tested end to end on a host without GPUs or a 548 GB model.
"""
__version__ = "0.1.0"
