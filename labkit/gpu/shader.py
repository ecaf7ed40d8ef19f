"""WGSL → compute pipeline, cached by source text; readable compile errors.

wgpu-py reports a WGSL error synchronously, as a `GPUValidationError` raised by
`device.create_shader_module`. Its text is naga's codespan report:

    Shader '' parsing error: no definition in scope for identifier: `foo`
      ┌─ wgsl:5:13
      │
    5 │     let x = foo(1u);
      │             ^^^ unknown identifier

(validation errors look the same with `Shader validation error: ...`, a `┌─ :L:C` location
and `= ...` notes). `compile_pipeline` turns that into a `ShaderCompileError` that names
the label, the line (and, for sources composed from several kernel files, the file and
its own line), the offending WGSL line and naga's message.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.errors import ShaderCompileError
from labkit.gpu.device import get_device
from labkit.ops import registry
from labkit.ops.base import FILE_MARK, compose, wgsl_file  # noqa: F401  (the kernels live beside their ops)

load_kernel = wgsl_file

_LOC = re.compile(r"┌─\s*[^\s:]*:(\d+):(\d+)")
_HEAD = re.compile(r"^(Shader .*?error.*)$", re.MULTILINE)


def _file_line(lines: list[str], line: int) -> str:
    """' (in NAME.wgsl, line N)' when the source was composed from marked files."""
    for i in range(min(line, len(lines)) - 1, -1, -1):
        if lines[i].startswith(FILE_MARK):
            return f" (in {lines[i][len(FILE_MARK) :].strip()}, line {line - 1 - i})"
    return ""


_NUMBERED = re.compile(r"^\s*(\d+)\s*│")


def _innermost(text: str, lines: list[str]) -> tuple[int, int] | None:
    """(line, column) of the first single-line `^^^` label in naga's snippet.

    A validation error's `┌─` location is the start of the whole invalid function; the
    expression at fault is the one underlined on its own line.
    """
    report = text.splitlines()
    for prev, cur in zip(report, report[1:], strict=False):
        m = _NUMBERED.match(prev)
        if not m or "^" not in cur or "╰" in cur:
            continue
        line = int(m.group(1))
        src = lines[line - 1] if 0 < line <= len(lines) else ""
        start = prev.rfind(src) if src.strip() else -1
        if start < 0:
            return line, 1
        return line, max(cur.index("^") - start, 0) + 1
    return None


def format_compile_error(label: str, wgsl: str, text: str) -> str:
    """A one-look message from naga's report: label, line, the WGSL line, the message."""
    text = text.strip()
    head = _HEAD.search(text)
    msg = head.group(1) if head else ""
    msg = re.sub(r"^Shader ('[^']*' )?", "", msg)
    notes = [ln.strip()[2:] for ln in text.splitlines() if ln.strip().startswith("= ")]
    # naga repeats the notes, unindented, after the report; keep each once
    notes = list(dict.fromkeys(notes))
    where = f"{label}: " if label else ""
    loc = _LOC.search(text)
    if not loc:
        body = msg or text.replace("Validation Error\n\nCaused by:\n", "").strip()
        return f"{where}WGSL compile error: {body}" + "".join(f"\n  {n}" for n in notes)
    line, col = int(loc.group(1)), int(loc.group(2))
    lines = wgsl.splitlines()
    line, col = _innermost(text, lines) or (line, col)
    src = lines[line - 1] if 0 < line <= len(lines) else ""
    caret = " " * (max(col, 1) - 1) + "^"
    out = [
        f"{where}WGSL compile error at line {line}, column {col}{_file_line(lines, line)}: {msg or 'error'}",
        f"  {line} | {src}",
        f"  {' ' * len(str(line))} | {caret}",
    ]
    out += [f"  {n}" for n in notes]
    return "\n".join(out)


def compile_pipeline(gpu: Any, wgsl: str, entry: str = "main", label: str = "") -> Any:
    """A compute pipeline (auto layout) for WGSL source; cached per device by (source, entry)."""
    key = (wgsl, entry)
    cache = gpu.pipelines
    if key in cache:
        return cache[key]
    import wgpu

    try:
        module = gpu.device.create_shader_module(label=label, code=wgsl)
    except wgpu.GPUError as e:
        raise ShaderCompileError(format_compile_error(label, wgsl, str(e))) from None
    try:
        pipeline = gpu.device.create_compute_pipeline(
            label=label, layout="auto", compute={"module": module, "entry_point": entry}
        )
    except wgpu.GPUError as e:
        raise ShaderCompileError(format_compile_error(label, wgsl, str(e))) from None
    cache[key] = pipeline
    return pipeline


def register_variant(family: str, name: str, wgsl: str, doc: str = "user variant", faulty: bool = False) -> Any:
    """`labkit.register_variant`: a user's WGSL kernel added to an existing family (labkit.ops.registry),
    compiled on this process's device first, so a kernel that does not compile is never registered."""

    def compile_now(source: str, label: str) -> None:
        compile_pipeline(get_device(), source, label=label)

    return registry.register_variant(family, name, wgsl, doc, faulty, compile=compile_now)


def kernel_source(family: str, name: str = "default") -> str:
    """`labkit.kernel_source`: a registered kernel's WGSL, "default" being the one this process's
    adapter runs (labkit.ops.registry.kernel_source)."""
    return registry.kernel_source(family, name, registry.adapter_kind(get_device().adapter_type))
