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
    run: str = "run"  # the engines: KL(reference ‖ run) is the reference's distribution against the run's
    reference: str = "reference"

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
        return (f"logits: KL({self.reference} ‖ {self.run}) mean {self.mean_kl:.3e}, max {self.max_kl:.3e} nats; "
                f"the same top token at {sum(self.same_top1)} of {len(self.same_top1)} positions")  # fmt: skip


def logits_agreement(run: np.ndarray, reference: np.ndarray, positions: tuple[int, ...], names: tuple[str, str] = (
    "run", "reference"), rows: int = 16) -> LogitsAgreement | None:  # fmt: skip
    """KL and top-1 of two [positions, vocab] logits arrays, `rows` positions at a time (a 262k
    vocabulary in float64 is 2 MB a row); None where a row is not finite (a NaN or an unwritten logit:
    the NMSE row says so) or the shapes differ."""
    if np.shape(run) != np.shape(reference) or np.ndim(run) != 2:
        return None
    kl, same = [], []
    for start in range(0, np.shape(run)[0], rows):
        with np.errstate(invalid="ignore"):  # a debug run's poison is a signalling NaN: cast quietly
            a = np.asarray(run[start : start + rows], np.float64)
            b = np.asarray(reference[start : start + rows], np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            return None
        log_p, log_q = _log_softmax(b), _log_softmax(a)  # p: the reference's distribution, q: the run's
        kl += [float(max(k, 0.0)) for k in np.sum(np.exp(log_p) * (log_p - log_q), axis=1)]
        same += [bool(x) for x in np.argmax(a, axis=1) == np.argmax(b, axis=1)]
    return LogitsAgreement(tuple(positions), tuple(kl), tuple(same), *names)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))
