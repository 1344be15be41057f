"""Deterministic "generation": sensible answers to small arithmetic, filler words otherwise.

The timing of generation is the worker process's job; this module only decides the text, so the
same prompt always gives the same tokens (tests and benchmarks can rely on it).
"""
import hashlib
import re

_ARITH = re.compile(r"(-?\d+)\s*([-+*x])\s*(-?\d+)\s*=\s*$")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = ("the", "model", "is", "ready", "and", "serving", "tokens", "from", "its", "weights",
          "on", "eight", "GPUs", "with", "a", "steady", "rate", "of", "output", "per", "second")


def count_tokens(text):
    """A rough token count (words and punctuation), at least 1 for any prompt."""
    return max(1, len(_TOKEN.findall(text or "")))


def continuation(prompt, max_tokens):
    """Return (tokens, finish_reason) for `prompt`, at most `max_tokens` tokens."""
    max_tokens = max(0, int(max_tokens))
    match = _ARITH.search(prompt or "")
    if match:
        left, op, right = int(match.group(1)), match.group(2), int(match.group(3))
        value = left + right if op == "+" else left - right if op == "-" else left * right
        tokens = [str(value)]
        if len(tokens) <= max_tokens:
            return tokens, "stop"
        return tokens[:max_tokens], "length"
    seed = int(hashlib.sha256((prompt or "").encode("utf-8")).hexdigest()[:8], 16)
    tokens = []
    for i in range(max_tokens):
        tokens.append(_WORDS[(seed + i * 7) % len(_WORDS)])
    return tokens, "length"


def join_tokens(tokens):
    """Tokens as text, each word with its leading space, an arithmetic answer without."""
    if len(tokens) == 1 and re.match(r"^-?\d+$", tokens[0]):
        return tokens[0]
    return "".join(" " + t for t in tokens)
