"""`python -m runtime.models.cpu_kernels`: build the AVX2 kernels now (`make setup` runs it), so no
model load pays the build; says which kernels this machine will run."""

from __future__ import annotations

import sys

from runtime.models import cpu_kernels


def main() -> int:
    if cpu_kernels.enabled():
        print("AVX2 int4/int8 kernels: built; quantized CPU layers run them")
        return 0
    why = cpu_kernels.build_error()
    if why is not None:
        print(f"AVX2 int4/int8 kernels: build failed ({why}); torch's kernels run", file=sys.stderr)
        return 1
    print("AVX2 int4/int8 kernels: not used here (FASTLLM_CPU_KERNELS, or the CPU); torch's run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
