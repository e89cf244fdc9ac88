"""Summarise `results.jsonl`: accuracy per task × policy × budget, as markdown, CSV and plots.

Accuracy is the mean over samples of each sample's accuracy over the task's problems,
± the standard error of that mean (sample standard deviation / sqrt(samples); with one
sample there is none: the table shows the mean alone, the CSV `nan`). The `average`
task is the mean over tasks of those accuracies (its error combines the tasks' errors in
quadrature). Output length is the mean number
of generated tokens (end-of-sequence included); no-answer rate is the share of samples
from which no answer could be extracted; tokens/s is generated tokens over the wall time
of the batches that produced them.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Optional, Sequence

from vase_triton.config import POLICIES

AVERAGE = "average"
SUMMARY_MARKDOWN, SUMMARY_CSV = "summary.md", "summary.csv"
ACCURACY_PLOT, LENGTH_PLOT = "accuracy.png", "length.png"


@dataclasses.dataclass(frozen=True)
class Cell:
    """Aggregated results of one task × policy × budget (`budget` None: full cache)."""

    task: str
    policy: str
    budget: Optional[int]
    problems: int
    samples: int
    accuracy: float
    stderr: float
    trace_exact: Optional[float]
    output_tokens: float
    no_answer_rate: float
    unfinished_rate: float
    tokens_per_s: float


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (NaN with fewer than two values)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def _cell(task: str, policy: str, budget: Optional[int], records: list[dict]) -> Cell:
    by_sample: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        by_sample[record["sample"]].append(record)
    accuracy, stderr = mean_and_stderr(
        [sum(r["correct"] for r in rows) / len(rows) for _, rows in sorted(by_sample.items())]
    )
    exact = [r["trace_exact"] for r in records if r.get("trace_exact") is not None]
    batch_seconds = {r["batch"]: r["seconds"] for r in records}  # a batch's rows may span samples: count it once
    tokens = sum(r["output_tokens"] for r in records)
    return Cell(
        task=task, policy=policy, budget=budget, problems=len({r["id"] for r in records}), samples=len(by_sample),
        accuracy=accuracy, stderr=stderr, trace_exact=sum(exact) / len(exact) if exact else None,
        output_tokens=tokens / len(records), no_answer_rate=sum(r["answer"] is None for r in records) / len(records),
        unfinished_rate=sum(not r["finished"] for r in records) / len(records),
        tokens_per_s=tokens / max(sum(batch_seconds.values()), 1e-9),
    )


def _average(cells: list[Cell], policy: str, budget: Optional[int]) -> Cell:
    count = len(cells)
    errors = [c.stderr for c in cells]
    exact = [c.trace_exact for c in cells if c.trace_exact is not None]
    return Cell(
        task=AVERAGE, policy=policy, budget=budget, problems=sum(c.problems for c in cells),
        samples=min(c.samples for c in cells), accuracy=sum(c.accuracy for c in cells) / count,
        stderr=math.sqrt(sum(e * e for e in errors)) / count,
        trace_exact=sum(exact) / len(exact) if len(exact) == count else None,
        output_tokens=sum(c.output_tokens for c in cells) / count,
        no_answer_rate=sum(c.no_answer_rate for c in cells) / count,
        unfinished_rate=sum(c.unfinished_rate for c in cells) / count,
        tokens_per_s=sum(c.tokens_per_s for c in cells) / count,
    )


def summarise(records: Iterable[dict]) -> list[Cell]:
    """One `Cell` per task × policy × budget present, then `average` cells when there are several tasks."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["task"], record["policy"], record["budget"])].append(record)
    cells = [_cell(task, policy, budget, rows) for (task, policy, budget), rows in groups.items()]
    tasks = sorted({c.task for c in cells})
    if len(tasks) > 1:
        for policy, budget in sorted({(c.policy, c.budget) for c in cells}, key=lambda pb: (pb[0], pb[1] or 0)):
            members = [c for c in cells if c.policy == policy and c.budget == budget]
            if len(members) == len(tasks):
                cells.append(_average(members, policy, budget))
    return cells


def _ordered(cells: list[Cell]) -> tuple[list[str], list[str], list[int]]:
    tasks = sorted({c.task for c in cells} - {AVERAGE}) + ([AVERAGE] if any(c.task == AVERAGE for c in cells) else [])
    seen_policies = {c.policy for c in cells}
    policies = [p for p in ("full", *(p for p in POLICIES if p != "full")) if p in seen_policies]
    budgets = sorted({c.budget for c in cells if c.budget is not None})
    return tasks, policies, budgets


def _percent(value: float, error: float = math.nan) -> str:
    if math.isnan(error):
        return f"{100 * value:.1f}"
    return f"{100 * value:.1f} ± {100 * error:.1f}"


def markdown_table(cells: list[Cell], metric: str, title: str) -> str:
    """A markdown table: rows task × policy, columns budgets; `full` shows its one value in every column.

    A run of `full` alone has no budgets: its table has one column, "no eviction".
    """
    tasks, policies, budgets = _ordered(cells)
    index = {(c.task, c.policy, c.budget): c for c in cells}
    columns: list[int | None] = list(budgets) if budgets else [None]
    headers = ["no eviction" if b is None else f"budget {b}" for b in columns]
    lines = [f"### {title}", "", "| task | policy | " + " | ".join(headers) + " |"]
    lines.append("|---|---|" + "---:|" * len(columns))
    for task in tasks:
        for policy in policies:
            row = []
            for budget in columns:
                cell = index.get((task, policy, None if policy == "full" else budget))
                row.append("" if cell is None else _format_metric(cell, metric))
            if any(row):
                label = "full (no eviction)" if policy == "full" else policy
                lines.append(f"| {task} | {label} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _format_metric(cell: Cell, metric: str) -> str:
    if metric == "accuracy":
        return _percent(cell.accuracy, cell.stderr)
    if metric == "trace_exact":
        return "" if cell.trace_exact is None else _percent(cell.trace_exact)
    if metric in ("no_answer_rate", "unfinished_rate"):
        return _percent(getattr(cell, metric))
    return f"{getattr(cell, metric):.1f}"


def write_markdown(cells: list[Cell], path: Path, header: str = "") -> None:
    sections = [f"# Evaluation summary\n\n{header}".rstrip() + "\n"]
    sections.append(markdown_table(cells, "accuracy", "Accuracy (%), mean ± standard error over samples"))
    if any(c.trace_exact is not None for c in cells):
        sections.append(markdown_table(cells, "trace_exact", "Whole-trace exact match (%)"))
    sections.append(markdown_table(cells, "output_tokens", "Mean output length (tokens)"))
    sections.append(markdown_table(cells, "no_answer_rate", "No answer extracted (%)"))
    sections.append(markdown_table(cells, "unfinished_rate", "Stopped at max-new-tokens (%)"))
    sections.append(markdown_table(cells, "tokens_per_s", "Generated tokens per second"))
    path.write_text("\n".join(sections), encoding="utf-8")


def write_csv(cells: list[Cell], path: Path) -> None:
    fields = [f.name for f in dataclasses.fields(Cell)]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for cell in cells:
            row = dataclasses.asdict(cell)
            row["budget"] = "full" if cell.budget is None else cell.budget
            writer.writerow(row)


def write_plot(cells: list[Cell], path: Path, metric: str, ylabel: str) -> None:
    """One panel per task: `metric` against budget, a line per policy, the full cache dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks, policies, budgets = _ordered(cells)
    index = {(c.task, c.policy, c.budget): c for c in cells}
    scale = 100.0 if metric == "accuracy" else 1.0
    figure, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for policy in policies:
            if policy == "full":
                cell = index.get((task, "full", None))
                if cell is not None:
                    axis.axhline(scale * getattr(cell, metric), color="black", linestyle="--", label="full")
                continue
            points = [(b, index[(task, policy, b)]) for b in budgets if (task, policy, b) in index]
            if not points:
                continue
            xs = [b for b, _ in points]
            ys = [scale * getattr(c, metric) for _, c in points]
            errors = [0.0 if math.isnan(c.stderr) else scale * c.stderr for _, c in points] if metric == "accuracy" else None
            axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=policy)
        axis.set_xscale("log", base=2)
        axis.set_xticks(budgets)
        axis.set_xticklabels([str(b) for b in budgets])
        axis.set_title(task)
        axis.set_xlabel("budget (tokens)")
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_summary(records: list[dict], out_dir: Path, header: str = "") -> tuple[list[Cell], list[str]]:
    """Write `summary.md` and `summary.csv` into `out_dir`, and `accuracy.png` and `length.png` when a
    policy ran at a budget (the plots are against budget). Returns the cells and the names written."""
    cells = summarise(records)
    if not cells:
        return cells, []
    out_dir = Path(out_dir)
    write_markdown(cells, out_dir / SUMMARY_MARKDOWN, header)
    write_csv(cells, out_dir / SUMMARY_CSV)
    written = [SUMMARY_MARKDOWN, SUMMARY_CSV]
    if any(c.budget is not None for c in cells):
        write_plot(cells, out_dir / ACCURACY_PLOT, "accuracy", "accuracy (%)")
        write_plot(cells, out_dir / LENGTH_PLOT, "output_tokens", "mean output tokens")
        written += [ACCURACY_PLOT, LENGTH_PLOT]
    else:  # plots of an earlier run into this directory would describe other policies
        for name in (ACCURACY_PLOT, LENGTH_PLOT):
            (out_dir / name).unlink(missing_ok=True)
    return cells, written
