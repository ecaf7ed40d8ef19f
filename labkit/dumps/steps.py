"""Which files of a dump folder hold one forward pass, and which folder holds rank 0.

Engines that dump every pass put them side by side; merging them would let a decode step's
tensor overwrite the prompt pass's under the same name. Each engine marks the pass its own way:

- SGLang's `--debug-tensor-dump-output-folder`: `Pass{NNNNN}.pt`, one file per forward pass
  (python/sglang/srt/debug_utils/tensor_dump_forward_hook.py), in `TP{t}_PP{p}_Rank{r}_pid{pid}/`.
- SGLang's dumper (`DUMPER_ENABLE=1`): tags in the file name, `step=N___rank=R___...___name=X.pt`
  (python/sglang/srt/debug_utils/dumper.py; older versions say `forward_pass_id=N`).
- TensorRT-LLM's `debug_mode` (tensorrt_llm/_torch/debug/debug_hook.py): the first index of each
  file's path counts top-level module calls, which never resets inside one `debug_mode`: a pass
  calls the model and then its LMHead, so pass k (from 0) is counts 2k+1 and 2k+2. Files sit in
  `rank{N}/`.

Step k is the k-th pass the folder holds, in order (0: the first, usually the prompt's prefill).
"""

from __future__ import annotations

import re
from pathlib import Path

from labkit.errors import DumpsFileError

_PASS_FILE = re.compile(r"Pass(\d+)")
_TAGGED = re.compile(r"(?:^|___)(?:step|forward_pass_id)=(\d+)(?:___|$)")
_LOOP = re.compile(r"(\d+)\.\w+-")


def pass_of(path: Path) -> int | None:
    """The forward pass a dumped file belongs to, by its engine's naming; None if it says none."""
    stem = path.stem
    if m := _PASS_FILE.fullmatch(stem):
        return int(m.group(1))
    if m := _TAGGED.search(stem):
        return int(m.group(1))
    if m := _LOOP.match(stem):
        return (int(m.group(1)) - 1) // 2
    return None


def files_of_step(paths: list[Path], step: int | None) -> list[Path]:
    """The files of the step-th pass the folder holds (the first when None); all of them when the
    files name no pass."""
    passes = {p: pass_of(p) for p in paths}
    held = sorted({n for n in passes.values() if n is not None})
    if not held:
        if step not in (None, 0):
            raise DumpsFileError(f"{paths[0].parent}: its files name no forward pass, so there is no step {step}")
        return paths
    if step is not None and not 0 <= step < len(held):
        where = f"{paths[0].parent}: holds {len(held)} forward pass(es)"
        raise DumpsFileError(f"{where}, steps 0–{len(held) - 1}; no step {step}")
    chosen = held[step or 0]
    return [p for p, n in passes.items() if n == chosen or n is None]


# SGLang's hook folder of rank 0, TensorRT-LLM's; SGLang's dumper writes one folder per run (exp_name)
_RANK0 = ("TP0_PP0_Rank0_pid*", "rank0", "dump_*", "sglang_dump_*")


def rank0_folder(path: Path) -> Path:
    """The folder of rank 0 when `path` is an engine's dump root that holds one folder per rank
    (the other ranks hold other tensor-parallel shards, which one model's stages are not)."""
    if not path.is_dir() or any(path.glob("*.pt")) or any(path.glob("*.npy")):
        return path
    for pattern in _RANK0:
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise DumpsFileError(f"{path}: {len(found)} folders ({found[0].name}, ...) of one rank or run: give one")
    return path
