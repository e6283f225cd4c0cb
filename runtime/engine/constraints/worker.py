"""One compile worker process: tokenizer info in, compiled grammars out, one at a time.

A compile runs in C++ and cannot be interrupted from Python, so it runs here, in a process the
server can kill (pool.py) when its time or memory budget runs out, its request ends, or the
server shuts down. The worker sends back the compiled grammar serialized (XGrammar's JSON) with
the heap bytes its deserialized copy holds, measured here (glibc's mallinfo2 around a
deserialization, in a process where nothing else allocates meanwhile): the cache's byte bound
counts what the server will really hold (`memory_size_bytes` counts ~1/3 of it).

Messages on the pipe: ("compile", kind, source) -> ("ok", json, compile_seconds, size_bytes)
or ("error", message); None ends the worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import time
from multiprocessing.connection import Connection

import torch
import xgrammar as xgr

from runtime.engine.constraints.rules import engine_message
from runtime.engine.constraints.spec import ConstraintSpec
from runtime.errors import InvalidRequestError

__all__ = ["heap_bytes", "serve"]

_PR_SET_PDEATHSIG = 1


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_mallinfo2 = getattr(_libc, "mallinfo2", None)
if _mallinfo2 is not None:
    _mallinfo2.restype = _MallInfo2


def heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (all arenas, mmapped chunks included)."""
    if _mallinfo2 is None:
        return None
    info = _mallinfo2()
    return int(info.uordblks + info.hblkhd)


def serve(conn: Connection, info_json: str, num_threads: int) -> None:
    """The worker's loop (the process target). It dies with its parent (the forkserver, which
    exits with the server) even in the middle of a compile."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the server's to handle
    torch.set_num_threads(1)
    info = xgr.TokenizerInfo.deserialize_json(info_json)
    compiler = xgr.GrammarCompiler(info, max_threads=num_threads, cache_enabled=False)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        _, kind, source = message
        try:
            conn.send(_compile(compiler, info, kind, source))
        except (BrokenPipeError, EOFError):
            return


def _compile(
    compiler: xgr.GrammarCompiler, info: xgr.TokenizerInfo, kind: str, source: str
) -> tuple[object, ...]:
    try:
        grammar = ConstraintSpec(kind, source, "constraint").to_grammar()
        t0 = time.perf_counter()
        compiled = compiler.compile_grammar(grammar)
        seconds = time.perf_counter() - t0
        if not _can_start(compiled):
            return ("error", "no output satisfies it: the grammar allows no first token")
        text = compiled.serialize_json()
        before = heap_bytes()
        copy = xgr.CompiledGrammar.deserialize_json(text, info)
        after = heap_bytes()
        measured = 0 if before is None or after is None else after - before
        size = max(measured, int(copy.memory_size_bytes), len(text))
        del copy
        return ("ok", text, seconds, size)
    except InvalidRequestError as exc:
        return ("error", str(exc).split(": ", 1)[-1])
    except Exception as exc:  # XGrammar's own errors: a message for the client
        return ("error", engine_message(exc))


def _can_start(compiled: xgr.CompiledGrammar) -> bool:
    """Some token (or the end, for a grammar of the empty string) is allowed first: a grammar
    whose language is empty at its root allows none."""
    matcher = xgr.GrammarMatcher(compiled)
    if matcher.is_completed():
        return True
    bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    return bool(bitmask.any().item())
