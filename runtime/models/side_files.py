"""Files a checkpoint names must lie inside the checkpoint directory.

An index's `weight_map` is data from whoever made the checkpoint: `../../other/model.safetensors`
or `/etc/passwd` used to be opened (and, by `fastllm convert`, converted). Two strengths:

- `named_inside` (every load): a name from an index is relative, and `root / name` stays inside
  `root` once `..` is folded, without following symlinks, so a Hugging Face cache snapshot (whose
  files are symlinks into ../../blobs) still loads;
- `resolved_inside` (`fastllm convert`, which copies what it reads into a new checkpoint): the
  file, symlinks followed, is inside the resolved directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from runtime.errors import ModelLoadError


def named_inside(root: Path, name: object, *, source: Path) -> Path:
    """`root / name`, refused when `name` (read from `source`) points outside `root`."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ModelLoadError(f"{source}: weight_map names an invalid file {name!r}")
    joined = os.path.normpath(root / name)
    if os.path.isabs(name) or not joined.startswith(os.path.normpath(root) + os.sep):
        raise ModelLoadError(
            f"{source}: weight_map file {name!r} is outside the checkpoint directory {root}"
        )
    return Path(joined)


def resolved_inside(root: Path, file: Path) -> Path:
    """`file`, refused when it (symlinks followed) is not inside `root` (also resolved)."""
    real_root, real = root.resolve(), file.resolve()
    if not real.is_relative_to(real_root):
        raise ModelLoadError(
            f"{file}: resolves to {real}, outside the checkpoint directory {real_root} "
            "(convert reads only the checkpoint's own files; copy a symlinked checkpoint with "
            "`cp -rL` first)"
        )
    return file
