"""llama.cpp for `bench.peer`: its two Python bindings (`BINDINGS`): llama-cpp-python (`llama_cpp`,
built from source) or llama_cpp_py_sync (prebuilt libllama/libggml with CFFI bindings), which one
works here, their versions, a GGUF re-quantized by llama.cpp's own quantizer, and one model
loaded through either binding (reset, eval a batch of ids, the last token's logits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPT_TOKENS = 32  # the bench's prompt (bench.peer_workers.prompt_ids); contexts are sized for it
# llama.cpp's Python bindings, in the order `pick_binding` prefers them when both import:
# llama-cpp-python is built here with GGML_NATIVE, llama_cpp_py_sync is a generic prebuilt
BINDINGS = ("llama_cpp", "llama_cpp_py_sync")
_INSTALL = {
    "llama_cpp": 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python',
    "llama_cpp_py_sync": "pip install llama-cpp-py-sync",
}


def _binding_error(binding: str) -> str | None:
    """Why `binding` cannot drive llama.cpp here, or None."""
    try:
        if binding == "llama_cpp":
            import llama_cpp  # noqa: F401
        else:
            from llama_cpp_py_sync._cffi_bindings import get_lib

            get_lib()  # its libllama is opened at first use: a load failure shows only here
    except Exception as exc:  # ImportError, or a library that does not load (OSError, ...)
        return f"{binding} is not usable ({str(exc).splitlines()[0]}); install: {_INSTALL[binding]}"
    return None


def pick_binding(requested: str = "auto") -> tuple[str | None, str | None]:
    """(the binding to use, None) or (None, why none can run): `requested` is one of BINDINGS
    or "auto" (the first of BINDINGS that works)."""
    errors = []
    for binding in BINDINGS if requested == "auto" else (requested,):
        error = _binding_error(binding)
        if error is None:
            return binding, None
        errors.append(error)
    return None, "; ".join(errors)


def llama_cpp_missing(requested: str = "auto") -> str | None:
    """Why the llama.cpp side cannot run here, or None."""
    return pick_binding(requested)[1]


def peer_version(binding: str) -> str:
    """The binding and the llama.cpp build it runs, for the report."""
    if binding == "llama_cpp":
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"
    import llama_cpp_py_sync as sync

    return (
        f"llama_cpp_py_sync {sync.__version__} "
        f"(llama.cpp {sync.__llama_cpp_tag__}, commit {sync.__llama_cpp_commit__})"
    )


def requantize(gguf_path: Path, out_path: Path, ftype: str) -> Path:
    """A copy of `gguf_path` re-quantized by llama.cpp's own quantizer (llama-cpp-python's
    `llama_model_quantize`), e.g. ftype "Q8_0"; written once."""
    if out_path.is_file():
        return out_path
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True  # the packaged file is already Q4_1
    tmp = out_path.with_suffix(".part")
    rc = llama_cpp.llama_model_quantize(str(gguf_path).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({gguf_path} -> {ftype}) returned {rc}")
    tmp.rename(out_path)
    return out_path


class LlamaCppPython:
    """llama-cpp-python: `Llama.eval` decodes the ids; `llama_get_logits` reads the last row."""

    def __init__(self, gguf_path: Path, threads: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(gguf_path),
            n_ctx=PROMPT_TOKENS + 256,
            n_batch=PROMPT_TOKENS,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.vocab = self.llm.n_vocab()

    def reset(self) -> None:
        self.llm.reset()

    def eval(self, ids: list[int]) -> None:
        self.llm.eval(ids)

    def logits(self) -> Any:
        import llama_cpp
        import numpy as np

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.llm.ctx), shape=(self.vocab,))


class LlamaCppPySync:
    """llama_cpp_py_sync: its `Llama` loads the GGUF; the context and the decode go through
    llama.cpp's C API, which the package exposes as `get_lib()`: a context from llama.cpp's
    default parameters with flash attention off and no embeddings output (as llama-cpp-python's
    defaults), `llama_batch_get_one` + `llama_decode` (logits for the batch's last token only,
    as llama-cpp-python's eval), `llama_get_logits_ith(ctx, -1)`.

    Not the wrapper's own context: it turns embedding output on (for its audio models), which
    makes llama.cpp output every prompt row, and turning that off afterwards
    (`llama_set_embeddings(ctx, false)`) made the next decode segfault here (b11739)."""

    def __init__(self, gguf_path: Path, threads: int) -> None:
        import llama_cpp_py_sync
        from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

        self.lib, self.ffi = get_lib(), get_ffi()
        self.llm = llama_cpp_py_sync.Llama(str(gguf_path), n_ctx=64, n_threads=1)
        params = self.lib.llama_context_default_params()
        params.n_ctx = PROMPT_TOKENS + 256
        params.n_batch = params.n_ubatch = PROMPT_TOKENS
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = 0
        params.embeddings = False
        self.ctx = self.lib.llama_init_from_model(self.llm._model, params)  # no public handle
        if self.ctx == self.ffi.NULL:
            raise RuntimeError(f"llama.cpp could not make a context for {gguf_path}")
        self.vocab = self.llm.n_vocab

    def reset(self) -> None:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)

    def eval(self, ids: list[int]) -> None:
        tokens = self.ffi.new("llama_token[]", ids)
        rc = self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(tokens, len(ids)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def logits(self) -> Any:
        import numpy as np

        row = self.lib.llama_get_logits_ith(self.ctx, -1)
        return np.frombuffer(self.ffi.buffer(row, 4 * self.vocab), dtype=np.float32)
