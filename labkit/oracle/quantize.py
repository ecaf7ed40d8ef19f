"""llama.cpp's own quantizer (`llama_model_quantize`), to make files of any GGUF type from an F32 one.

The file it writes is what a user of that type brings: llama.cpp picks each tensor's type by its
rules (Q3_K_M mixes Q3_K, Q4_K, Q5_K and Q6_K; rows that are not a whole number of 256-value blocks
fall back). It runs in its own process: llama.cpp aborts the process on some refusals (the low-bit
I-quants want an importance matrix), which must not take the caller down.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from labkit.errors import OracleUnavailableError, UnsupportedTensorTypeError


def quantize(src: str | Path, dst: str | Path, ftype: str, threads: int = 2) -> Path:
    """Write `dst`, llama.cpp's `ftype` (Q2_K, Q3_K_M, IQ4_XS, TQ2_0, ...) of the F32/F16 file `src`."""
    cmd = [sys.executable, "-m", "labkit.oracle.quantize", str(src), str(dst), ftype, str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode == 3:
        raise OracleUnavailableError("llama.cpp's quantizer needs llama-cpp-python (pip install labkit[oracle])")
    if done.returncode != 0 or not Path(dst).exists():
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise UnsupportedTensorTypeError(f"llama.cpp did not quantize {Path(src).name} to {ftype}: {why}")
    return Path(dst)


def requantized(src: str | Path, ftype: str) -> Path:
    """llama.cpp's `ftype` file made from the (quantized) GGUF `src`, every tensor dequantized and
    quantized again: written once per machine under ~/.cache/labkit/requantized (through a part file,
    so an interrupted write is never taken for a file), the source left as it is."""
    import os

    src = Path(src)
    dst = Path.home() / ".cache" / "labkit" / "requantized" / f"{src.stem}-{src.stat().st_size}-{ftype}.gguf"
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        part = dst.with_suffix(f".{os.getpid()}.part")
        try:
            quantize(src, part, ftype)
            part.replace(dst)
        finally:
            part.unlink(missing_ok=True)
    return dst


def _main(src: str, dst: str, ftype: str, threads: str) -> int:
    try:
        import llama_cpp
    except ImportError:
        return 3
    code = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        print(f"llama.cpp has no file type {ftype}", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = code, int(threads)
    params.allow_requantize = True  # a quantized source (requantized) as well as an F32 one
    return int(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params))


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:5]))
