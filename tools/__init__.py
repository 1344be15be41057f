"""The developer tools, importable from the repository root (`from tools import vllm_cpu`) by the tests
and the bench; each is also a command of its own."""
