"""An engine's precision, emulated in numpy: what its own rounding does to one stage.

A stage's noise band is the distance between the stage computed exactly (float64) and
computed the way an engine of that precision computes it, both from the same inputs. So
the band is measured on the data at hand, per stage, not looked up in a table:

- float32 (labkit's GPU pass, an f32 framework): activations and the arithmetic in f32, a
  matmul's sum accumulated 32 products at a time (`f32_accumulated`);
- float16 / bfloat16 (a half-precision framework's dumps): inputs, weights and outputs
  rounded to the format, products accumulated in f32 the same way;
- int8-activations (llama.cpp's CPU backend): f32 activations, each quantized matmul's
  input through the weight type's 8-bit blocks (labkit.attribution.activation_quant), and
  the KV cache, with the q and the probabilities that multiply it, in f16;
- float64 (the reference): no rounding; its band is zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from labkit.attribution.activation_quant import activation_rounding
from labkit.attribution.rounding import ROUND, to_f16, to_f32, to_f64
from labkit.model.graph import Stage
from labkit.model.weight_cache import Product
from labkit.precision import check_precision

Rounding = Callable[[np.ndarray], np.ndarray]
ACCUMULATE_CHUNK = 32  # K values a thread multiplies before adding into its f32 sum (one GGUF block)


@dataclass(frozen=True)
class Emulation:
    """How an engine of one precision stores and computes; see the module docstring."""

    precision: str
    storage: Rounding  # activations between stages
    weights: Rounding  # the weights it multiplies with
    kv: Rounding  # the KV cache it reads
    int8_matmul_inputs: bool = False

    def product(self, weight_type: int, k: int) -> Product:
        """x @ W.T for a weight chunk, as this engine computes it."""
        if self.int8_matmul_inputs:
            quantize = activation_rounding(weight_type, k)
            return lambda x, w: quantize(x).astype(np.float64) @ w.astype(np.float64).T
        if self.precision == "float64":
            return lambda x, w: to_f64(x) @ to_f64(w).T
        return lambda x, w: f32_accumulated(self.storage(x), self.weights(w)).astype(np.float64)

    def inputs(self, st: Stage, xs: list[np.ndarray]) -> list[np.ndarray]:
        """A stage's inputs as the engine reads them. llama.cpp multiplies q by the f16 keys, and
        the probabilities by the f16 values, in f16 (its mul_mat converts the f32 side), and its
        GELU looks the gate up in a table of f16 values (GGML_GELU_FP16)."""
        xs = [self.storage(x) for x in xs]
        if self.int8_matmul_inputs and (
            st.op in ("attn_scores", "attn_ctx") or (st.op == "glu" and st.params.get("act", "").startswith("gelu"))
        ):
            xs[0] = to_f16(xs[0])
        return xs


def f32_accumulated(x: np.ndarray, w: np.ndarray, chunk: int = ACCUMULATE_CHUNK) -> np.ndarray:
    """x @ w.T with the partial sums of each `chunk` of K added into an f32 accumulator one after
    another, as a GPU thread adds block after block. One BLAS product in f32 sums more cleverly
    and gave 4 to 40 times less error than lavapipe's kernels on SmolLM2's Q4_1 ffn_down."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for c in range(0, x.shape[1], chunk):
        acc += x[:, c : c + chunk] @ w[:, c : c + chunk].T
    return acc


def emulation_for(precision: str) -> Emulation:
    """The emulation of a run's precision (labkit.precision's names)."""
    check_precision(precision)
    if precision == "int8-activations":
        return Emulation(precision, to_f32, to_f32, to_f16, int8_matmul_inputs=True)
    rounding = ROUND[precision]
    return Emulation(precision, rounding, rounding, rounding)
