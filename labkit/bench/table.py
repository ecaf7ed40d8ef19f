"""The bench report as text: one table per figure kind, ratios last."""

from __future__ import annotations


def _s(v: float | None) -> str:
    return f"{v:9.3f}" if v is not None else f"{'n/a':>9}"


def render(report) -> str:
    r = report
    size = f" ({r.file_mb:.0f} MiB file)" if r.file_mb else ""
    lines = [
        f"{r.model}{size} on {r.adapter}, host CPU {r.cpu or 'unknown'}: medians of {r.repeats} runs after a warm-up"
    ]
    if r.variants:
        lines.append("GPU kernels selected: " + ", ".join(f"{k}={v}" for k, v in r.variants.items()))
    lines.append(f"{'engine':10} {'T':>5} {'logits all':>10} {'all stages':>10} {'last only':>10}  note")
    for name, eng in r.engines.items():
        for f in eng.lengths:
            last = _s(f.last_only_s)
            lines.append(
                f"{name:10} {f.length:5} {_s(f.logits_all_s):>10} {_s(f.all_stages_s):>10} {last:>10}  {f.note}"
            )
    lines.append(f"{'engine':10} {'load s':>8} {'decode tok/s':>13} {'re-run s':>9} {'peak RSS MB':>12}")
    for name, eng in r.engines.items():
        rss = f"{eng.peak_rss_mb:12.0f}" if eng.peak_rss_mb else f"{'':12}"
        dec = f"{eng.decode_tok_s:13.2f}" if eng.decode_tok_s else f"{'n/a':>13}"
        lines.append(f"{name:10} {eng.load_s:8.2f} {dec} {_s(eng.rerun_after_switch_s)} {rss}")
    for name, eng in r.engines.items():
        if eng.detail:
            lines.append(f"{name}: {eng.detail}")
    for name, eng in r.engines.items():
        if eng.host_ms_per_step is not None:
            how = "recorded while the step before ran" if eng.recorded_ahead else "recorded at its start"
            lines.append(f"{name} decode: {eng.host_ms_per_step:.2f} ms of host time per warm step (start to "
                         f"submit), {eng.dispatches_per_step:.0f} dispatches, {how}")  # fmt: skip
    if r.batch is not None:
        b = r.batch
        lines.append(f"gpu decode, a batch of {b.n}: {1e3 * b.step_s:.1f} ms a step ({b.dispatches:.0f} dispatches); "
                     f"one sequence {1e3 * b.batch1_step_s:.1f} ms a step by the same loop, "
                     f"{1e3 * b.one_step_s:.1f} ms by generate's rate (its compile included)")  # fmt: skip
    if r.op_families:
        lines.append(f"GPU time per op family, T={r.op_families_at}, every stage captured (timestamp queries):")
        lines += _families(r.op_families, gbps=False)
    if r.decode_op_families:
        head = f"wall time per op family, one decode step after {r.op_families_at} tokens, each family alone"
        lines.append(head + " (GB/s of GGUF bytes):")
        lines += _families(r.decode_op_families, gbps=True)
    lines += [f"{k}: {v:.2f}" for k, v in r.ratios().items()]
    return "\n".join(lines)


def _families(families, gbps: bool) -> list[str]:
    """One line per op family; a matmul's GFLOP/s, and its GB/s where each weight is read once a token."""
    out = []
    for o in families:
        extra = f"  {o.gflops:6.1f} GFLOP/s" if o.gflops else ""
        if o.gbps and gbps:
            extra += f"  {o.gbps:6.2f} GB/s"
        out.append(f"  {o.family:14} {o.ms:9.1f} ms  {o.dispatches:4} stages{extra}")
    return out
