"""Reasoning-benchmark harness: `vase-triton eval`.

One role per module: `tasks` (problems from the hub, JSONL files or the testbed),
`prompting` (chat template, thinking mode), `extraction` (final answers), `grading`
(a string match, then math-verify), `verifier` (math-verify in a child process killed
at its timeout), `runner` (batched, seeded, resumable generation into `results.jsonl`),
`summary` (tables and plots).
"""
