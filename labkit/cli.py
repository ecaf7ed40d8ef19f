"""The `labkit` command. Every LabkitError (and every usage error) becomes one `labkit: error: ...`
line and exit 1; any other exception one `labkit: error: internal error: ...` line and exit 3
(LABKIT_TRACEBACK=1 shows its traceback instead)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext

from labkit import progress
from labkit.cli_args import (
    EXIT_ERROR,
    CliParser,
    add_kv_type_args,
    count_arg,
    emit,
    fail,
    kv_types,
    lengths_arg,
    names_arg,
    parse_variants,
    selection,
    token_list,
)
from labkit.errors import (
    InvalidArgumentError,
    LabkitError,
    ToolNotFoundError,
    UnknownStageError,
)

EXIT_INTERNAL = 3


def cmd_models(args: argparse.Namespace) -> int:
    from labkit.model.registry import DEFAULT_MODEL, MODELS, resolve_model

    if args.fetch:  # locate every model now (Gemma's wheel joins its chunks once, into ~/.cache)
        for name in MODELS:
            print(f"{name}: {resolve_model(name)[1]}", file=sys.stderr)

    data = [
        {
            "name": m.name,
            "package": m.package,
            "description": m.description,
            "default": m.name == DEFAULT_MODEL,
        }
        for m in MODELS.values()
    ]
    emit(
        args,
        data,
        lambda: "\n".join(
            f"{d['name']:14} {'(default) ' if d['default'] else ''}{d['description']}  [pip: {d['package']}]"
            for d in data
        ),
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from labkit.gpu.device import describe

    if args.model is None:
        data = describe()
        emit(args, data, lambda: "\n".join(f"{k}: {v}" for k, v in data.items()))
        return 0
    import labkit

    lab = labkit.open(args.model, memory=args.memory, **kv_types(args))
    plan = lab.memory(tokens=args.tokens)
    tensors = model_tensors(lab)
    data = {"model": lab.name, "adapter": describe(), "tensors": tensors, "memory": plan.rows(),
            "memory_total": plan.total(), "budget": plan.budget.nbytes, "fits": plan.fits}  # fmt: skip

    def text() -> str:
        lines = [repr(lab), f"{'tensor':32} {'type':6} {'shape':>16}  read by"]
        lines += [f"{t['name']:32} {t['type']:6} {str(t['shape']):>16}  {t['kernel']}" for t in tensors]
        return "\n".join([*lines, "", plan.table()])

    emit(args, data, text)
    return 0


def model_tensors(lab) -> list[dict]:
    """Each tensor of the file with its type, shape, and the kernel (family/variant) that reads it."""
    readers: dict[str, str] = {}
    for st in lab.graph:
        for role, n in st.tensors.items():
            own = role in ("weight", "sinks") or (role == "bias" and st.op not in ("matmul", "moe_matmul"))
            if own:  # read by the stage's own kernel (a conv's bias, a router's selection bias too)
                c = lab.executor.choice(st)
                readers.setdefault(n, f"{c.family}/{c.kernel.name}" + ("" if role == "weight" else f" ({role})"))
            else:  # added or multiplied after the product
                op = {"bias": "add_id" if st.op == "moe_matmul" else "add", "weight_scale": "mul"}[role]
                readers.setdefault(n, f"{op}/default ({role})")
    return [
        {"name": n, "type": t.type_name, "shape": list(t.shape), "bytes": t.nbytes, "kernel": readers.get(n, "unused")}
        for n, t in lab.gguf.tensors.items()
    ]


def cmd_run(args: argparse.Namespace) -> int:
    import labkit
    from labkit.sampling import Sampler

    lab = labkit.open(args.model, variants=selection(args), **kv_types(args))
    sampler = Sampler(temperature=args.temperature, top_k=args.top_k_sampling, top_p=args.top_p, seed=args.seed)
    if args.engine == "reference":
        run = lab.reference(args.prompt, names=["logits"])
        gen = lab.generate_reference(args.prompt, args.max_new_tokens, sampler) if args.max_new_tokens else None
    else:
        run = lab.run(args.prompt, names=["logits"])
        gen = lab.generate(args.prompt, args.max_new_tokens, sampler) if args.max_new_tokens else None
    top = [{"id": t.id, "piece": t.piece, "logit": t.logit, "prob": t.prob} for t in run.top(args.top)]
    timings = dict(run.timings, load_s=lab.load_seconds)
    if gen:
        timings.update({"generate_" + k: v for k, v in gen.timings.items()})
    data = {
        "model": lab.name,
        "engine": args.engine,
        "tokens": run.tokens,
        "top": top,
        "generated": {"ids": gen.ids if gen else [], "text": gen.text if gen else ""},
        "timings": timings,
        "variants": lab.selected,
    }

    def text() -> str:
        lines = [f"{lab.name} [{args.engine}] tokens={run.tokens}"]
        lines += [f"  {t['id']:>7} {t['piece']!r:20} logit={t['logit']:8.3f} p={t['prob']:.4f}" for t in top]
        if gen:
            lines.append(f"generated: {gen.text!r}")
        return "\n".join(lines)

    emit(args, data, text)
    return 0


def _subject(args: argparse.Namespace):
    """The lab, and the run a compare or repro is about: dumps, the GPU, the reference or llama.cpp."""
    import labkit

    lab = labkit.open(args.model, variants=selection(args), **kv_types(args))
    given = args.prompt is not None or args.tokens is not None  # dumps may hold their ids (SGLang, TensorRT-LLM)
    ids = lab.prompt_ids(args.prompt if args.prompt is not None else token_list(args.tokens)) if given else None
    if args.dumps:
        names = names_arg(args.names)
        return lab, labkit.load_dumps(args.dumps, lab, names=names, layout=args.layout, tokens=ids,
                                      precision=args.precision, step=args.step)  # fmt: skip
    if ids is None:
        raise InvalidArgumentError("give --prompt TEXT or --tokens IDS")
    runs = {"reference": lab.reference, "llamacpp": lab.oracle, "gpu": lab.run}
    return lab, runs[args.engine](ids)


def cmd_compare(args: argparse.Namespace) -> int:
    import labkit

    lab, a = _subject(args)
    if args.local:
        return _attribute(args, lab, a)
    if args.against == "llamacpp":
        cmp = labkit.compare(a, lab.oracle(a.tokens))
    else:  # each stage over the table asked its own error first (labkit.attribution.verdict)
        cmp = labkit.verdict(a, lab) if not a.n_past else labkit.compare(a, lab.reference(a.tokens))
    data = cmp.to_dict()
    if args.dumps:
        data["unmapped"] = a.unmapped

    def text() -> str:
        out = cmp.table(only_failed=args.failed)
        if cmp.logits is not None:
            out += "\n" + cmp.logits.text()
        if args.dumps and a.unmapped:
            out += f"\nunmapped dumps ({len(a.unmapped)}): " + ", ".join(list(a.unmapped)[:8])
        return out

    emit(args, data, text)
    return 0 if cmp.passed else 1


def _attribute(args: argparse.Namespace, lab, run) -> int:
    """compare --local: each stage's own error; --json writes one JSON record per stage (JSONL)."""
    import labkit

    att = labkit.attribute(run, lab)
    if args.json:
        print(att.to_jsonl())
    else:
        print(att.table(only_guilty=args.failed))
    return 0 if not att.guilty else 1


def cmd_repro(args: argparse.Namespace) -> int:
    import labkit

    lab, run = _subject(args)
    att = labkit.attribute(run, lab)
    stage = args.stage or att.first_guilty
    if stage is None:
        raise InvalidArgumentError(f"no guilty stage in this {run.engine} run: give --stage NAME to write one anyway")
    try:
        att.row(stage)
    except KeyError:
        raise UnknownStageError(f"--stage {stage}: not a stage this run captured whole") from None
    rep = att.repro(stage, args.out)
    data = {"directory": str(rep.directory), "files": list(rep.files), "stage": rep.stage, "guilty": rep.guilty,
            "headline": att.headline()}  # fmt: skip
    emit(args, data, lambda: f"{att.headline()}\nreproducer of {rep.stage} in {rep.directory}: " + ", ".join(rep.files))
    return 0


def cmd_diff_weights(args: argparse.Namespace) -> int:
    from labkit.model.weights_diff import diff_weights

    diff = diff_weights(args.a, args.b)
    emit(args, diff.to_dict(), diff.table)
    return 0 if diff.identical else 1


def cmd_cases(args: argparse.Namespace) -> int:
    from labkit.casebook import cases

    data = [
        {"name": c.name, "postmortem": c.postmortem, "model": c.model, "title": c.title, "fault": c.fault}
        for c in cases()
    ]
    line = "{name:20} {pm:3}  {model:14} {title}"
    emit(args, data, lambda: "\n".join(line.format(pm=d["postmortem"] or "-", **d) for d in data))
    return 0


def cmd_case(args: argparse.Namespace) -> int:
    from labkit.casebook import run_case

    if args.blind:
        return _blind(args)
    if args.name is None:
        raise InvalidArgumentError("give a case name (labkit cases lists them), or --blind")
    report = run_case(args.name)
    emit(args, report.to_dict(), report.text)
    return 0 if report.passed else 1


def _blind(args: argparse.Namespace) -> int:
    """`labkit case --blind`: the symptoms; with --answer, the verdict (exit 1 when wrong)."""
    import labkit
    from labkit.casebook.blind import blind_case

    kv = kv_types(args)  # on a cache of another type, the faults of its write are drawn too
    lab = labkit.open(args.model, **kv) if any(kv.values()) else None
    data, text, right = blind_case(args.model, args.seed, lab=lab).session(args.answer, args.reveal)
    emit(args, data, lambda: text)
    return 0 if right else 1


def cmd_variants(args: argparse.Namespace) -> int:
    from labkit.ops.registry import describe, variants

    data = {fam: {name: describe(fam, name) for name in names} for fam, names in variants().items()}
    emit(
        args,
        data,
        lambda: "\n".join(f"{fam:14} {name:22} {doc}" for fam, vs in data.items() for name, doc in vs.items()),
    )
    return 0


def cmd_paths(args: argparse.Namespace) -> int:
    """The prompt through each serving path, each against the one-shot pass (labkit.serving_paths);
    exit 1 when a path leaves its band."""
    import labkit
    from labkit.serving_paths import paths

    lab = labkit.open(args.model, variants=selection(args), **kv_types(args))
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    prompt = args.prompt if args.prompt is not None else token_list(args.tokens)
    report = paths(lab, prompt, [p for p in args.paths.split(",") if p.strip()], engines=engines)
    emit(args, report.to_dict(), report.table)
    return 0 if all(c.in_band for c in report.checks) else EXIT_ERROR


def cmd_bench(args: argparse.Namespace) -> int:
    from labkit.bench import run_bench

    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    bad = [e for e in engines if e not in ("gpu", "reference", "llamacpp", "llamacpp-vulkan")]
    if bad:
        raise InvalidArgumentError(f"unknown engine {bad[0]!r}; engines: gpu, reference, llamacpp, llamacpp-vulkan")
    res = run_bench(args.model, args.lengths, args.repeats, args.decode_tokens, quiet=args.json, engines=engines,
                    memory=args.memory, variants=parse_variants(args.variant), batch=args.batch)  # fmt: skip
    emit(args, res.to_dict(), res.table)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from labkit.sweeps import parse_selection, read_prompts, sweep, throughput

    prompts = read_prompts(args.prompts)
    selections = [parse_selection(v) for v in args.variant] or [{}]
    df = sweep(args.models, prompts, selections, args.against, scheduler=args.scheduler, out=args.out,
               progress=not args.json, n_workers=args.workers)  # fmt: skip
    rate = throughput(df)
    data = {"config": df.attrs["labkit.sweep"], "throughput": rate, "rows": json.loads(df.to_json(orient="records"))}
    cols = ["model", "n_tokens", "variants", "first_divergence", "first_divergence_position", "top1_agree", "error"]

    def text() -> str:
        table = df[[c for c in cols if c in df]].to_string(index=False, max_colwidth=40)
        saved = f"\nsaved to {args.out}" if args.out else ""
        pace = f"{rate['tasks_per_min']:.1f} per minute, {100 * rate['open_share']:.0f}% of task time opening labs"
        return f"{table}\n{int(rate['tasks'])} pass pairs on {int(rate['workers'])} worker(s): {pace}{saved}"

    emit(args, data, text)
    return 0


def cmd_reduce(args: argparse.Namespace) -> int:
    from labkit.sweeps import parse_selection, reduce_prompt

    prompt = token_list(args.tokens) if args.tokens else args.prompt
    if prompt is None:
        raise InvalidArgumentError("give --prompt TEXT or --tokens IDS")
    sel = parse_selection(",".join(args.variant)) if args.variant else {}
    red = reduce_prompt(args.model, prompt, sel, args.against, scheduler=args.scheduler, n_workers=args.workers)
    emit(args, {k: v for k, v in vars(red).items()}, red.summary)
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    nb = root / "notebooks" / "01_walkthrough.ipynb"
    beside = Path(sys.executable).with_name("jupyter")  # the venv's own, even when it is not on PATH
    exe = str(beside) if beside.exists() else shutil.which("jupyter")
    if exe is None:
        raise ToolNotFoundError("`jupyter` is not on PATH: install JupyterLab (pip install jupyterlab)")
    cmd = [exe, "lab", f"--ServerApp.root_dir={root}", str(nb.relative_to(root))]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # JupyterLab refuses to start as root otherwise (containers, CI)
    cmd += args.extra
    try:
        os.execv(exe, cmd)
    except OSError as e:
        raise ToolNotFoundError(f"cannot start {exe}: {e.strerror or e}") from None
    return 0


MEMORY_HELP = "memory budget for weights, caches and captures, e.g. 6GB (default: 80%% of what is free)"
WGSL_HELP = "register the WGSL in FILE as variant NAME of op family OP and select it (repeatable)"
VARIANT_HELP = "select variant NAME of family OP for every layer, or of one layer as blk.L.OP (repeatable)"


def _subject_args(s: argparse.ArgumentParser) -> None:
    """The options that choose the run compare and repro are about (labkit.cli._subject)."""
    s.add_argument("--engine", choices=["gpu", "reference", "llamacpp"], default="gpu")
    s.add_argument("--dumps", metavar="PATH", help="another engine's tensors: .npz, .safetensors, .pt or a folder")
    s.add_argument("--names", default="auto", metavar="PRESET|MAP.json",
                   help="llamacpp, hf, transformerlens, sglang, trtllm, auto, or JSON {their name: stage}")  # fmt: skip
    s.add_argument("--layout", default="auto", help="auto, or one layout for every dumped tensor (thd, bhqk, ...)")
    s.add_argument("--precision", default=None, help="what the dumping engine computed in (default: --names/dtype)")
    s.add_argument("--step", type=int, default=None,
                   help="which forward pass of a dump folder holding several (0: the first)")  # fmt: skip
    s.add_argument("--variant", action="append", metavar="OP=NAME", help=VARIANT_HELP)
    s.add_argument("--wgsl", action="append", metavar="OP=NAME=FILE", help=WGSL_HELP)
    add_kv_type_args(s)


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(prog="labkit", description="A lab for LLM inference on WebGPU")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=CliParser)

    s = sub.add_parser("models", help="list the registered models")
    s.add_argument("--fetch", action="store_true", help="locate (and assemble) every model file first")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_models)

    s = sub.add_parser("info", help="the WebGPU adapter and limits; with MODEL its tensors, kernels and memory plan")
    s.add_argument("model", nargs="?", help="a registered model or a .gguf path")
    s.add_argument("--tokens", type=count_arg, default=128, help="tokens of the pass the memory plan is for")
    s.add_argument("--memory", help=MEMORY_HELP)
    add_kv_type_args(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_info)

    s = sub.add_parser("run", help="run a prompt; print the top tokens (and a continuation)")
    s.add_argument("model")
    s.add_argument("--prompt", required=True)
    s.add_argument("--engine", choices=["gpu", "reference"], default="gpu")
    s.add_argument("--top", type=count_arg, default=5)
    s.add_argument("--max-new-tokens", type=count_arg, default=0)
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--top-k-sampling", type=count_arg, default=0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--variant", action="append", metavar="OP=NAME", help=VARIANT_HELP)
    s.add_argument("--wgsl", action="append", metavar="OP=NAME=FILE", help=WGSL_HELP)
    add_kv_type_args(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("compare", help="per-stage comparison against a reference (a run, or another engine's dumps)")
    s.add_argument("model")
    given = s.add_mutually_exclusive_group()  # one of them, unless --dumps hold the ids
    given.add_argument("--prompt")
    given.add_argument("--tokens", metavar="IDS", help="comma-separated token ids, e.g. 2,818,2258")
    s.add_argument("--against", choices=["reference", "llamacpp"], default="reference")
    _subject_args(s)
    s.add_argument("--local", action="store_true", help="each stage's own error against its noise band (attribute)")
    s.add_argument("--failed", action="store_true", help="show only failing (with --local: guilty) stages")
    s.add_argument("--json", action="store_true", help="JSON (with --local: one JSON record per stage, JSONL)")
    s.set_defaults(fn=cmd_compare)

    s = sub.add_parser("repro", help="a standalone reproducer of the first guilty stage (or --stage)")
    s.add_argument("model")
    given = s.add_mutually_exclusive_group()  # one of them, unless --dumps hold the ids
    given.add_argument("--prompt")
    given.add_argument("--tokens", metavar="IDS", help="comma-separated token ids, e.g. 2,818,2258")
    _subject_args(s)
    s.add_argument("--stage", help="the stage to reproduce (default: the first guilty one)")
    s.add_argument("--out", required=True, metavar="DIR", help="a new directory")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_repro)

    s = sub.add_parser("diff-weights", help="two GGUF files, tensor by tensor (exit 1 when they differ)")
    s.add_argument("a", metavar="A.gguf")
    s.add_argument("b", metavar="B.gguf")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_diff_weights)

    s = sub.add_parser("sweep", help="prompts x variant selections x models on Dask, one row per pass pair")
    s.add_argument("models", nargs="+", metavar="MODEL")
    s.add_argument("--prompts", required=True, metavar="FILE", help=".txt (one per line) or .jsonl")
    s.add_argument("--variant", action="append", default=[], metavar="OP=NAME[,OP=NAME]",
                   help="one selection to sweep (repeat for more; commas join ops into one)")  # fmt: skip
    s.add_argument("--against", choices=["reference", "llamacpp", "default"], default="reference")
    s.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="a running Dask scheduler (default: local)")
    s.add_argument("--workers", type=count_arg, default=None, help="local worker processes (default: one per core)")
    s.add_argument("--out", metavar="RESULTS.parquet")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("reduce", help="the shortest prompt that still diverges at the same stage kind (ddmin)")
    s.add_argument("model")
    s.add_argument("--prompt")
    s.add_argument("--tokens", help="comma-separated token ids instead of --prompt")
    s.add_argument("--variant", action="append", default=[], metavar="OP=NAME[,OP=NAME]")
    s.add_argument("--against", choices=["reference", "llamacpp", "default"], default="reference")
    s.add_argument("--scheduler", metavar="tcp://HOST:PORT")
    s.add_argument("--workers", type=count_arg, default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_reduce)

    s = sub.add_parser("cases", help="list the post-mortem cases")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_cases)

    s = sub.add_parser("case", help="reproduce a post-mortem: fault, symptoms, localization, fix, checklist")
    s.add_argument("name", nargs="?", help="a case of `labkit cases` (none with --blind)")
    s.add_argument("--blind", action="store_true", help="a hidden faulty variant: symptoms only; find the stage")
    s.add_argument("--model", default="smollm2-135m", help="with --blind: the model")
    s.add_argument("--seed", type=int, default=0, help="with --blind: which hidden fault")
    s.add_argument("--answer", nargs=2, metavar=("STAGE", "FAMILY"), help="with --blind: check an answer")
    s.add_argument("--reveal", action="store_true", help="with --blind: show the worked answer")
    add_kv_type_args(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_case)

    s = sub.add_parser("variants", help="every family's variants: kernels, policies, samplers (default = correct)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_variants)

    s = sub.add_parser("paths", help="a prompt through serving paths (micro-batches, a prefix cache, a verifier, "
                       "a batch) vs the one-shot pass, stage by stage; which kernels are batch invariant")  # fmt: skip
    s.add_argument("model")
    given = s.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt")
    given.add_argument("--tokens", metavar="IDS", help="comma-separated token ids instead of a prompt")
    s.add_argument("--paths", default="ubatch=7,prefix=5,verify=4",
                   help="comma-separated ubatch=N, prefix=N, verify=N, batch=N (the prompt packed after N - 1 "
                        "others), kv=TYPE (a KV-cache type)")  # fmt: skip
    s.add_argument("--engines", default="gpu,reference",
                   help="gpu, reference, llamacpp (llama.cpp computing the same path: the oracle extra)")  # fmt: skip
    s.add_argument("--variant", action="append", metavar="OP=NAME", help=VARIANT_HELP)
    s.add_argument("--wgsl", action="append", metavar="OP=NAME=FILE", help=WGSL_HELP)
    add_kv_type_args(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_paths)

    s = sub.add_parser("bench", help="prefill per prompt length, decode, re-run, memory: GPU, reference, llama.cpp")
    s.add_argument("model", nargs="?", default="gemma3-270m")
    s.add_argument("--lengths", type=lengths_arg, default=(8, 128), help="prompt lengths in tokens (default 8,128)")
    s.add_argument("--repeats", type=count_arg, default=3, help="runs per figure after a warm-up (median)")
    s.add_argument("--decode-tokens", type=count_arg, default=32)
    s.add_argument(
        "--engines",
        default="gpu,reference,llamacpp",
        help="gpu, reference, llamacpp, llamacpp-vulkan (llama.cpp's Vulkan backend: make peer-vulkan)",
    )
    s.add_argument("--memory", help=MEMORY_HELP)
    s.add_argument("--variant", action="append", metavar="OP=NAME", help="the GPU engine's kernels: " + VARIANT_HELP)
    s.add_argument("--batch", type=count_arg, metavar="N", help="also a decode step of N sequences against one's")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("lab", help="start JupyterLab on the walkthrough notebook (other options go to JupyterLab)")
    s.set_defaults(fn=cmd_lab, extra=[])
    return p


def _no_bars(args: argparse.Namespace) -> bool:
    """Progress bars only where someone watches: not under --json (stdout is the JSON alone, stderr
    stays empty) and not when stderr is a pipe or a file (a log, a test: errors stay one line)."""
    tty = getattr(sys.stderr, "isatty", None)
    return bool(getattr(args, "json", False)) or not (tty and tty())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.cmd == "lab":
        args.extra = unknown  # JupyterLab's own options, passed through
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        with progress.quiet() if _no_bars(args) else nullcontext():
            return args.fn(args)
    except LabkitError as e:
        fail(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        fail("interrupted")
        return EXIT_ERROR
    except Exception as e:
        if os.environ.get("LABKIT_TRACEBACK") == "1":
            raise
        fail(f"internal error: {type(e).__name__}: {e} (set LABKIT_TRACEBACK=1 for the traceback)")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
