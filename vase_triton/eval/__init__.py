"""Reasoning-benchmark harness: `vase-triton eval`.

One role per module: `tasks` (problems from the hub, JSONL files or the testbed),
`prompting` (chat template, thinking mode), `extraction` (final answers), `grading`
(math-verify with a string fallback and a timeout), `runner` (batched, seeded,
resumable generation into `results.jsonl`), `summary` (tables and plots).
"""
