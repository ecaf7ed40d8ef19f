"""Typed exceptions. The CLI turns any LabkitError into one `labkit: error: ...` line."""

from __future__ import annotations


class LabkitError(Exception):
    """Base class of every error labkit raises on purpose."""


class ModelFileError(LabkitError):
    """The GGUF file is missing, malformed, or not a model labkit's graph can read. Each kind of
    defect has its own subclass below; the message names the key or tensor, what was found and what
    was expected."""


class GgufFormatError(ModelFileError):
    """Bytes that are not a well-formed GGUF file: magic, version, a count or length the file
    cannot hold, a value type GGUF does not have, nested arrays (llama.cpp's gguf.cpp refuses them)."""


class TruncatedFileError(GgufFormatError):
    """The file ends inside the header, or before the last byte of a tensor's data."""


class MetadataKeyError(ModelFileError):
    """A metadata key that is empty or written twice (llama.cpp refuses both; labkit never picks one)."""


class MetadataTypeError(ModelFileError):
    """A metadata value of another type than the spec and the architecture read it as (an integer
    stored as a string is refused, never coerced)."""


class HyperparameterError(ModelFileError):
    """An architecture's hyperparameter that is missing, out of range, or inconsistent with another
    (a head count of 0, a layer count past the tensors the file has, a width heads do not divide)."""


class TensorTableError(ModelFileError):
    """A row of the tensor table that no loader can read: its name, dimensions, type or offset."""


class DuplicateTensorError(TensorTableError):
    """Two rows of the tensor table with the same name."""


class TensorDimensionsError(TensorTableError):
    """A tensor's dimensions: not 1 to 4 of them, a zero, a product past int64, or a row that is
    not a whole number of its type's blocks."""


class TensorOffsetError(TensorTableError):
    """A tensor's data offset: not a multiple of general.alignment, overlapping another tensor, or
    not where llama.cpp's loader expects it (tensors back to back in table order)."""


class MissingTensorError(ModelFileError):
    """A tensor the architecture's graph reads is not in the file."""


class TensorShapeMismatchError(ModelFileError):
    """A tensor whose shape differs from the one the file's hyperparameters imply (a transposed or
    narrower weight): the message gives both shapes."""


class ModelFileWarning(UserWarning):
    """Something in a model file that labkit does not read (tensors its architecture has no use for)."""


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


class UnknownTensorTypeError(TensorTableError, UnsupportedTensorTypeError):
    """A tensor table row whose type code ggml does not define (or no longer defines)."""


class VocabularyError(ModelFileError, TokenizerError):
    """The file's vocabulary contradicts itself or the model: scores or types of another length than
    the tokens, merges naming tokens it does not have, a vocabulary of another size than token_embd."""


class TokenIdError(TokenizerError, IndexError):
    """A token id outside the model's vocabulary."""


class GpuLimitError(LabkitError, ValueError):
    """A workgroup grid or a weight window the adapter cannot take (or a malformed one)."""


class BufferLimitError(GpuLimitError, PromptTooLongError):
    """A buffer or binding a pass needs is larger than the device allows; the message gives the
    sizes and what to capture instead (a long prompt: positions="last", fewer stages)."""


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


class NoCommonStagesError(LabkitError):
    """Two runs share no captured stage: comparing them would say nothing (map the names first)."""


class DumpsError(LabkitError):
    """Another engine's dumps that labkit cannot turn into a Run."""


class DumpsFileError(DumpsError, InputFileError):
    """A dumps source (directory, .npz, .npy, .safetensors) that is missing or unreadable."""


class UnknownPresetError(DumpsError, ValueError):
    """A `names=` preset that labkit does not ship."""


class UnmappedDumpsError(DumpsError):
    """Dumps none of whose names maps onto a stage of the model."""


class LayoutError(DumpsError, ValueError):
    """A dumped tensor whose shape cannot be read as the stage's layout."""


class AmbiguousLayoutError(LayoutError):
    """A dumped tensor's shape fits more than one layout; the message lists them and how to choose."""


class LayoutMismatchError(LayoutError):
    """A dumped tensor's shape contradicts the tokens (or the model): it fits no layout of its stage."""


class RunFileError(InputFileError):
    """A saved run (.safetensors) that is missing, unreadable or not written by labkit."""


class MemoryBudgetError(LabkitError):
    """A model, a pass or a capture whose memory plan exceeds the budget (`labkit.open(memory=...)`,
    by default what the machine has free). Raised before anything is allocated; the message names
    the parts of the plan and what to drop."""


class MemoryBudgetWarning(UserWarning):
    """The default capture of every stage did not fit the memory budget: a smaller one was taken."""
