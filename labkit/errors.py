"""Typed exceptions. The CLI turns any LabkitError into one `labkit: error: ...` line."""

from __future__ import annotations


class LabkitError(Exception):
    """Base class of every error labkit raises on purpose."""


class ModelFileError(LabkitError):
    """The GGUF file is missing, truncated, or not a GGUF file."""


class UnsupportedArchitectureError(LabkitError):
    """The file's general.architecture is not one labkit knows how to run."""


class UnsupportedTensorTypeError(LabkitError):
    """A tensor uses a ggml type labkit cannot dequantize or run."""


class UnknownModelError(LabkitError):
    """A model name that is neither registered nor a path to a .gguf file."""


class PromptTooLongError(LabkitError):
    """The prompt (plus tokens to generate) does not fit in the context."""


class UnknownStageError(LabkitError):
    """A stage name that the model's stage graph does not have."""


class UnknownVariantError(LabkitError):
    """A kernel variant or op family that is not registered."""


class ShaderCompileError(LabkitError):
    """A WGSL source failed to compile; the message carries the line and the compiler's text."""


class NoAdapterError(LabkitError):
    """No usable WebGPU adapter was found."""


class OracleUnavailableError(LabkitError):
    """The llama.cpp oracle (extra `oracle`) is not installed."""
