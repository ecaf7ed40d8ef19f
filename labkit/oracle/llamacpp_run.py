"""llama.cpp run as an oracle: one context per pass, an eval callback copying out the nodes
labkit.oracle.llamacpp's mapping names (ctypes on the ggml library inside `llama_cpp/lib`), and
their tensors reshaped to labkit's layout (vectors [positions, features]; attention maps [heads,
q_pos, k_pos], cropped from llama.cpp's KV-padded [n_kv, T, heads] to the cells this pass wrote).
A prompt may be run after cached positions (`past`) and in micro-batches (`ubatch`): one
llama_decode per micro-batch on the context's own cache, as llama.cpp splits a batch into ubatches.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from labkit import progress
from labkit.chunks import chunk_spans, merge_chunks
from labkit.errors import OracleUnavailableError
from labkit.model.config import ModelConfig
from labkit.model.graph import Stage
from labkit.model.stage_kinds import is_attention_map, stage_kind
from labkit.oracle.llamacpp import INSTALL_HINT, OracleError, Pick, mapping


# ----------------------------------------------------------------- ctypes on ggml
class _GgmlTensor(ctypes.Structure):
    """The head of ggml.h's `struct ggml_tensor` (GGML_MAX_DIMS 4, 64-byte op_params, GGML_MAX_SRC 10)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32 = 0, 1, 26
_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_I32: np.int32}
_READ = (GGML_TYPE_F32, GGML_TYPE_I32)  # what a stage's node may hold: floats, or integer ids (ffn_moe_topk)


class _Ggml:
    def __init__(self, llama_cpp_module):
        libdir = Path(llama_cpp_module.__file__).parent / "lib"
        names = [n for n in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll") if (libdir / n).exists()]
        if not names:
            raise OracleUnavailableError(f"ggml-base library not found in {libdir}; {INSTALL_HINT}")
        lib = ctypes.CDLL(str(libdir / names[0]))
        lib.ggml_get_name.restype = ctypes.c_char_p
        lib.ggml_get_name.argtypes = [ctypes.c_void_p]
        lib.ggml_nbytes.restype = ctypes.c_size_t
        lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
        lib.ggml_nelements.restype = ctypes.c_int64
        lib.ggml_nelements.argtypes = [ctypes.c_void_p]
        lib.ggml_op_name.restype = ctypes.c_char_p
        lib.ggml_op_name.argtypes = [ctypes.c_int]
        lib.ggml_backend_tensor_get.restype = None
        lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self.lib = lib
        self._name_addr = lib["ggml_get_name"]  # a second handle, returning the address
        self._name_addr.restype = ctypes.c_void_p
        self._name_addr.argtypes = [ctypes.c_void_p]
        self._ops: dict[int, str] = {}
        self.layout_checked = False

    def check_layout(self, t: int) -> None:
        """`_GgmlTensor` must match this ggml build: its `name` field sits where ggml_get_name points."""
        if self._name_addr(t) != t + _GgmlTensor.name.offset:
            raise OracleError("struct ggml_tensor layout differs from labkit's (another ggml version?)")
        self.layout_checked = True

    def name(self, t: int) -> str:
        return self.lib.ggml_get_name(t).decode("utf-8", "replace")

    def op(self, s: _GgmlTensor) -> str:
        if s.op not in self._ops:
            self._ops[s.op] = self.lib.ggml_op_name(s.op).decode()
        return self._ops[s.op]

    def read(self, t: int) -> np.ndarray:
        """The tensor as numpy with shape ne[::-1], honouring nb[] (views and permutes)."""
        s = _GgmlTensor.from_address(t)
        dtype = _DTYPES.get(s.type)
        if dtype is None:
            raise OracleError(f"tensor {self.name(t)!r} has ggml type {s.type}, not F32/F16/I32")
        shape = tuple(int(n) for n in s.ne)[::-1]
        if int(self.lib.ggml_nelements(t)) != int(np.prod(shape)):
            raise OracleError(f"tensor {self.name(t)!r}: ne {shape[::-1]} disagrees with ggml_nelements")
        nbytes = int(self.lib.ggml_nbytes(t))
        raw = np.empty(nbytes, dtype=np.uint8)
        self.lib.ggml_backend_tensor_get(t, raw.ctypes.data, 0, nbytes)
        strides = tuple(int(n) for n in s.nb)[::-1]
        return np.lib.stride_tricks.as_strided(raw.view(dtype), shape=shape, strides=strides).copy()


class _Backend:
    """llama_cpp imported once, ggml's library opened, llama.cpp models loaded once per path."""

    def __init__(self):
        try:
            import llama_cpp
            from llama_cpp import llama_cpp as L
        except ImportError as e:
            raise OracleUnavailableError(INSTALL_HINT) from e
        except OSError as e:
            raise OracleUnavailableError(f"llama_cpp failed to load ({e}); {INSTALL_HINT}") from e
        self.L = L
        self.ggml = _Ggml(llama_cpp)
        self.models: dict[str, int] = {}
        self.lock = threading.Lock()
        with _quiet():
            L.llama_backend_init()

    def model(self, path: str | Path) -> int:
        key = os.path.realpath(path)
        if key not in self.models:
            params = self.L.llama_model_default_params()
            params.n_gpu_layers = 0
            with _quiet():
                m = self.L.llama_model_load_from_file(key.encode(), params)
            if not m:
                raise OracleError(f"llama.cpp could not load {key}")
            self.models[key] = m
        return self.models[key]


_BACKEND: _Backend | None = None


def _backend() -> _Backend:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = _Backend()
    return _BACKEND


class _quiet:
    """Mute llama-cpp-python's log forwarding (its logger) for the duration, then restore it."""

    def __enter__(self):
        self.logger = logging.getLogger("llama-cpp-python")
        self.level = self.logger.level
        self.logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


# ----------------------------------------------------------------- the run
@dataclass
class _Want:
    stage: str  # labkit stage name
    pick: Pick


class _Collector:
    """The eval callback's state: which nodes to ask for, and what came back."""

    def __init__(self, ggml: _Ggml, wants_by_key: dict[tuple, list[_Want]], reads: dict[tuple, list[_Want]]):
        self.ggml = ggml
        self.by_key = wants_by_key  # (node name, op) → want
        self.by_reads = reads  # (src[i] name, op, i) → want; op "ADD>UNARY": found through an ADD
        self.srcs = sorted({i for _, _, i in reads} | {1})  # the sources any pick names
        self.through = any(">" in op for _, op, _ in reads)
        self.raw: dict[str, np.ndarray] = {}  # stage → raw tensor (numpy, ne reversed)
        self.softmax: dict[str, tuple[float, float, np.ndarray]] = {}  # kq name → (scale, max_bias, mask)
        self.softmax_of: dict[str, str] = {}  # kq node name → stage name (attn_scores)
        self.seen: dict[str, int] = {}
        self.error: BaseException | None = None
        self.bar = progress.bar(0, "")  # run_llamacpp's bar over the stages captured
        self.active = True  # off while a decode step's prompt runs: nothing of it is copied out

    def match(self, t: int) -> tuple[list[_Want], _GgmlTensor, str]:
        """The stages this node gives (several when it holds more than one: phi3's fused up matmul)."""
        s = _GgmlTensor.from_address(t)
        name = self.ggml.name(t)
        op = self.ggml.op(s)
        wants = self.by_key.get((name, op), []) if any(s.ne) and all(s.ne) else []  # never an empty node
        for i in self.srcs if all(s.ne) else ():
            if wants or not s.src[i]:
                continue
            wants = self.by_reads.get((self.ggml.name(s.src[i]), op, i), [])
            if not wants and i == 0 and self.through:  # a node found through the node it reads (through=)
                s0 = _GgmlTensor.from_address(s.src[0])
                if s0.src[1]:
                    key = (self.ggml.name(s0.src[1]), f"{self.ggml.op(s0)}>{op}", 0)
                    wants = self.by_reads.get(key, [])
        return wants, s, name

    def is_softmax_of_scores(self, s: _GgmlTensor, op: str) -> str | None:
        if op != "SOFT_MAX" or not s.src[0]:
            return None
        return self.softmax_of.get(self.ggml.name(s.src[0]))

    def __call__(self, t: int, ask: bool, _user: int) -> bool:
        try:
            if not self.ggml.layout_checked:
                self.ggml.check_layout(t)
            if not self.active:
                return not ask
            wants, s, name = self.match(t)
            op = self.ggml.op(s)
            scores = self.is_softmax_of_scores(s, op)
            if ask:
                return (bool(wants) and s.type in _READ) or scores is not None
            if scores is not None:
                # soft_max_ext(kq, mask, scale, max_bias): op_params[0] scale, [1] max_bias; src[1] the mask.
                pf = ctypes.cast(ctypes.addressof(s.op_params), ctypes.POINTER(ctypes.c_float))
                mask = self.ggml.read(s.src[1]) if s.src[1] else None
                self.softmax[scores] = (float(pf[0]), float(pf[1]), mask)
            if wants and s.type in _READ:
                data = self.ggml.read(t)
                for want in wants:
                    self.seen[want.stage] = self.seen.get(want.stage, 0) + 1
                    self.raw[want.stage] = data
                self.bar.update(len(wants))
            return True
        except BaseException as e:  # an exception must not cross into C; report it after decode
            self.error = e
            return False


def _wants(cfg: ModelConfig, graph: list[Stage]) -> tuple[dict, dict, dict[str, str]]:
    m = mapping(cfg.arch, cfg)
    by_key: dict[tuple[str, str], list[_Want]] = {}
    by_reads: dict[tuple[str, str], list[_Want]] = {}
    scores_of: dict[str, str] = {}
    for st in graph:
        pick = m.get(st.kind)
        if pick is None:
            continue
        L = "" if st.layer is None else str(st.layer)
        want = _Want(st.name, pick)
        if pick.reads is not None and pick.through is not None:
            by_reads.setdefault((pick.reads.format(L=L), f"{pick.through}>{pick.op}", 0), []).append(want)
        elif pick.reads is not None:
            by_reads.setdefault((pick.reads.format(L=L), pick.op, pick.src), []).append(want)
        else:
            by_key.setdefault((pick.name.format(L=L), pick.op), []).append(want)
        if pick.layout == "scores":
            scores_of[pick.name.format(L=L)] = st.name
    return by_key, by_reads, scores_of


def _to_labkit(stage: Stage, pick: Pick, raw: np.ndarray, T: int, col: _Collector, past: int = 0) -> np.ndarray:
    """llama.cpp's tensor (numpy, ne reversed) in labkit's layout for `stage`: T positions, attention maps
    over the `past` positions before them too (a decode step's)."""
    if pick.layout == "slots":  # ne [features, k, T] (or [k, T]): positions, then slots
        return raw.reshape(T, stage.params["k"], -1) if raw.size != T * stage.params["k"] else raw.reshape(T, -1)
    if pick.layout in ("scan_y", "scan_state"):  # ggml_ssm_scan's one output: y, then the final state
        flat = raw.reshape(-1)
        if pick.layout == "scan_y":
            return flat[: T * stage.params["d_inner"]].reshape(T, -1)
        return flat[flat.size - stage.params["size"] :].reshape(1, -1)
    if pick.layout == "state":
        return raw.reshape(1, -1)
    if pick.layout == "heads_first":  # ne [features, T, heads] -> numpy [heads, T, features] -> [T, heads * features]
        return raw.reshape(raw.shape[-3], T, -1).transpose(1, 0, 2).reshape(T, -1)
    if pick.layout == "vec":
        if raw.size % T:
            raise OracleError(f"{stage.name}: llama.cpp tensor of shape {raw.shape} does not split into {T} positions")
        # ne = [features..., T, 1...]: positions are the slowest non-trivial dimension.
        vec = raw.reshape(T, -1)
        if pick.part is not None:
            i, n = pick.part
            width = vec.shape[1] // n
            vec = vec[:, i * width : (i + 1) * width]
        if pick.rows:
            vec = vec[:, stage.weight_rows[0] : stage.weight_rows[1]]
        if pick.unrepeat:
            vec = vec.reshape(T, -1, stage.params["repeat"], stage.params["group"])[:, :, 0].reshape(T, -1)
        return vec
    # attention maps: ne [n_kv, T, heads, 1] → numpy [1, heads, T, n_kv] → [heads, T, n_kv]
    a = raw.reshape(raw.shape[-3], raw.shape[-2], raw.shape[-1])
    keys = past + T
    if a.shape[1] != T or a.shape[2] < keys:
        raise OracleError(f"{stage.name}: unexpected attention shape {a.shape} for {T} positions")
    if pick.layout == "probs":
        if np.any(a[:, :, keys:] != 0):
            raise OracleError(f"{stage.name}: llama.cpp attends to KV cells beyond this pass's {keys}")
        return a[:, :, :keys]
    scale, max_bias, mask = col.softmax.get(stage.name, (math.nan, 0.0, None))
    if mask is None or not math.isfinite(scale):
        raise OracleError(f"{stage.name}: the soft_max node after kq was not seen")
    if max_bias != 0.0:
        raise OracleError(f"{stage.name}: ALiBi (max_bias={max_bias}) is not mapped")
    m = mask.reshape(-1, mask.shape[-2], mask.shape[-1])[0, :T, :].astype(np.float32)  # [T, n_kv], rows padded
    if not np.all(np.isneginf(m[:, keys:])):
        raise OracleError(f"{stage.name}: llama.cpp's mask leaves KV cells beyond this pass's {keys} open")
    return (a[:, :, :keys] * np.float32(scale) + m[None, :, :keys]).astype(np.float32)


def run_llamacpp(
    path: str | Path, cfg: ModelConfig, graph: list[Stage], ids: list[int], names: set[str] | None = None,
    past: int = 0, ubatch: int | None = None, kv_types: tuple[str, str] | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """llama.cpp's intermediate tensors for one pass, keyed by labkit stage name (only those in `names`,
    when given: the others are never copied out of llama.cpp). `past`: the first `past` ids run first as
    a prompt nothing is copied out of, and the pass is the rest, on the caches (KV and recurrent) that
    prompt left: a decode step when one id remains. `ubatch`: the pass as llama.cpp computes a batch
    split into micro-batches of that many tokens, each on the cache the ones before it left; the
    micro-batches' tensors are put back together as one pass's (labkit.chunks). `kv_types`: the K and V
    caches' types ("q8_0", ...; llama.cpp's own default, f16, when None); a quantized V cache turns flash
    attention on, as llama.cpp requires, so its scores and probabilities are not tensors of that run.

    One fresh context per call (the model is loaded once per path and kept): n_ctx holds the whole
    prompt, every position's logits are requested, flash attention is off, 2 threads. Stages without
    a counterpart, or whose node did not show up, are absent from the result (they land in
    Comparison.missing).
    """
    be = _backend()
    T = len(ids) - past
    if T <= 0:
        raise OracleError("empty prompt")
    spans = chunk_spans(T, T if ubatch is None else ubatch)
    by_key, by_reads, scores_of = _wants(cfg, [st for st in graph if names is None or st.name in names])
    with be.lock:
        col = _Collector(be.ggml, by_key, by_reads)
        col.softmax_of = scores_of
        cb = be.L.ggml_backend_sched_eval_callback(col)
        with _quiet():
            ctx = be.L.llama_init_from_model(be.model(path), _context_params(be.L, len(ids), cb, kv_types))
        if not ctx:
            raise OracleError("llama.cpp could not create a context")
        n_wanted = sum(map(len, by_key.values())) + sum(map(len, by_reads.values()))
        col.bar = progress.bar(n_wanted * len(spans), "llama.cpp: capturing stages", "stage")
        try:
            parts = _decode_parts(be.L, ctx, col, cfg, graph, ids, past, spans)
        finally:
            col.bar.close()
            with _quiet():
                be.L.llama_free(ctx)
    return parts[0] if len(parts) == 1 else merge_chunks(parts, len(ids))


def run_llamacpp_batch(path: str | Path, cfg: ModelConfig, graph: list[Stage], seqs: list[list[int]],
                       names: set[str] | None = None, kv_types: tuple[str, str] | None = None
                       ) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """llama.cpp computing several sequences in one batch, as its server does: one llama_decode of every
    sequence's tokens, each under its own sequence id at its own positions, in one micro-batch over one
    unified KV cache (cells in batch order). Each sequence's tensors are its rows of the packed ones, and its
    attention maps its own keys; that every other sequence's keys are masked (probabilities 0) is checked."""
    if cfg.ssm is not None:
        raise OracleError("llama.cpp batches of a recurrent model are not mapped: their states are per sequence")
    be = _backend()
    starts = np.cumsum([0] + [len(s) for s in seqs])
    by_key, by_reads, scores_of = _wants(cfg, [st for st in graph if names is None or st.name in names])
    with be.lock:
        col = _Collector(be.ggml, by_key, by_reads)
        col.softmax_of = scores_of
        cb = be.L.ggml_backend_sched_eval_callback(col)
        params = _context_params(be.L, int(starts[-1]), cb, kv_types)
        params.n_seq_max, params.kv_unified = len(seqs), True
        with _quiet():
            ctx = be.L.llama_init_from_model(be.model(path), params)
        if not ctx:
            raise OracleError("llama.cpp could not create a context")
        col.bar = progress.bar(sum(map(len, by_key.values())) + sum(map(len, by_reads.values())),
                               "llama.cpp: capturing stages", "stage")  # fmt: skip
        try:
            col.raw, col.softmax, col.seen = {}, {}, {}
            rc = _decode_batch(be.L, ctx, seqs)
            if col.error is not None:
                raise OracleError(f"eval callback failed: {col.error!r}") from col.error
            if rc != 0:
                raise OracleError(f"llama_decode returned {rc}")
            picks, T = mapping(cfg.arch, cfg), int(starts[-1])
            whole = {st.name: _to_labkit(st, picks[st.kind], col.raw[st.name], T, col) for st in graph
                     if st.name in col.raw}  # fmt: skip
        finally:
            col.bar.close()
            with _quiet():
                be.L.llama_free(ctx)
    return [{n: _sequence_rows(n, a, int(s), int(e)) for n, a in whole.items()} for s, e in zip(starts, starts[1:])]


def _sequence_rows(name: str, a: np.ndarray, s: int, e: int) -> np.ndarray:
    """One sequence's part of a packed batch's tensor: its rows, and of an attention map its own keys."""
    if a.ndim == 3 and is_attention_map(name):
        others = np.delete(a[:, s:e], np.s_[s:e], axis=2)
        if others.size and not np.all(others == (0.0 if stage_kind(name) == "attn_probs" else -np.inf)):
            raise OracleError(f"{name}: llama.cpp's sequence at rows {s}..{e} sees another sequence's keys")
        return a[:, s:e, s:e]
    return a[s:e]


def _decode_batch(L, ctx, seqs: list[list[int]]) -> int:
    """llama_decode of every sequence's tokens in one batch: sequence k's under seq id k, from position 0."""
    n = sum(map(len, seqs))
    batch = L.llama_batch_init(n, 0, 1)
    try:
        i = 0
        for k, ids in enumerate(seqs):
            for pos, tok in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = int(tok), pos, 1, 1
                batch.seq_id[i][0] = k
                i += 1
        batch.n_tokens = n
        with _quiet():
            return L.llama_decode(ctx, batch)
    finally:
        L.llama_batch_free(batch)


def _decode_parts(L, ctx, col: _Collector, cfg: ModelConfig, graph: list[Stage], ids: list[int], past: int,
                  spans: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:  # fmt: skip
    """The `past` prompt with nothing copied out, then one llama_decode per micro-batch, each one's
    tensors in labkit's layout."""
    col.active = False
    rc = _decode(L, ctx, ids[:past], 0) if past else 0
    col.active = True
    parts = []
    for s, e in spans:
        col.raw, col.softmax, col.seen = {}, {}, {}
        rc = rc or _decode(L, ctx, ids[past + s : past + e], past + s)
        if col.error is not None:
            raise OracleError(f"eval callback failed: {col.error!r}") from col.error
        if rc != 0:
            raise OracleError(f"llama_decode returned {rc}")
        dup = {k: n for k, n in col.seen.items() if n > 1}
        if dup:
            raise OracleError(f"more than one llama.cpp node matched: {dup}")
        picks = mapping(cfg.arch, cfg)
        parts.append({st.name: _to_labkit(st, picks[st.kind], col.raw[st.name], e - s, col, past + s)
                      for st in graph if st.name in col.raw})  # fmt: skip
    return parts


def _context_params(L, n_tokens: int, cb, kv_types: tuple[str, str] | None = None):
    """A context holding the whole prompt in one (u)batch, flash attention off (kq and kq_soft_max stay
    tensors) unless a quantized V cache needs it, sliding-window layers with a full cache (cell i holds
    position i), 2 threads."""
    n_ctx = max(256, -(-n_tokens // 256) * 256)
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = n_ctx
    cp.n_ubatch = n_ctx
    cp.n_seq_max = 1
    cp.n_threads = 2
    cp.n_threads_batch = 2
    cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    if kv_types is not None:
        cp.type_k, cp.type_v = (int(GGMLQuantizationType[t.upper()]) for t in kv_types)
        cp.flash_attn_type = int(kv_types[1] not in ("f32", "f16", "bf16"))  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    cp.swa_full = True
    cp.no_perf = True
    cp.cb_eval = cb
    cp.cb_eval_user_data = None
    return cp


def _decode(L, ctx, ids: list[int], start: int) -> int:
    """llama_decode of `ids` at positions start.., every position an output (nothing is pruned)."""
    batch = L.llama_batch_init(len(ids), 0, 1)
    try:
        for i, tok in enumerate(ids):
            batch.token[i] = int(tok)
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = len(ids)
        with _quiet():
            return L.llama_decode(ctx, batch)
    finally:
        L.llama_batch_free(batch)
