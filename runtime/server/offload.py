"""Heavy request work off the event loop: rendering a chat template, tokenizing a long prompt and
building a large JSON response run in a small thread pool, so `/health` and every other request
go on while they do (issue 39, item 2: a 116 MB logprobs response held `/health` 7.6 s; 16
concurrent 1 MB `/tokenize` calls ran one after another on the loop).

Small work stays on the loop: a plain chat's render and encode take microseconds, less than the
hop to a thread, and a small job never queues behind big ones in the pool. The pool's threads
do not hold the GIL through the Rust tokenizer (runtime.models.tokenizer encodes long texts with
the GIL released), nor through a sandboxed template (they wait on a pipe).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.responses import Response

T = TypeVar("T")

# below this many characters a render or an encode runs inline (well under a millisecond)
INLINE_CHARS = 8192
_DEFAULT_WORKERS = 4

_pool: ThreadPoolExecutor | None = None
_num_workers = _DEFAULT_WORKERS
_lock = threading.Lock()


def configure(num_workers: int) -> None:
    """The pool's size (settings.offload_workers); a pool already started keeps its size until
    `shutdown`."""
    global _num_workers
    with _lock:
        _num_workers = num_workers


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_num_workers, thread_name_prefix="fastllm-offload")
        return _pool


def shutdown() -> None:
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in the pool; its exceptions are raised here."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


async def maybe_off_loop(size: int, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Inline when `size` (the characters the work is about) is small, else in the pool."""
    if size < INLINE_CHARS:
        return fn(*args, **kwargs)
    return await off_loop(fn, *args, **kwargs)


def json_bytes(payload: Any) -> bytes:
    """The JSON body as Starlette's JSONResponse renders it, encoded a slice at a time: one
    `json.dumps` of a 100 MB payload is one C call that holds the GIL, and so the event loop,
    for seconds; a slice of a list is one C call of about a millisecond.

    Slices, not elements: encoding each element with its own `json.dumps` (the first version)
    spent ~40x the C encoder's time in Python (a new encoder per call): a 1 MB /tokenize reply
    (540,000 ids) held the GIL for 1.5 s of Python in its pool thread, now 0.04 s."""
    return "".join(_pieces(payload, _SPLIT_DEPTH)).encode("utf-8")


# containers this deep and above are walked (payload, choices, a choice, its logprobs, their
# per-token lists); a list whose items are scalars, or that sits at the bottom, is cut in slices
_SPLIT_DEPTH = 5
# items per C call: ~4,096 numbers or short strings, or ~64 rows of top logprobs (dicts of up to
# 20 entries, or a chat token's entry with its alternatives) each take about a millisecond
SCALAR_SLICE = 4096
ROW_SLICE = 64

# one encoder for every call: json.dumps with these options builds a new one each time
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _pieces(value: Any, depth: int) -> Iterator[str]:
    if depth == 0 or not isinstance(value, (dict, list)) or not value:
        yield _dumps(value)
    elif isinstance(value, list):
        if depth == 1 or not isinstance(value[0], (dict, list)):
            yield from _slices(value)
            return
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ","
            yield from _pieces(item, depth - 1)
        yield "]"
    else:
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ("," if i else "") + _dumps(str(key)) + ":"
            yield from _pieces(item, depth - 1)
        yield "}"


def _slices(items: list[Any]) -> Iterator[str]:
    """`items` as a JSON array, a slice per encoder call (each slice's own brackets cut)."""
    size = ROW_SLICE if isinstance(items[0], (dict, list)) else SCALAR_SLICE
    yield "["
    for start in range(0, len(items), size):
        yield ("," if start else "") + _dumps(items[start : start + size])[1:-1]
    yield "]"


async def json_response(build: Callable[[], Any]) -> Response:
    """A response body built and serialised in the pool (large logprobs, echo, many choices)."""
    body = await off_loop(lambda: json_bytes(build()))
    return Response(body, media_type="application/json")
