"""SentencePiece merging as llama.cpp's `llm_tokenizer_spm_session` does it, in plain Python.

A raw text fragment (spaces already "▁") starts as one symbol a character. Every adjacent pair whose
joined text is a token is queued by that token's score; the best (ties: the leftmost) merges first,
and a merge queues its new pairs with its neighbours. A symbol that ends up no token is written as
its UTF-8 bytes' `<0xXX>` tokens. Nothing is built ahead but the vocabulary's dict, where HF's BPE
needs every split of every token as an explicit merge (515k for Gemma 3's vocabulary: 2 s a process).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from labkit.errors import TokenizerError


class SpmMerger:
    """Token ids of raw text fragments, by llama.cpp's SentencePiece merge loop."""

    def __init__(self, vocab: Mapping[str, int], scores: Sequence[float]):
        self.vocab, self.scores = vocab, scores

    def encode(self, text: str) -> list[int]:
        """The ids of one fragment (spaces not yet escaped: they become "▁" here)."""
        text = text.replace(" ", "▁")
        n = len(text)
        size = [1] * n  # a symbol's length in characters; 0 once merged into its left neighbour
        prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
        nxt[-1:] = [-1] if n else []
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, joined length)
        for i in range(1, n):
            self._push(queue, text, size, i - 1, i)
        while queue:
            _, left, right, joined = heapq.heappop(queue)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue  # one side has changed since this pair was queued
            size[left], size[right] = joined, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            self._push(queue, text, size, prev[left], left)
            self._push(queue, text, size, left, nxt[left])
        out: list[int] = []
        i = 0 if n else -1
        while i >= 0:
            self._emit(text[i : i + size[i]], out)
            i = nxt[i]
        return out

    def _push(self, queue: list, text: str, size: list[int], left: int, right: int) -> None:
        """Queue the pair (left, right) when their joined text is a token (llama.cpp's try_add_bigram)."""
        if left < 0 or right < 0:
            return
        joined = size[left] + size[right]
        token = self.vocab.get(text[left : left + joined])
        if token is not None:
            heapq.heappush(queue, (-float(self.scores[token]), left, right, joined))

    def _emit(self, piece: str, out: list[int]) -> None:
        """The piece's token, or its UTF-8 bytes as byte tokens (llama.cpp's resegment)."""
        token = self.vocab.get(piece)
        if token is not None:
            out.append(token)
            return
        for b in piece.encode():
            byte = self.vocab.get(f"<0x{b:02X}>")
            if byte is None and b < 0x80:
                byte = self.vocab.get(chr(b))
            if byte is None:
                raise TokenizerError(f"this vocabulary has no token for the byte 0x{b:02X} in {piece!r}")
            out.append(byte)
