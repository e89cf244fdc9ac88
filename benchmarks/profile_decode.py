"""Where a decode step's time goes, per end-to-end method: host against device, and the top kernels.

Each method of `bench_end_to_end.py`'s active profile is prepared as there (patched and
compiled as users run it, warmed up with `--warmup` tokens from the setting's warm-up
prompt: in a sampled setting near the longest, so the steps run near its longest length), then
decodes `--steps` steps twice: once timed by the `StepClock` (median wall time per step), once
under `torch.profiler`. Each pass starts from a prompt as long as the pass before it got, so no
step attends over a key length an earlier one decoded: a full cache's attention builds cuDNN
plans per key length on first sight, as every step of a real run does, and a pass over lengths
already seen would hide that cost. The table gives the median step, the device's busy time per
step (the kernels' own durations; CUDA only) and their ratio: a step far longer than its device
time is bound by the host (Python, launches, synchronisation), not by its kernels. On CUDA
it also counts the compiled graphs inductor left without CUDA graphs while the method ran
(its `cudagraph_skips` counter; the reason is in the `torch._inductor` warning log). Below
it, the kernels (and copies) with the most device time per step (on CPU, the operations with
the most CPU time).

    python -m benchmarks.profile_decode [--steps 64] [--warmup 8] [--methods hf-static,vase-2048] [--out DIR]

On CPU it runs the smoke setting: a check that the tool works, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch._dynamo.utils import counters
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule
from transformers import StoppingCriteria

from benchmarks.decoding import DecodeSetting, Method, StepClock, build_model, model_dtype, prepared, random_prompts
from vase_triton.commands.common import choice, comma_list, positive_int

TOP_OPERATIONS = 12


@dataclass(frozen=True)
class StepProfile:
    """One method's decode steps: median wall time, device busy time and the heaviest operations (seconds)."""

    method: str
    step_s: float
    device_s: Optional[float]
    operations: list[tuple[str, float, float]]  # name, seconds per step, calls per step; most time first
    cudagraph_skips: Optional[int] = None  # compiled graphs run without CUDA graphs (CUDA only)

    @property
    def busy_fraction(self) -> Optional[float]:
        return None if self.device_s is None else self.device_s / self.step_s


class ProfilerSteps(StoppingCriteria):
    """Ends a profiler region at every generated token; never stops generation."""

    def __init__(self, recorded: profile):
        self.recorded = recorded

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.recorded.step()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _device_time_us(event) -> float:
    """Self device time of a profiler average in µs (the attribute's name changed across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def step_costs(averages, steps: int, on_device: bool) -> tuple[Optional[float], list[tuple[str, float, float]]]:
    """(device busy seconds per step, or None on CPU; operations as (name, seconds per step, calls
    per step), most time first) of profiler averages over `steps` steps.

    On the device only what ran there counts (kernels, copies, fills): the profiler also credits
    a kernel's time to the CPU operation that launched it and to the annotations around it, so
    summing every event's device time would count each kernel two or three times.
    """
    if on_device:
        costs = [
            (event.key, _device_time_us(event), event.count)
            for event in averages
            if event.device_type != DeviceType.CPU and not getattr(event, "is_user_annotation", False)
        ]
    else:
        costs = [(event.key, float(event.self_cpu_time_total), event.count) for event in averages]
    costs = [(name, us, count) for name, us, count in costs if us > 0 and not name.startswith("ProfilerStep")]
    costs.sort(key=lambda item: item[1], reverse=True)
    device_s = sum(us for _, us, _ in costs) / 1e6 / steps if on_device else None
    return device_s, [(name, us / 1e6 / steps, count / steps) for name, us, count in costs]


def fitting_steps(setting: DecodeSetting, steps: int, warmup: int) -> int:
    """The most steps, up to `steps`, that `profile_method` can run after `warmup` tokens within the
    setting's length (a StaticCache holds no more); 0 where not one fits (`warmup` over `most_warmup`)."""
    spare = _room(setting) - _tokens_stored(0, warmup)  # each step adds one token to each pass
    return max(0, min(steps, spare // 2))


def most_warmup(setting: DecodeSetting) -> int:
    """The most warm-up tokens that leave room for two passes of one step."""
    return _room(setting) - _tokens_stored(1, 0)


def _tokens_stored(steps: int, warmup: int) -> int:
    """Tokens past the warm-up prompt in the last pass's cache: the warm-up's, then two passes of
    `steps + 2` tokens but the last one (a run's last token is not stored)."""
    return warmup + 2 * (steps + 2) - 1


def _room(setting: DecodeSetting) -> int:
    """Tokens the warm-up and the passes may add to the warm-up prompt within the setting's length."""
    return setting.prompt_tokens + setting.new_tokens - setting.warmup_prompt_tokens


def profile_method(model, method: Method, setting: DecodeSetting, device: torch.device, steps: int, warmup: int):
    """Median step and profiler averages of `steps` decode steps of `method` after `warmup` tokens.

    The warm-up, the timed pass and the profiled pass decode disjoint key lengths, in that order:
    each later pass starts from a prompt as long as the earlier ones' prompt and tokens together.
    """
    skips_before = counters["inductor"]["cudagraph_skips"]
    with prepared(model, method, setting, device, warmup=warmup) as ready:
        # The steps the profiler keeps below: decode steps 2 to steps + 1 (the first warms up).
        prompt_tokens = setting.warmup_prompt_tokens + warmup
        ready.inputs = random_prompts(model, setting.batch, prompt_tokens, device)
        clock = StepClock(prompt_tokens, (), ready.cache, device)
        ready.generate(model, steps + 2, stopping_criteria=[clock])
        step_s = statistics.median(clock.seconds_between_stamps()[1:])
        ready.empty_cache(model)
        ready.inputs = random_prompts(model, setting.batch, prompt_tokens + steps + 2, device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        # Regions end at each new token: the prefill's is skipped, one decode step warms up, `steps` are kept.
        with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=steps, repeat=1)) as recorded:
            ready.generate(model, steps + 2, stopping_criteria=[ProfilerSteps(recorded)])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    device_s, operations = step_costs(recorded.key_averages(), steps, on_device=device.type == "cuda")
    skips = counters["inductor"]["cudagraph_skips"] - skips_before if device.type == "cuda" else None
    return StepProfile(method.name, step_s, device_s, operations, skips)


def default_order(methods: Sequence[Method]) -> list[Method]:
    """VaSE's methods first, then the uncompiled full cache, SDPA's default backends (whose
    per-length cuDNN plans a profile is to show) before a limited choice: a run cut short still
    profiles them; the compiled StaticCache, slowest to prepare, comes last."""
    rank = {"vase": 0, "dynamic": 1, "static": 2}
    return sorted(methods, key=lambda method: (rank[method.cache], method.sdpa_backends is not None))


def render(results: Sequence[StepProfile], setting: DecodeSetting, device: torch.device, steps: int) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke: not a measurement)"
    lines = [
        f"# Decode step profile: {setting.name}, {steps} steps, {where}",
        "",
        "| method | median step | device busy per step | busy / step | graphs run without CUDA graphs |",
        "|---|---:|---:|---:|---:|",
    ]
    for result in results:
        busy = "—" if result.device_s is None else f"{result.device_s * 1e3:.3f} ms"
        fraction = "—" if result.busy_fraction is None else f"{result.busy_fraction:.0%}"
        skips = "—" if result.cudagraph_skips is None else str(result.cudagraph_skips)
        lines.append(f"| {result.method} | {result.step_s * 1e3:.3f} ms | {busy} | {fraction} | {skips} |")
    unit = "device" if device.type == "cuda" else "CPU"
    for result in results:
        lines += ["", f"## {result.method}: most {unit} time per step", "", "| operation | per step | calls |",
                  "|---|---:|---:|"]  # fmt: skip
        lines += [
            f"| `{name[:90]}` | {seconds * 1e6:.1f} µs | {calls:g} |"
            for name, seconds, calls in result.operations[:TOP_OPERATIONS]
        ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    try:  # the suite reads its VASE_BENCH_* variables as it loads
        from benchmarks.bench_end_to_end import METHODS, SETTING
    except ValueError as error:
        parser.error(str(error))
    known = {method.name: method for method in METHODS}
    parser.add_argument("--steps", type=positive_int, default=64, help="decode steps timed and profiled (default 64)")
    parser.add_argument("--warmup", type=positive_int, default=8, help="tokens generated before (default 8)")
    parser.add_argument(
        "--methods", type=comma_list(choice(tuple(known)), ", ".join(known)),
        help="comma-separated method names (default: all of the profile, VaSE's first)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write profile.md here")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out: expected a directory; {args.out} is a file")
    methods = [known[name] for name in args.methods] if args.methods else default_order(METHODS)

    steps = fitting_steps(SETTING, args.steps, args.warmup)
    if steps == 0:
        parser.error(f"--warmup: expected at most {most_warmup(SETTING)} tokens in this profile (it leaves room "
                     f"for two passes of one step); got {args.warmup}")  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        os.environ["VASE_BACKEND"] = "torch"  # as the end-to-end suite on CPU
    try:
        model = build_model(SETTING.layout, SETTING.num_layers, device, model_dtype(device))
    except ValueError as error:  # VASE_BENCH_CHECKPOINT
        parser.error(str(error))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if steps < args.steps:
        print(f"--steps: {steps} steps, the most this profile's length allows after its warm-up prompt and "
              f"--warmup {args.warmup} (asked for {args.steps})", file=sys.stderr)  # fmt: skip
    results: list[StepProfile] = []
    for method in methods:  # the file is rewritten after each method: an interrupted run keeps what it did
        results.append(profile_method(model, method, SETTING, device, steps, args.warmup))
        text = render(results, SETTING, device, steps)
        if args.out is not None:
            (args.out / "profile.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
