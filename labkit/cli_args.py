"""What the `labkit` command's arguments mean and how it writes: argparse types for its options,
the variant selection from --variant and --wgsl, and its one-line errors (labkit.cli runs the
commands)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from labkit.errors import InputFileError, InvalidArgumentError, UnknownVariantError

EXIT_ERROR = 1  # a bad input: a missing, malformed or unsupported file, an unknown name, a usage error


def one_line(text: str) -> str:
    """A multi-line message (e.g. a ShaderCompileError's snippet) on one line; caret-only lines
    (`   | ^`) are dropped, the others joined with ' | '."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    return " | ".join(ln for ln in lines if ln and not set(ln) <= set(" |^~-"))


def fail(message: str) -> None:
    print(f"labkit: error: {one_line(message)}", file=sys.stderr)


class CliParser(argparse.ArgumentParser):
    """argparse with labkit's error format: one `labkit: error: ...` line, exit 1."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sub = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        fail(f"{sub}: {message}" if sub else message)
        sys.exit(EXIT_ERROR)


def count_arg(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def parse_variants(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise UnknownVariantError(f"--variant wants op=name, got {item!r}")
        op, name = item.split("=", 1)
        out[op.strip()] = name.strip()
    return out


def register_wgsl(items: list[str] | None) -> dict[str, str]:
    """`--wgsl OP=NAME=FILE`: register each file as variant NAME of OP; {op: name} to select."""
    import labkit

    out = {}
    for item in items or []:
        parts = item.split("=", 2)
        if len(parts) != 3 or not all(s.strip() for s in parts):
            raise UnknownVariantError(f"--wgsl wants op=name=file, got {item!r}")
        op, name, path = (s.strip() for s in parts)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise InputFileError(f"--wgsl {op}={name}: {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InputFileError(f"--wgsl {op}={name}: cannot read {path}: {e}") from None
        labkit.register_variant(op, name, text, doc=f"user WGSL from {path}")
        out[op] = name
    return out


def selection(args: argparse.Namespace) -> dict[str, str]:
    """--variant and --wgsl together (--wgsl wins for the same op)."""
    return {**parse_variants(args.variant), **register_wgsl(args.wgsl)}


KV_TYPE_HELP = (
    "the KV cache's type, as llama.cpp's --cache-type-k/-v: f32 (default), f16, bf16, q8_0, q4_0, q4_1, "
    "q5_0, q5_1, iq4_nl"
)


def add_kv_type_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--kv-type", metavar="TYPE", help=KV_TYPE_HELP)
    s.add_argument("--kv-type-k", metavar="TYPE", help="the K cache's type (overrides --kv-type)")
    s.add_argument("--kv-type-v", metavar="TYPE", help="the V cache's type (overrides --kv-type)")


def kv_types(args: argparse.Namespace) -> dict[str, str | None]:
    """labkit.open's kv_type arguments from --kv-type, --kv-type-k, --kv-type-v."""
    return {"kv_type": args.kv_type, "kv_type_k": args.kv_type_k, "kv_type_v": args.kv_type_v}


def emit(args: argparse.Namespace, data: Any, text: Callable[[], str]) -> None:
    print(json.dumps(data, indent=1) if getattr(args, "json", False) else text())


def token_list(text: str) -> list[int]:
    """--tokens 2,818,2258 → [2, 818, 2258]."""
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InvalidArgumentError(f"--tokens wants comma-separated ids, got {text!r}") from None


def names_arg(text: str) -> str | dict[str, str]:
    """--names PRESET, or a JSON file of {their name or regex: stage}."""
    if not text.endswith(".json"):
        return text
    try:
        with open(text, encoding="utf-8") as f:
            mapping = json.load(f)
    except FileNotFoundError:
        raise InputFileError(f"--names {text}: no such file") from None
    except (OSError, ValueError) as e:
        raise InputFileError(f"--names {text}: not a JSON mapping: {e}") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise InputFileError(f"--names {text}: want a JSON object {{their name: stage name}}")
    return mapping


def lengths_arg(text: str) -> tuple[int, ...]:
    """--lengths 8,128,512: positive token counts."""
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lengths takes comma-separated token counts, not {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--lengths takes positive token counts, not {text!r}")
    return out
