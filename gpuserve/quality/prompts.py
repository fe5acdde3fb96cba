"""The quality check's prompt set: the shipped completion prompts, generated few-shot
arithmetic and a GSM8K test subset (gpuserve/data/quality/, licences in SOURCES.md),
plus any prompts a user adds; and the answer scoring of the few-shot tasks.

The few-shot GSM8K prompt and scoring follow SGLang's own accuracy check
(sgl-project/sglang ``python/sglang/test/few_shot_gsm8k.py``: ``get_one_example``
builds ``"Question: ...\\nAnswer:"`` blocks, ``get_answer_value`` takes the last
integer of the reply, stop at ``"Question"``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gpuserve import paths, safeload
from gpuserve.errors import InputError

DATA_DIR = paths.DATA_DIR / "quality"
PROMPTS_FILE = DATA_DIR / "prompts.yaml"
#: caps on what one check sends (the whole check is also capped in time on the host)
MAX_PROMPTS = 128
MAX_PROMPT_CHARS = 16_000


@dataclass(frozen=True)
class Prompt:
    """One request of the check: ``kind`` "completion" (greedy + teacher-forced) or a
    few-shot task name ("arithmetic", "gsm8k") scored against ``answer``."""

    id: str
    kind: str
    text: str
    max_new_tokens: int
    answer: str | None = None
    stop: tuple[str, ...] = ()


def arithmetic_items(count: int) -> list[tuple[str, int]]:
    """``count`` sums and differences from a fixed rule (operands 3..94, results 0..176):
    the same questions every time, no outside data."""
    items = []
    for i in range(count):
        a, b = (i * 37 + 11) % 90 + 5, (i * 53 + 7) % 80 + 3
        if i % 2:
            a, b = max(a, b), min(a, b)
            items.append((f"What is {a} - {b}?", a - b))
        else:
            items.append((f"What is {a} + {b}?", a + b))
    return items


def _arithmetic(count: int, shots: int) -> list[Prompt]:
    items = arithmetic_items(count + shots)
    head = "".join(f"Q: {q}\nA: The answer is {a} .\n\n" for q, a in items[:shots])
    return [Prompt(id=f"arithmetic-{i}", kind="arithmetic", text=f"{head}Q: {q}\nA:",
                   max_new_tokens=12, answer=str(a), stop=("\n",))
            for i, (q, a) in enumerate(items[shots:])]


def gsm8k_answer(solution: str) -> str:
    """The reference number of a GSM8K solution (after ``####``, commas removed)."""
    return solution.split("####")[-1].strip().replace(",", "")


def _gsm8k(file: Path, shots: int, max_new: int) -> list[Prompt]:
    rows = [json.loads(line) for line in safeload.read_text(file).splitlines() if line.strip()]
    head = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:shots])
    return [Prompt(id=f"gsm8k-{i}", kind="gsm8k",
                   text=f"{head}Question: {r['question']}\nAnswer:", max_new_tokens=max_new,
                   answer=gsm8k_answer(r["answer"]), stop=("Question",))
            for i, r in enumerate(rows[shots:])]


def answer_value(reply: str) -> str | None:
    """The last integer of a reply (``get_answer_value`` of SGLang's few-shot GSM8K),
    commas removed; None when there is none."""
    numbers = re.findall(r"-?\d+", reply.replace(",", ""))
    return str(int(numbers[-1])) if numbers else None


def _completion(texts: list, max_new: int, file: Path) -> list[Prompt]:
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text or len(text) > MAX_PROMPT_CHARS:
            raise InputError(file, f"completion[{i}]",
                             f"must be a non-empty string of at most {MAX_PROMPT_CHARS} chars")
        out.append(Prompt(id=f"completion-{i}", kind="completion", text=text,
                          max_new_tokens=max_new))
    return out


def load_prompts(max_new_tokens: int, file: Path = PROMPTS_FILE,
                 tasks: tuple[str, ...] = ("completion", "arithmetic", "gsm8k")) -> list[Prompt]:
    """The prompt set of ``file`` (the shipped one by default), ``tasks`` only; bad
    input is an InputError naming the file and field."""
    doc = safeload.load_yaml_file(file)
    if not isinstance(doc, dict):
        raise InputError(file, None, "must be a mapping with completion/arithmetic/gsm8k")
    prompts: list[Prompt] = []
    if "completion" in tasks:
        prompts += _completion(list(doc.get("completion") or []), max_new_tokens, file)
    arith = doc.get("arithmetic")
    if "arithmetic" in tasks and isinstance(arith, dict):
        prompts += _arithmetic(int(arith.get("count", 40)), int(arith.get("shots", 4)))
    gsm = doc.get("gsm8k")
    if "gsm8k" in tasks and isinstance(gsm, dict):
        prompts += _gsm8k(file.parent / str(gsm["file"]), int(gsm.get("shots", 5)),
                          int(gsm.get("max_new_tokens", 256)))
    if len(prompts) > MAX_PROMPTS:
        raise InputError(file, None, f"{len(prompts)} prompts, more than {MAX_PROMPTS}")
    return prompts
