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


class TensorDataError(ModelFileError, ValueError):
    """A tensor's bytes do not match its type and shape (a corrupt or truncated file)."""


class TokenizerError(LabkitError, ValueError):
    """Text the model's vocabulary cannot tokenize, or a vocabulary without a token it needs."""


class TokenIdError(TokenizerError, IndexError):
    """A token id outside the model's vocabulary."""


class GpuLimitError(LabkitError, ValueError):
    """A workgroup grid or a weight window the adapter cannot take (or a malformed one)."""


class VariantInterfaceError(LabkitError):
    """A user WGSL variant whose bindings differ from its family's interface."""


class ToolNotFoundError(LabkitError):
    """An external program labkit starts (e.g. `jupyter`) is not installed or not on PATH."""


class InputFileError(LabkitError):
    """A file given to labkit other than the model (e.g. a `--wgsl` source) is missing or unreadable."""


class KernelInterfaceError(VariantInterfaceError):
    """A kernel's `struct Params` differs from the uniform fields its op declares."""


class InvalidArgumentError(LabkitError, ValueError):
    """An argument outside what the call accepts (e.g. a negative max_new_tokens)."""
