"""The public entry points: open a model, run it on the GPU or the reference, compare.

`labkit.open(name)` reads only the GGUF header; the tokenizer, the reference
weights and the GPU executor are each built on first use.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from labkit import batch, captures, generation
from labkit.captures import Run
from labkit.chunks import chunk_spans, merged_timings, run_chunked, summed_per_stage
from labkit.errors import InvalidArgumentError, LabkitError, PromptTooLongError, TokenizerError
from labkit.generation import Generation
from labkit.memory_fit import MemoryFit
from labkit.model.cache_stages import CacheTypes, cache_types, with_cache_stages
from labkit.model.config import ModelConfig
from labkit.model.gguf_file import GgufFile
from labkit.model.graph import Stage
from labkit.model.memory import Budget, MemoryPlan, budget_of
from labkit.model.model_file import open_model_file
from labkit.model.reference import KVCache, ReferenceEngine
from labkit.model.registry import DEFAULT_MODEL, resolve_model
from labkit.model.stage_kinds import role_of
from labkit.sampling import Sampler
from labkit.selection import Capture, Positions, select_heads, select_names, select_positions
from labkit.sequence import SequenceState, continuing, path_name, reference_pass

Prompt = str | list[int]


class Lab:
    """One model, opened. See DESIGN.md's public API for what hangs off it."""

    def __init__(
        self,
        name: str,
        path: Path,
        variants: dict[str, str] | None = None,
        debug: bool = False,
        window_bytes: int | None = None,
        memory: int | float | str | None = None,
        kv_types: CacheTypes | None = None,
    ):
        t0 = time.perf_counter()
        self.budget: Budget = budget_of(memory)  # for weights, caches and captures of both engines
        self.name, self.path = name, path
        opened = open_model_file(path)  # every field checked (labkit.model.model_file)
        self.gguf: GgufFile = opened.gguf
        self.config: ModelConfig = opened.config
        self.kv_types = kv_types or CacheTypes()  # the KV cache's types (labkit.model.cache_stages)
        self.graph: list[Stage] = with_cache_stages(opened.graph, opened.config, self.kv_types)
        from labkit.ops.registry import check_selection

        # {family or blk.L.family: variant}, aliases resolved; shared with the executor
        self.selected: dict[str, str] = check_selection(dict(variants or {}))
        self._last_pass = None
        self._generate_held = None  # the last generate's PassState (labkit.gpu.pass_request), kept for the next
        self.fit = MemoryFit(self)  # plans each pass against the budget (labkit.memory_fit)
        self._listeners: list[weakref.ref] = []  # called with the selection after every use()
        self.debug = debug
        self.window_bytes = window_bytes  # split weights into row windows of at most this many bytes
        self.load_seconds = time.perf_counter() - t0

    # ----- text ↔ ids
    @cached_property
    def tokenizer(self):
        from labkit.model.tokenizer import build_tokenizer

        return build_tokenizer(self.gguf.metadata)

    def tokenize(self, text: str, add_bos: bool | None = None) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def token_id(self, text: str) -> int:
        """The id of a text that is one token (`lab.token_id(" blue")`, no BOS); a TokenizerError
        naming the pieces when it is not one token."""
        ids = self.tokenize(text, add_bos=False)
        if len(ids) != 1:
            pieces = [self.piece(i) for i in ids]
            raise TokenizerError(f"{text!r} is {len(ids)} tokens, not one: {list(zip(ids, pieces))}")
        return ids[0]

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def piece(self, token_id: int) -> str:
        return self.tokenizer.piece(token_id)

    @property
    def stages(self) -> list[str]:
        return [s.name for s in self.graph]

    def prompt_ids(self, prompt: Prompt, extra: int = 0) -> list[int]:
        """Token ids of a prompt (text or ids), checked against the context length."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        if not ids:
            raise PromptTooLongError("the prompt is empty: nothing to run")
        if len(ids) + extra > self.config.context_length:
            raise PromptTooLongError(
                f"prompt of {len(ids)} tokens (+{extra} to generate) exceeds the context "
                f"length {self.config.context_length}"
            )
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise PromptTooLongError(f"token ids out of range for vocab {self.config.vocab_size}: {bad[:5]}")
        return ids

    # ----- the float64 reference
    @cached_property
    def reference_engine(self) -> ReferenceEngine:
        return ReferenceEngine(self.gguf, self.config, self.graph)

    def with_kv_type(self, kv_type: str | None = None, kv_type_k: str | None = None,
                     kv_type_v: str | None = None) -> Lab:  # fmt: skip
        """The same model and kernel selection on KV caches of other types (as `labkit.open(..., kv_type=)`),
        sharing this lab's budget and its reference's dequantized weights: what a `kv=q8_0` path runs on."""
        sib = Lab(self.name, self.path, variants=dict(self.selected), debug=self.debug, window_bytes=self.window_bytes,
                  kv_types=cache_types(kv_type, kv_type_k, kv_type_v))  # fmt: skip
        sib.budget = self.budget
        sib.reference_engine = ReferenceEngine(sib.gguf, sib.config, sib.graph, self.reference_engine.weights)
        return sib

    def reference(
        self, prompt: Prompt, names: list[str] | None = None, layers: list[int] | None = None,
        route_as: Run | None = None, ubatch: int | None = None, state: SequenceState | None = None,
    ) -> Run:  # fmt: skip
        """The whole prompt through the float64 numpy reference; every stage captured that fits the
        memory budget (`names`, globs allowed, and `layers` capture less). `route_as`: a mixture of
        experts routes each token to the experts another run chose (its `ffn_topk` captures), so a
        near-tie that run broke the other way compares as a tie and every later stage compares on
        the same experts (teacher-forced routing). `ubatch=N`: the prompt as passes of N tokens, each
        continuing the cache (captures cover every position, as one pass's). `state`: a reference
        state from `lab.prefill`, continued (and advanced) by these tokens (`run.n_past` before them)."""
        ids = self.prompt_ids(prompt)
        if ubatch is not None:
            chunk_spans(len(ids), ubatch)  # a micro-batch of 0 is refused before any work
        if route_as is not None and (state is not None or (ubatch or len(ids)) < len(ids)):
            raise InvalidArgumentError("route_as= routes a one-shot pass: not with ubatch= or state=")
        n_past = self._check_state(state, "reference", len(ids))
        names = select_names(self.graph, names, layers)
        names = self.fit.capture("reference", n_past + len(ids), names)
        t0 = time.perf_counter()
        eng = self.reference_engine
        eng.forced_ids = captures.routing_of(route_as, self.graph)
        cache = state.held if state is not None else KVCache()
        try:
            with continuing(state, ids):
                caps = reference_pass(eng, ids, cache, names, ubatch)
        finally:
            eng.forced_ids = None
        timings = {"total_s": time.perf_counter() - t0}
        return self._make_run("reference", ids, caps, timings, n_past=n_past, path=path_name(n_past, ubatch, len(ids)))

    def _check_state(self, state: SequenceState | None, engine: str, n_new: int) -> int:
        """The positions a continued state holds (0 without one), after refusing one this lab cannot
        continue (another model, engine or kernel selection, or no room left)."""
        if state is None:
            return 0
        if not isinstance(state, SequenceState):
            raise InvalidArgumentError(f"state={type(state).__name__}: give a state from lab.prefill")
        state.check_continues(engine, self.name, dict(self.selected), n_new, str(self.kv_types))
        return state.n_past

    def prefill(self, prefix: Prompt, engine: str = "gpu", room: int | None = None, ubatch: int | None = None
                ) -> SequenceState:  # fmt: skip
        """The prefix computed and kept (a prefix cache): a state that `lab.run(rest, state=...)` (or
        `lab.reference(rest, state=...)` for engine="reference") continues, with room for `room` more
        tokens (256, or what the context leaves); `state.fork()` keeps a copy for another continuation."""
        if room is None:
            room = max(0, min(256, self.config.context_length - len(self.prompt_ids(prefix))))
        ids = self.prompt_ids(prefix, extra=room)
        capacity = len(ids) + room
        if engine == "reference":
            state = SequenceState("reference", self.name, [], KVCache(), capacity, kv_types=str(self.kv_types))
            self.reference(ids, names=[], ubatch=ubatch, state=state)
        elif engine == "gpu":
            ex = self.executor
            state = SequenceState("gpu", self.name, [], ex.new_state(capacity), capacity, dict(self.selected),
                                  ex.device, kv_types=str(self.kv_types))  # fmt: skip
            self.run(ids, names=[], ubatch=ubatch, state=state, timestamps=False)
        else:
            raise InvalidArgumentError(f"prefill engine {engine!r}: use 'gpu' or 'reference'")
        return state

    def verify(self, draft: Prompt, state: SequenceState, names: list[str] | None = None) -> Run:
        """A speculative verifier's pass: the k draft tokens in one pass on a copy of `state` (left as it
        was), each row what a decode step of that token would give after the ones before it."""
        if state is None:
            raise InvalidArgumentError("verify needs the state the draft continues (lab.prefill)")
        self._check_state(state, getattr(state, "engine", "gpu"), len(self.prompt_ids(draft)))
        base = state.fork()
        go = self.run if state.engine == "gpu" else self.reference
        run = go(draft, names=names, state=base)
        run.path = path_name(state.n_past, None, len(run.tokens), verify=True)
        return run

    # ----- memory
    def memory(self, tokens: int = 128, capture: Capture | list[str] | str | dict | None = None,
               engine: str | None = None) -> MemoryPlan:  # fmt: skip
        """The memory plan of a pass of `tokens` tokens with this capture policy, for both engines (or
        `engine="gpu"`/`"reference"`), against the lab's budget: a table (`print(lab.memory())`)."""
        if engine not in (None, "gpu", "reference"):
            raise InvalidArgumentError(f"engine={engine!r}: give 'gpu', 'reference' or None (both)")
        cap = Capture.of(capture) if capture is not None else Capture()
        names = select_names(self.graph, cap.names, cap.layers)
        return self.fit.plan(tokens, names, cap.logits == "last", engines=(engine,) if engine else ("gpu", "reference"))

    def _make_run(
        self,
        engine: str,
        ids: list[int],
        caps: dict[str, np.ndarray],
        timings: dict[str, float],
        **kw: Any,
    ) -> Run:
        return Run(
            model=self.name,
            engine=engine,
            tokens=list(ids),
            stages=self.stages,
            captures=caps,
            timings=timings,
            piece=self.piece,
            explain=self.explain,
            unembed=lambda hidden: self.reference_engine.unembed(hidden),
            selection_bias=self.selection_bias,
            **kw,
        )

    def selection_bias(self, stage: str) -> np.ndarray | None:
        """The selection-only bias (exp_probs_b) the stage's top k rank with, None where it has none."""
        st = next((s for s in self.graph if s.name == stage), None)
        if st is None or st.op != "moe_router" or not st.bias:
            return None
        return self.reference_engine.weight(st.bias)

    def generate_reference(self, prompt: Prompt, max_new_tokens: int = 8, sampler: Sampler | None = None) -> Generation:
        """KV-cached decode in the float64 reference (slow; for checking the GPU path)."""
        return generation.generate_reference(self, prompt, max_new_tokens, sampler)

    # ----- llama.cpp as an oracle (extra "oracle")
    def oracle(self, prompt: Prompt, names: list[str] | None = None, layers: list[int] | None = None,
               ubatch: int | None = None, prefix: int = 0, kv_type: str | None = None) -> Run:  # fmt: skip
        """llama.cpp's own intermediate tensors for the prompt, under labkit's stage names; `names`
        (globs allowed) and `layers` keep fewer, as `run` does, so an 8B prompt's tensors fit. The
        serving paths as llama.cpp computes them: `ubatch=N` splits the pass into micro-batches of N
        tokens (its n_ubatch), `prefix=P` runs the first P tokens first and captures the rest, which
        continue its cache (`run.n_past` = P). `kv_type`: llama.cpp's cache type (--cache-type-k/-v); by
        default the lab's (`labkit.open(m, kv_type=...)`), and for a lab of f32 caches llama.cpp's own f16."""
        from labkit.oracle.llamacpp_run import run_llamacpp

        ids = self.prompt_ids(prompt)
        if ubatch is not None:
            chunk_spans(len(ids), ubatch)
        if not isinstance(prefix, int) or isinstance(prefix, bool) or not 0 <= prefix < len(ids):
            raise InvalidArgumentError(f"prefix={prefix!r}: give 0 to {len(ids) - 1} of the prompt's {len(ids)} tokens")
        keep = select_names(self.graph, names, layers)
        t0 = time.perf_counter()
        types = cache_types(kv_type) if kv_type is not None else self.kv_types
        kv = None if types == CacheTypes() and kv_type is None else (types.k, types.v)
        captures = run_llamacpp(self.path, self.config, self.graph, ids, None if keep is None else set(keep), prefix,
                                ubatch, kv)  # fmt: skip
        path = path_name(prefix, ubatch, len(ids) - prefix)
        return self._make_run("llamacpp", ids[prefix:], captures, {"total_s": time.perf_counter() - t0},
                              n_past=prefix, path=path)  # fmt: skip

    def oracle_thresholds(self) -> dict[str, float]:
        """Per-stage-kind NMSE bounds for comparisons against llama.cpp (looser: 8-bit activations).
        `compare` picks them by itself for an oracle run (its precision is "int8-activations")."""
        from labkit.precision import INT8_ACTIVATION_THRESHOLDS

        return dict(INT8_ACTIVATION_THRESHOLDS)

    # ----- the GPU
    @cached_property
    def executor(self):
        from labkit.gpu.executor import GpuExecutor

        ex = GpuExecutor(self.gguf, self.config, self.graph, variants=self.selected)
        ex.window_bytes = self.window_bytes
        return ex

    def variants(self) -> dict[str, list[str]]:
        """{family: [variant names]}: kernels, dispatch policies and samplers; "default" is the correct one."""
        from labkit.ops.registry import variants

        return variants()

    def use(self, family: str, name: str = "default") -> Lab:
        """Switch a family's variant on this live lab, for every layer (`"rope"`) or one (`"blk.5.rope"`).
        The next run of the same prompt recomputes only from the first stage the switch affects."""
        from labkit.ops.registry import check_key

        key = check_key(family, name)
        if name == "default":
            self.selected.pop(key, None)
        else:
            self.selected[key] = name
        for ref in list(self._listeners):
            fn = ref()
            if fn is None:
                self._listeners.remove(ref)
            else:
                fn(dict(self.selected))
        return self

    def on_variants_changed(self, method) -> None:
        """Call a bound method with the selection after each `use()` (a widget that shows the
        selection stays true to it when another cell switches). Held weakly: a widget that is gone
        is not kept alive by the lab."""
        self._listeners.append(weakref.WeakMethod(method))

    def kernels(self) -> dict[str, dict[str, str]]:
        """For each stage kind: which kernel runs it and why (selected, or the default for this adapter).
        A kind whose layers differ (a per-layer variant) is listed per stage."""
        ex = self.executor
        out: dict[str, dict[str, str]] = {}
        for st in self.graph:
            c = ex.choice(st)
            row = {"family": c.family, "kernel": c.kernel.name, "why": c.why}
            key = st.kind if out.get(st.kind, row) == row else st.name
            out.setdefault(key, row)
        return out

    def explain(self, stage: str):
        """What a stage computes: the op, its formula, its inputs and output with this model's shapes."""
        from labkit.errors import UnknownStageError
        from labkit.ops import OPS
        from labkit.ops.base import Explanation

        st = next((s for s in self.graph if s.name == stage), None)
        if st is None:
            raise UnknownStageError(f"unknown stage {stage!r}; stages are e.g. {', '.join(self.stages[:6])}, ...")
        op = OPS[st.op]
        shapes, out = op.shapes(st)
        names = list(st.inputs) + [n for n in (st.weight, st.bias) if n]
        if st.inputs:  # "name [shape]" → "[shape]" beside its name
            shapes = [sh[len(n) :].strip() if sh.startswith(n) else sh for n, sh in zip(names, shapes, strict=False)]
        inputs = tuple(zip(names, shapes, strict=False)) if st.inputs else tuple((s, "") for s in shapes)
        kv = {"k": "writes K at n_past", "v": "writes V at n_past"}.get(st.kv_write or "", "")
        if st.kv_read:
            kv = (
                (kv + "; " if kv else "")
                + "reads "
                + " and ".join(k.upper() for k in st.kv_read)
                + " of every position"
            )
        return Explanation(st.name, op.name, op.what, op.stage_formula(st), inputs, out, kv, role_of(st.kind))

    def run(
        self,
        prompt: Prompt,
        names: list[str] | None = None,
        debug: bool | None = None,
        stepped: bool = False,
        timestamps: bool = True,
        patch: dict | None = None,
        positions: Positions = None,
        layers: list[int] | None = None,
        heads: list[int] | int | None = None,
        logits: str = "all",
        capture: Capture | list[str] | str | dict | None = None,
        ubatch: int | None = None,
        state: SequenceState | None = None,
    ) -> Run:
        """The whole prompt through the GPU; every stage captured by default.

        `ubatch=N` computes the prompt as passes of N tokens, each continuing the KV cache (and the
        recurrent state), as engines serve a long prompt; its captures cover every position, as one
        pass's, and `run.path` says how it was computed. `state=` (from `lab.prefill`) continues that
        sequence: the run's tokens follow its `n_past` positions, and the state advances past them.

        Capture less for long prompts: `names` takes stage names or globs ("blk.*.attn_out"),
        `layers` keeps those layers' stages (and embed, output_norm, logits), `positions` ("last",
        an int, a slice or a list) keeps those rows (query rows of attention maps), `heads` keeps
        those heads of the attention maps, and `logits="last"` computes the logits of the last
        position only. `capture=` takes the same as one policy: a `labkit.Capture`, a dict of its
        fields, or names. With positions="last", logits="last", or logits not captured, the
        unembedding runs for the last position only. From 256 tokens on a pass streams its
        captures and computes and reads its logits in 64 MiB token chunks, so 2048 Gemma tokens run
        with every stage captured (their [2048, 262144] logits alone are 2 GiB of host memory).
        Past that, an attention map outgrows one storage binding: a BufferLimitError says so before
        any GPU work, and what to capture or select instead.

        `patch={stage: fn}`: after `stage`, fn(array, stage) -> array is written back on the GPU and
        the pass continues from it. Re-running the same prompt after `use()` reuses the stages
        upstream of the first one the variant switch affects (run.timings["recomputed_from"])."""
        from labkit.gpu.pass_request import PassRequest
        from labkit.gpu.reuse import Reuse

        cap = self._capture(capture, names=names, layers=layers, positions=positions, heads=heads, logits=logits)
        ids = self.prompt_ids(prompt)
        if ubatch is not None:
            chunk_spans(len(ids), ubatch)  # a micro-batch of 0 is refused before any work
        if state is not None or (ubatch is not None and ubatch < len(ids)):
            return self._run_path(ids, cap, ubatch, state, debug, timestamps, patch, stepped)
        names = select_names(self.graph, cap.names, cap.layers)
        names = self.fit.capture("gpu", len(ids), names, cap.logits == "last" or cap.positions == "last")
        self.executor.upload_all()  # the first pass: weights to the GPU, with a bar for a large model
        rows = select_positions(len(ids), cap.positions)
        head_list = select_heads(self.config.n_heads, cap.heads)
        ex = self.executor
        debug = self.debug if debug is None else debug
        # the same prompt again re-runs the kept pass from the first stage a switch changed; another
        # one reuses the last run's buffers, whose pages stay warm (lavapipe's device memory is host
        # memory: fresh pages cost about 0.6 ms per MB, 0.25 s for a 128-token Gemma pass)
        last = self._last_pass
        if last is not None and last[0] == ids:
            state, reuse = last[1], Reuse.rerun(last[2])
        else:
            state, reuse = ex.new_state(len(ids)), Reuse.objects("run")
        self._last_pass = None  # kept again only when this pass succeeds: a failed one leaves nothing to rerun
        request = PassRequest(
            ids, names=names, positions=rows, heads=head_list, last_logits_only=cap.logits == "last",
            debug=debug, stepped=stepped, timestamps=timestamps, patch=patch or {}, reuse=reuse,
        )  # fmt: skip
        res = ex.run_pass(request, state)
        # regions outlive the pass: keep it, so a later variant switch re-runs only what it affects (a
        # pass on scratch regions cannot be re-run from its middle: dropping it frees its buffers now)
        self._last_pass = (ids, state, res) if res.reusable else None
        caps = res.captures
        timings = dict(res.timings, upload_s=ex.upload_seconds, recomputed_from=res.recomputed_from)
        if res.stage_ms:
            timings["stage_ms"] = res.stage_ms
        return self._make_run(
            "gpu",
            ids,
            caps,
            timings,
            unwritten=res.unwritten,
            variants=dict(self.selected),
            positions=res.positions,
            heads=res.heads,
        )

    def _run_path(self, ids: list[int], cap: Capture, ubatch: int | None, state: SequenceState | None,
                  debug: bool | None, timestamps: bool, patch: dict | None, stepped: bool) -> Run:  # fmt: skip
        """`run` in micro-batches and/or continuing a kept state: each pass a fresh plan on the
        sequence's own cache (the kept pass of a re-run is not this sequence's)."""
        from labkit.gpu.pass_request import PassRequest

        if cap.positions is not None or cap.heads is not None or cap.logits == "last":
            raise InvalidArgumentError("ubatch= and state= capture every position and head: use names= or layers=")
        if patch or stepped:
            raise InvalidArgumentError("patch= and stepped= run one pass: not with ubatch= or state=")
        n_past = self._check_state(state, "gpu", len(ids))
        names = select_names(self.graph, cap.names, cap.layers)
        names = self.fit.capture("gpu", n_past + len(ids), names)
        ex = self.executor
        ex.upload_all()
        self._last_pass = None
        held = state.held if state is not None else ex.new_state(len(ids))
        debug = self.debug if debug is None else debug
        results = []

        def one_pass(chunk: list[int]) -> dict[str, np.ndarray]:
            request = PassRequest(chunk, names=names, debug=debug, timestamps=timestamps)
            results.append(ex.run_pass(request, held))
            return results[-1].captures

        with continuing(state, ids):
            caps = run_chunked(ids, ubatch or len(ids), one_pass, n_past)
        timings, unwritten = merged_timings(results), summed_per_stage([r.unwritten for r in results])
        return self._make_run("gpu", ids, caps, timings, unwritten=unwritten, variants=dict(self.selected),
                              n_past=n_past, path=path_name(n_past, ubatch, len(ids)))  # fmt: skip

    @staticmethod
    def _capture(capture, **given) -> Capture:
        """The one capture policy of a run: `capture=`, or the separate arguments (not both)."""
        if capture is None:
            return Capture(**given)
        set_too = [k for k, v in given.items() if v is not None and not (k == "logits" and v == "all")]
        if set_too:
            raise InvalidArgumentError(f"give either capture= or {', '.join(set_too)}=, not both")
        return Capture.of(capture)

    def forget_last_pass(self) -> None:
        """The next run plans afresh instead of re-running the kept pass (timing a full pass)."""
        self._last_pass = None

    def step(self, prompt: Prompt):
        """A stepper over the GPU pass: st.next(), st.run_to(name), st.current, st[name]."""
        from labkit.gpu.stepper import Stepper

        ids = self.prompt_ids(prompt)
        return Stepper(self.executor, ids, self.executor.new_cache(len(ids)))

    def decode_step(self, prompt: Prompt, engine: str = "gpu") -> Run:
        """The prompt's last token as a KV-cached decode step: every stage captured, reading the cache
        the positions before it left (`run.n_past` of them). Its logits equal a prefill's last row;
        a decode-only fault (post-mortem sky-kaw's) shows here and not in `run`. `engine` "llamacpp":
        llama.cpp's own decode step, its tensors under labkit's names (the `oracle` extra)."""
        return generation.decode_step(self, prompt, engine)

    def run_batch(self, prompts: list[Prompt], names: list[str] | None = None, engine: str = "gpu") -> list[Run]:
        """Several sequences in one pass, packed on one token axis as engines batch them (labkit.batch):
        one Run per sequence, each holding what its own one-shot pass would (`run.path` "batch=N")."""
        return batch.run_batch(self, prompts, names, engine)

    def generate_batch(self, prompts: list[Prompt], max_new_tokens: int = 16, sampler: Sampler | None = None,
                       engine: str = "gpu") -> batch.BatchGeneration:  # fmt: skip
        """Continuous batching: the prompts in one pass, then one token for each live sequence per step,
        each on its own cache length; `timings["decode_s_per_step"]` is a step's time (the median)."""
        return batch.generate_batch(self, prompts, max_new_tokens, sampler, engine)

    def generate(self, prompt: Prompt, max_new_tokens: int = 16, sampler: Sampler | None = None) -> Generation:
        """KV-cached decode on the GPU: one prefill pass, then one pass per new token."""
        return generation.generate_gpu(self, prompt, max_new_tokens, sampler)

    def _generate_state(self, capacity: int):
        """The sequence state a generate runs on: the last generate's, rewound, when it has the same
        capacity (its compiled decode step then holds: compiling one plans three passes, 0.15 s of a
        24-token Gemma 3 270M decode), else a new one, the old one dropped first."""
        held = self._generate_held
        if held is not None and held.kv.capacity == capacity:
            held.kv.restart(self.executor.device)
            return held
        self._generate_held = None
        self._generate_held = self.executor.new_state(capacity)
        return self._generate_held

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Lab({self.name!r}: {c.arch}, {c.n_layers} layers, d={c.d_model}, heads {c.n_heads}/{c.n_kv_heads}"
            f"×{c.head_dim}, vocab {c.vocab_size})"
        )


def open(
    model: str | Path = DEFAULT_MODEL,
    variants: dict[str, str] | None = None,  # noqa: A001
    debug: bool = False,
    window_bytes: int | None = None,
    memory: int | float | str | None = None,
    kv_type: str | None = None,
    kv_type_k: str | None = None,
    kv_type_v: str | None = None,
) -> Lab:
    """Open a registered model name or a .gguf path. Reads the header only.

    memory: the budget for both engines' weights, caches and captures ("6GB", "512MB", bytes); by
    default a share of the memory free now. A pass over it is a MemoryBudgetError before any
    allocation, and the default capture keeps what fits (`lab.memory()` shows the plan).

    variants: {op family: variant} (see `lab.variants()`); debug: poison outputs before each
    pass and count unwritten elements; window_bytes: split GPU weights into row windows of at
    most this size (the binding limit otherwise), to make window edges visible on small models.

    kv_type: the KV cache's type for K and V (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, as
    llama.cpp's --cache-type-k/-v); kv_type_k, kv_type_v: for one of them. f32 by default."""
    types = cache_types(kv_type, kv_type_k, kv_type_v)  # an unknown type is refused before the file is read
    name, path = resolve_model(model)
    return Lab(name, path, variants=variants, debug=debug, window_bytes=window_bytes, memory=memory, kv_types=types)


def load_run(path: str | Path, model: Lab | str | Path | None = None) -> Run:
    """The Run saved at `path` (run.save). `model` (an open Lab or a model name) gives token pieces
    for the widgets; without it the saved model is opened by name the first time a piece is needed."""
    run = captures.load_run(path)
    run.piece = _lazy_piece(model if model is not None else run.model)
    return run


def _lazy_piece(model: Lab | str | Path) -> Callable[[int], str]:
    """A token-id → text function that opens the model's tokenizer on first use (or shows the id
    when the model cannot be opened here)."""
    held: dict[str, Callable[[int], str]] = {}

    def piece(token_id: int) -> str:
        if "fn" not in held:
            try:
                held["fn"] = (model if isinstance(model, Lab) else open(model)).piece
            except LabkitError:  # a run from a model this machine lacks still opens
                held["fn"] = lambda i: f"<{i}>"
        return held["fn"](token_id)

    return piece
