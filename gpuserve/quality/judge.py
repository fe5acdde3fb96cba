"""Judge a quality run against its checkpoint's reference and the profile's thresholds.

Each metric becomes a :class:`Finding` (metric, value, threshold, passed); the verdict
fails when any finding fails, and its first line names the metric, value, threshold and
reference, the way a failed gate reads. A run with no reference is judged on sanity
only (and may become the reference). Definitions: docs/quality.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gpuserve.launch.quality_spec import QualitySpec
from gpuserve.quality import metrics
from gpuserve.quality.prompts import answer_value
from gpuserve.quality.record import PromptResult, QualityRun

#: tokens per verify step at or below which a draft counts as accepting nothing
ACCEPT_NONE = 1.05


@dataclass(frozen=True)
class Finding:
    metric: str
    value: float
    threshold: float | None
    passed: bool
    detail: str = ""

    def line(self) -> str:
        op = "" if self.threshold is None else f" (limit {_fmt(self.threshold)})"
        return f"{self.metric} {_fmt(self.value)}{op}{': ' + self.detail if self.detail else ''}"


def _fmt(v: float) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _by_id(run: QualityRun) -> dict[str, PromptResult]:
    return {p.id: p for p in run.prompts}


def sanity(run: QualityRun, ref: QualityRun | None, spec: QualitySpec) -> list[Finding]:
    """Request errors, non-finite logprobs, empty output, bad finish reasons and
    repetition loops (a loop only counts where the reference's reply has none)."""
    refs = _by_id(ref) if ref else {}
    errors = [p for p in run.prompts if p.error]
    nonfin = sum(p.non_finite for p in run.prompts)
    first = next((p for p in run.prompts if p.non_finite), None)
    empty = [p for p in run.prompts if not p.error and p.completion_tokens == 0
             and (p.id not in refs or refs[p.id].completion_tokens > 0)]
    bad_finish = [p for p in run.prompts if not p.error and p.finish not in metrics.GOOD_FINISH]
    loops = [p for p in run.prompts if not p.error and metrics.repetition_loop(p.output_ids)
             and not (p.id in refs and metrics.repetition_loop(refs[p.id].output_ids))]
    where = (f"first in {first.id} at token {first.first_non_finite}"
             if first and first.first_non_finite is not None else
             (f"first in {first.id}" if first else ""))
    return [
        Finding("request_errors", len(errors), 0, not errors,
                f"{errors[0].id}: {errors[0].error}" if errors else ""),
        Finding("non_finite_logprobs", nonfin, spec.max_non_finite, nonfin <= spec.max_non_finite,
                where),
        Finding("empty_outputs", len(empty), spec.max_empty, len(empty) <= spec.max_empty,
                ", ".join(p.id for p in empty[:3])),
        Finding("bad_finish_reasons", len(bad_finish), spec.max_bad_finish,
                len(bad_finish) <= spec.max_bad_finish,
                ", ".join(f"{p.id}: {p.finish}" for p in bad_finish[:3])),
        Finding("repetition_loops", len(loops), spec.max_loops, len(loops) <= spec.max_loops,
                ", ".join(p.id for p in loops[:3])),
    ]


def kld(run: QualityRun, ref: QualityRun, spec: QualitySpec) -> tuple[list[Finding], dict]:
    """Mean and p99 top-k KLD of the teacher-forced distributions on the reference's
    continuations, and greedy agreement of the first ``greedy_tokens`` tokens."""
    refs = _by_id(ref)
    pairs, greedy = [], []
    for p in run.prompts:
        r = refs.get(p.id)
        if p.kind != "completion" or r is None or p.error:
            continue
        mine = p.forced_top() + [None] * max(len(r.forced) - len(p.forced), 0)
        pairs += list(zip(r.forced_top(), mine[:len(r.forced)], strict=True))
        greedy.append((r.output_ids, p.output_ids))
    s = metrics.kld_summary(pairs)
    agree = metrics.greedy_agreement(greedy, spec.greedy_tokens)
    figures = {"kld_mean": s.mean, "kld_p99": s.p99, "kld_positions": s.positions,
               "greedy_agreement": agree}
    ok_mean = math.isfinite(s.mean) and s.mean <= spec.kld_mean_max
    ok_p99 = math.isfinite(s.p99) and s.p99 <= spec.kld_p99_max
    return [Finding("kld_mean", s.mean, spec.kld_mean_max, ok_mean, f"{s.positions} positions"),
            Finding("kld_p99", s.p99, spec.kld_p99_max, ok_p99),
            Finding("greedy_agreement", agree, spec.greedy_agreement_min,
                    math.isfinite(agree) and agree >= spec.greedy_agreement_min,
                    f"first {spec.greedy_tokens} tokens")], figures


def task_correct(p: PromptResult) -> bool:
    return not p.error and p.answer is not None and answer_value(p.text) == p.answer


def accuracy(run: QualityRun, ref: QualityRun | None, spec: QualitySpec
             ) -> tuple[list[Finding], dict]:
    """Per few-shot task: accuracy with its Wilson interval; against the reference, a
    drop fails only when it is both larger than ``accuracy_drop_max`` and significant
    (one-sided exact McNemar on the same questions, p < ``accuracy_alpha``)."""
    findings, figures = [], {}
    refs = _by_id(ref) if ref else {}
    for task in sorted({p.kind for p in run.prompts if p.kind != "completion"}):
        mine = [p for p in run.prompts if p.kind == task]
        k, n = sum(task_correct(p) for p in mine), len(mine)
        lo, hi = metrics.wilson_interval(k, n)
        figures[f"{task}_accuracy"] = k / n
        figures[f"{task}_ci"] = [round(lo, 4), round(hi, 4)]
        paired = [(task_correct(refs[p.id]), task_correct(p)) for p in mine if p.id in refs]
        if not paired:
            continue
        ref_acc = sum(r for r, _ in paired) / len(paired)
        new_acc = sum(c for _, c in paired) / len(paired)
        pval = metrics.mcnemar_drop_p([r for r, _ in paired], [c for _, c in paired])
        drop = ref_acc - new_acc
        figures[f"{task}_drop_p"] = pval
        failed = drop > spec.accuracy_drop_max and pval < spec.accuracy_alpha
        findings.append(Finding(f"{task}_accuracy", new_acc, ref_acc - spec.accuracy_drop_max,
                                not failed, f"reference {ref_acc:.3f}, 95% CI "
                                f"[{lo:.3f}, {hi:.3f}], drop p={pval:.2g}"))
    return findings, figures


def acceptance(run: QualityRun, ref: QualityRun | None, spec: QualitySpec
               ) -> tuple[list[Finding], dict]:
    """Speculative acceptance length (tokens per verify step) against the profile's
    ``expected_accept_length``, else the reference's own when it was speculative."""
    measured = metrics.acceptance_length((p.completion_tokens, p.verify_ct) for p in run.prompts)
    if measured is None:
        return [], {}
    expected = spec.expected_accept_length
    if expected is None and ref is not None:
        expected = metrics.acceptance_length((p.completion_tokens, p.verify_ct)
                                             for p in ref.prompts)
    figures = {"accept_length": measured}
    if expected is None:
        return [], figures
    # a draft that is never accepted gives exactly 1 token per verify step: always below
    limit = max(expected * spec.accept_length_min_ratio, min(ACCEPT_NONE, expected))
    return [Finding("spec_accept_length", measured, limit, measured >= limit,
                    f"expected {expected:.2f}: the draft model is "
                    + ("accepted" if measured >= limit else "rejected almost always"))], figures


def judge(run: QualityRun, ref: QualityRun | None, spec: QualitySpec,
          ref_name: str | None) -> dict:
    """Fill ``run.figures`` and ``run.verdict``; returns the verdict."""
    findings = sanity(run, ref, spec)
    figures: dict = {"elapsed_s": round(run.elapsed_s, 3)}
    if ref is not None:
        found, figs = kld(run, ref, spec)
        findings += found
        figures.update(figs)
    for part in (accuracy, acceptance):
        found, figs = part(run, ref, spec)
        findings += found
        figures.update(figs)
    failed = [f for f in findings if not f.passed]
    run.reference = ref_name
    run.figures = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                   for k, v in figures.items()}
    run.verdict = {"passed": not failed, "reference": ref_name,
                   "findings": [_clean(asdict(f)) for f in findings]}
    return run.verdict


def _clean(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in d.items()}


def failed_findings(verdict: dict) -> list[dict]:
    return [f for f in verdict.get("findings", []) if not f.get("passed")]


def verdict_lines(verdict: dict) -> list[str]:
    """``quality: FAILED kld_p99 1.83 > limit 0.25 (reference X)`` then one line per
    finding; a pass: one line with the headline figures."""
    ref = verdict.get("reference") or "none (sanity only)"
    bad = failed_findings(verdict)
    out = []
    for f in bad:
        value = f["value"] if f["value"] is not None else float("nan")
        out.append(Finding(f["metric"], value, f["threshold"], False, f["detail"]).line()
                   + f" [reference {ref}]")
    return out


def summary_line(run: QualityRun) -> str:
    """One line of figures for a person: KLD, greedy agreement, accuracy, acceptance."""
    f = run.figures
    parts = []
    if f.get("kld_mean") is not None:
        parts.append(f"KLD mean {f['kld_mean']:.4g} p99 {f.get('kld_p99') or float('nan'):.4g}")
    if f.get("greedy_agreement") is not None:
        parts.append(f"greedy agreement {f['greedy_agreement']:.2f}")
    for key in sorted(k for k in f if k.endswith("_accuracy")):
        lo, hi = f.get(key.replace("_accuracy", "_ci"), [0, 1])
        parts.append(f"{key.replace('_accuracy', '')} {f[key]:.2f} [{lo:.2f}, {hi:.2f}]")
    if f.get("accept_length") is not None:
        parts.append(f"accept length {f['accept_length']:.2f}")
    parts.append(f"{f.get('elapsed_s', 0):.1f} s")
    return ", ".join(parts)


def headline(findings: Sequence[dict]) -> str:
    return ", ".join(f["metric"] for f in findings)
