"""What a serving engineer checks first when two runs' logits differ: per position, the KL divergence
of the run's next-token distribution from the reference's, and whether both rank the same token
first (llama.cpp's `perplexity --kl-divergence` reports these two; vLLM #35961 asks for them). NMSE
says how far the logits moved; these say how much the distribution a sampler draws from moved."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LogitsAgreement:
    """Per compared position: KL(reference ‖ run) in nats, and whether both put the same token first."""

    positions: tuple[int, ...]
    kl: tuple[float, ...]
    same_top1: tuple[bool, ...]

    @property
    def mean_kl(self) -> float:
        return float(np.mean(self.kl)) if self.kl else 0.0

    @property
    def max_kl(self) -> float:
        return float(np.max(self.kl)) if self.kl else 0.0

    @property
    def top1_agreement(self) -> float:
        """The share of positions whose top token is the same."""
        return float(np.mean(self.same_top1)) if self.same_top1 else 1.0

    def text(self) -> str:
        return (f"logits: KL(reference ‖ run) mean {self.mean_kl:.3e}, max {self.max_kl:.3e} nats; "
                f"the same top token at {sum(self.same_top1)} of {len(self.same_top1)} positions")  # fmt: skip


def logits_agreement(run: np.ndarray, reference: np.ndarray, positions: tuple[int, ...]) -> LogitsAgreement | None:
    """KL and top-1 of two [positions, vocab] logits arrays; None where a row is not finite (a NaN or an
    unwritten logit: the NMSE row says so) or the shapes differ."""
    a, b = np.asarray(run, np.float64), np.asarray(reference, np.float64)
    if a.shape != b.shape or a.ndim != 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    log_p, log_q = _log_softmax(b), _log_softmax(a)  # p: the reference's distribution, q: the run's
    kl = np.sum(np.exp(log_p) * (log_p - log_q), axis=1)
    same = np.argmax(a, axis=1) == np.argmax(b, axis=1)
    return LogitsAgreement(tuple(positions), tuple(float(max(k, 0.0)) for k in kl), tuple(bool(s) for s in same))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
