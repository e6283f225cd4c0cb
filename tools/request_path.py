"""The project files one non-streaming chat request runs through, measured.

    python -m tools.request_path [--list] [--json] [--kind plain|stream|features|tools]

Serves the tiny demo llama the way `fastllm serve` does (build_state + create_app: telemetry, a
SQLite inference_log, an API key) on uvicorn in a thread, sends one warm-up chat completion, then
a second one while `sys.setprofile` (installed on every thread started after the profiler, so on
the request loop, AnyIO's workers and the engine thread) records each function call's file. Files
are counted under the repository root, this tool and the tests excluded; calls on background
threads (the inference-log writer, samplers, the verifier, rollout and notifier threads, the
engine's stats recorder that runs the sinks) are not counted: they are not on the request's path.
The warm-up keeps import-time code (lazy imports on a first request) out of the count: a module
that is only imported costs nothing here, a function of it that runs counts its file. Code that
`dataclasses` generates (`__init__`, `__eq__`: its file name is "<string>") counts for the module
of its class, so a dataclass built on the path counts as the code it is.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-request-path"
# thread-name prefixes on the request's path: the uvicorn loop (ours), AnyIO's worker threads,
# the engine step loop (one, or one per replica)
ON_PATH = ("request-loop", "AnyIO worker", "fastllm-engine", "fastllm-replica")


class CallRecorder:
    """A profile function recording, while `recording`, the project file of each call per
    thread name. Cheap when not recording: one attribute check per event."""

    def __init__(self, root: Path) -> None:
        self.root = f"{root}/"
        self.excluded = (f"{root}/tests/", f"{root}/tools/", f"{root}/.venv/")
        self.recording = False
        self.files: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.recording or event != "call":
            return
        path = frame.f_code.co_filename
        if path == "<string>":  # generated code (a dataclass's __init__): its class's module
            path = frame.f_globals.get("__file__") or path
        if not path.startswith(self.root) or path.startswith(self.excluded):
            return
        name = threading.current_thread().name
        with self._lock:
            self.files.setdefault(name, set()).add(path[len(self.root) :])

    def on_path(self) -> list[str]:
        kept = (files for name, files in self.files.items() if name.startswith(ON_PATH))
        return sorted(set().union(*kept))


@contextmanager
def profiled(recorder: CallRecorder) -> Iterator[None]:
    threading.setprofile(recorder)  # threads started from here on
    sys.setprofile(recorder)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _serve(workdir: Path) -> tuple[Any, socket.socket, threading.Thread]:
    import uvicorn

    from runtime.config import Settings
    from runtime.models.demo import make_demo_model
    from runtime.server import create_app
    from runtime.server.wiring import build_state

    model = make_demo_model(workdir / "llama", arch="llama")
    settings = Settings(  # type: ignore[call-arg]  # pydantic-settings: all have defaults
        model_path=model,
        model_name="llama",
        device="cpu",
        api_keys=[API_KEY],
        database_url=f"sqlite:///{workdir / 'fastllm.db'}",
        alerts_enabled=False,
    )
    state = build_state(settings)
    app = create_app(settings, state=state)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="request-loop", daemon=True
    )
    thread.start()
    return server, sock, thread


# the chat body's fields besides model, messages and max_tokens, per --kind
KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "stream": {"stream": True, "stream_options": {"include_usage": True}},
    "features": {
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "presence_penalty": 0.5,
        "logit_bias": {"5": 1.0},
        "min_tokens": 1,
        "response_format": {"type": "json_object"},
    },
    "tools": {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
    },
}


def _chat(url: str, kind: str) -> None:
    import httpx

    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, **KINDS[kind]},
        headers=headers,
        timeout=120,
    ) as response:
        response.raise_for_status()
        response.read()  # a stream to its end


def measure(kind: str = "plain") -> list[str]:
    """The project files (repository-relative) on one chat request's path (`kind`: KINDS)."""
    import httpx

    recorder = CallRecorder(ROOT)
    with tempfile.TemporaryDirectory() as tmp, profiled(recorder):
        server, sock, thread = _serve(Path(tmp))
        try:
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            deadline = time.monotonic() + 120
            while not server.started or httpx.get(f"{url}/ready").status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not become ready in 120 s")
                time.sleep(0.05)
            _chat(url, kind)  # warm-up: lazy imports, first-call caches
            recorder.recording = True
            _chat(url, kind)
            recorder.recording = False
        finally:
            server.should_exit = True
            thread.join(30)
            sock.close()
    return recorder.on_path()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the files, one a line")
    parser.add_argument("--json", action="store_true", help="one JSON object: count, files")
    parser.add_argument("--kind", choices=sorted(KINDS), default="plain", help="the request")
    args = parser.parse_args(argv)
    files = measure(args.kind)
    if args.json:
        print(json.dumps({"count": len(files), "files": files}))
        return
    if args.list:
        print("\n".join(files))
    what = "non-streaming" if args.kind == "plain" else args.kind
    print(f"{len(files)} project files on one {what} chat request's path")


if __name__ == "__main__":
    main()
