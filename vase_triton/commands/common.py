"""What the `vase-triton` subcommands share: one-line errors, argument types, the VaSE
configuration options, device and dtype choice, and loading a model without surprises.

Every user-facing failure is a `CommandError`: `vase-triton: error: ...` on one line,
exit status 1 (argument errors: status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import math
import socket
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from vase_triton.config import SCORE_MODES, VALUE_STATS, VaSEConfig
from vase_triton.policies import OBSERVE_WINDOW, POLICIES, SETTINGS_A_POLICY_MAY_READ, Policy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Below this a decoding temperature divides logits into overflow; use 0 for greedy decoding.
MIN_DECODING_TEMPERATURE = 1e-3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


class OneLineErrorParser(argparse.ArgumentParser):
    """Argument errors print one line (`vase-triton: error: ...`) and exit with status 2."""

    def error(self, message: str):
        self.exit(2, f"vase-triton: error: {message} (see '{self.prog} --help')\n")


def _int_at_least(low: int, expected: str):
    """An argparse type: an integer `>= low`, with `expected` in its error message."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {value}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def choice(choices: Sequence[str]):
    """An item parser for `comma_list`: one of `choices`."""

    def parse(item: str) -> str:
        if item not in choices:
            raise ValueError(item)
        return item

    return parse


def comma_list(parse_item, expected: str):
    """An argparse type: a non-empty comma-separated list, each item through `parse_item`
    (which raises `ValueError` or `ArgumentTypeError` on a bad item), duplicates dropped."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            values = [parse_item(item) for item in items]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {expected}; got {text!r}")
        return list(dict.fromkeys(values))

    return parse


def finite_float(low: float = 0.0, high: float = math.inf):
    """An argparse type: a finite float in `[low, high]`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected a finite number {bounds}; got {text}")
        return value

    return parse


# Cache options only some policies use: option -> the `VaSEConfig` field it sets. Given for a
# policy that would ignore it, it is refused (`why_ignored`); not given, `budget` and `window`
# come from the caller of `config_from_arguments` and the other fields keep their defaults.
_POLICY_DEPENDENT_OPTIONS = {
    "--budget": "budget", "--window": "window", "--n-sink": "n_sink", "--protect-values": "protect_values",
    "--n-protect": "n_protect", "--value-stat": "value_stat", "--evict-temperature": "temperature",
    "--score-mode": "score_mode", "--pool-kernel": "pool_kernel", "--rkv-lambda": "rkv_lambda",
    "--dkv-rank": "dkv_rank",
}


def _readers(field: str) -> str:
    """The registered policies whose importance reads `VaSEConfig` field `field` (`Policy.reads`)."""
    return ", ".join(name for name, policy in POLICIES.items() if field in policy.reads)


def add_config_arguments(
    parser: argparse.ArgumentParser, *, default_budget: Optional[str] = "2048", default_window: Optional[str] = None
) -> None:
    """Options for every `VaSEConfig` field (`--policy`, `--budget`, ..., `--prefill-chunk-size`)."""
    defaults = VaSEConfig()
    group = parser.add_argument_group("VaSE cache")
    policies = " | ".join(f"{name}: {policy.summary}" for name, policy in POLICIES.items())
    group.add_argument("--policy", default=defaults.policy, choices=list(POLICIES),
                       help=f"eviction policy (default: {defaults.policy}). {policies}")
    group.add_argument("--budget", type=positive_int, help=f"tokens kept per head after an eviction (default {default_budget})")
    group.add_argument("--window", type=positive_int,
                       help=f"recent/observation window and eviction interval (default {default_window or defaults.window})")
    group.add_argument("--n-sink", type=non_negative_int, help=f"first tokens never evicted (default {defaults.n_sink})")
    group.add_argument("--n-protect", type=non_negative_int,
                       help="value-protected tokens, sinks included (default min(budget // 4, budget - window))")
    group.add_argument("--protect-values", action=argparse.BooleanOptionalAction, default=None,
                       help="keep the largest value vectors (default: the policy's; on for vase)")
    group.add_argument("--value-stat", choices=VALUE_STATS,
                       help=f"value magnitude statistic of value protection (default {defaults.value_stat})")
    group.add_argument("--evict-temperature", type=finite_float(),
                       help=f"Gumbel temperature of eviction sampling, for policies that sample (default "
                            f"{defaults.temperature:g}; 0 = top-k; not the decoding temperature)")
    group.add_argument("--score-mode", choices=SCORE_MODES,
                       help=f"window attention of window-observing policies: recompute (the paper's) or emitted by "
                            f"decode attention (default {defaults.score_mode})")
    group.add_argument("--pool-kernel", type=positive_int,
                       help=f"importance pool width (odd; default {defaults.pool_kernel}); {_readers('pool_kernel')}")
    group.add_argument("--rkv-lambda", type=finite_float(0.0, 1.0),
                       help=f"R-KV trade-off λ (default {defaults.rkv_lambda:g}); {_readers('rkv_lambda')}")
    group.add_argument("--dkv-rank", type=positive_int,
                       help=f"projection width (default {defaults.dkv_rank}); {_readers('dkv_rank')}")
    group.add_argument("--prefill-chunk-size", type=positive_int, default=defaults.prefill_chunk_size,
                       help="tokens per prefill chunk (peak prefill memory: capacity + chunk)")


def why_ignored(field: str, policy: Policy, protect_values: Optional[bool]) -> Optional[str]:
    """Why `policy` would ignore `VaSEConfig` field `field` (`protect_values`: the option's value), or None."""
    if not policy.evicts:
        return f"the {policy.name!r} policy keeps every token"
    if field in policy.reads:
        return None
    if field in ("n_protect", "value_stat"):
        protects = policy.protect_values if protect_values is None else protect_values
        return None if protects else f"value protection is off for policy {policy.name!r} (--protect-values turns it on)"
    if field in SETTINGS_A_POLICY_MAY_READ:
        return f"policy {policy.name!r} does not read {field}"
    if field == "temperature" and not policy.stochastic:
        return f"policy {policy.name!r} keeps the top-ranked candidates without sampling"
    if field == "score_mode" and policy.observation != OBSERVE_WINDOW:
        return f"policy {policy.name!r} does not observe the window's attention"
    return None


def config_from_arguments(args: argparse.Namespace, budget: int, window: int = VaSEConfig().window) -> VaSEConfig:
    """The `VaSEConfig` the options describe (`budget`, and `window` unless given); invalid is a one-line error,
    and so is an option the policy would ignore."""
    policy = POLICIES[args.policy]
    given = {}
    for option, field in _POLICY_DEPENDENT_OPTIONS.items():
        value = getattr(args, option[2:].replace("-", "_"))
        if value is None:
            continue
        why = why_ignored(field, policy, args.protect_values)
        if why is not None:
            raise CommandError(f"{option}: {why}, so {option} would be ignored; drop {option}")
        given[field] = value
    try:
        return VaSEConfig(**{
            "budget": budget, "window": window, **given, "policy": args.policy, "seed": args.seed,
            "prefill_chunk_size": args.prefill_chunk_size,
        })  # fmt: skip
    except (ValueError, TypeError) as error:
        field, _, reason = str(error).partition(":")
        option = {"temperature": "evict-temperature"}.get(field, field.replace("_", "-"))
        raise CommandError(f"--{option}:{reason}") from None


def check_backend(device: torch.device) -> None:
    """`VASE_BACKEND` must name a backend that can run on `device`, and `VASE_AUTOTUNE` a lookup mode."""
    from vase_triton.autotune.settings import autotune_mode
    from vase_triton.backend import use_triton

    try:
        use_triton(device)
        autotune_mode()
    except (ValueError, RuntimeError) as error:
        raise CommandError(str(error)) from None


def resolve_device(name: str) -> torch.device:
    """`--device`: `cpu`, `cuda`, `cuda:N` (an existing device) or `auto` (CUDA when available)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index is not None):
        raise CommandError(f"--device: expected cpu, cuda, cuda:N or auto; got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device: {name} requested but no CUDA device is available")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise CommandError(
            f"--device: expected cuda:N with N < {torch.cuda.device_count()} (the CUDA devices here); got {name!r}"
        )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    return DTYPES.get(name) or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def endpoint_unreachable(endpoint: str, timeout_s: float = 5.0) -> Optional[str]:
    """Why a TCP connection for URL `endpoint` fails within `timeout_s`, or None when it succeeds.

    The connection goes where an HTTP client would send the request: to the proxy that
    `HTTPS_PROXY`/`HTTP_PROXY` name for the endpoint's scheme unless `NO_PROXY` exempts its
    host, else to the host itself.
    """
    url = urllib.parse.urlsplit(endpoint)
    if not url.hostname:
        return f"no host in {endpoint!r}"
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        target, label = via, f"proxy {proxy}"
    else:
        target, label = url, None
    try:
        port = target.port or (443 if target.scheme == "https" else 80)
    except ValueError:
        return f"invalid port in {label or repr(endpoint)}"
    if not target.hostname:
        return f"no host in {label}"
    try:
        with socket.create_connection((target.hostname, port), timeout=timeout_s):
            return None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        return f"{label}: {reason}" if label else reason


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face Hub huggingface_hub would use (`HF_ENDPOINT`) is not disabled by
    `HF_HUB_OFFLINE` and answers a TCP connection within `timeout` seconds."""
    from huggingface_hub import constants

    return not constants.HF_HUB_OFFLINE and endpoint_unreachable(constants.ENDPOINT, timeout) is None


def _looks_like_a_path(name: str) -> bool:
    """A name no hub id has the shape of: absolute, home- or dot-relative, or with more than one `/`."""
    return name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1


def locate_model(name: str) -> tuple[str, bool]:
    """`(name, local)`: a local directory (`~` expanded), or `name` as a hub id; a one-line
    `CommandError` for a file or a path that does not exist."""
    if not name.strip():
        raise CommandError(f"--model: expected a transformers model directory or a hub id; got {name!r}")
    path = Path(name).expanduser()
    if path.is_file():
        raise CommandError(f"--model: {name} is a file; expected a transformers model directory or a hub id")
    if path.is_dir():
        return str(path), True  # transformers does not expand `~`
    if _looks_like_a_path(name):
        raise CommandError(f"--model: no such directory: {name}")
    return name, False


def hub_options(name: str, load_cached: Callable[[str], object]) -> dict:
    """`from_pretrained` options for hub id `name`: the local cache only when `load_cached(name)`
    finds it there; else the hub, which must answer now (a one-line `CommandError` if not)."""
    try:
        load_cached(name)
        return {"local_files_only": True}
    except Exception:  # not in the local hub cache
        if not hub_reachable():
            raise CommandError(
                f"--model: {name!r} is neither a local directory nor in the Hugging Face cache, and the hub is "
                "unreachable (give a local model directory)"
            ) from None
        return {}


def load_model(name: str, device: torch.device, dtype: torch.dtype):
    """`(model, tokenizer)` from a local directory or a hub id, or a one-line `CommandError` saying why not.

    A name that looks like a path must be a directory with a model config and tokenizer
    files; the hub is tried only for a bare `owner/name` that is not cached and only when
    it answers at once.
    """
    from transformers import AutoTokenizer

    from vase_triton.integrations.loading import load_causal_lm

    name, local = locate_model(name)
    kwargs = dict(local_files_only=True)
    if local:
        path = Path(name)
        if not (path / "config.json").is_file():
            raise CommandError(f"--model: {name} has no config.json (not a transformers model directory)")
        if not any((path / file).is_file() for file in TOKENIZER_FILES):
            raise CommandError(f"--model: {name} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    else:
        kwargs = hub_options(name, lambda hub_id: AutoTokenizer.from_pretrained(hub_id, local_files_only=True))
    from transformers import AutoConfig

    from vase_triton.integrations.models import SUPPORTED_MODEL_TYPES, check_attention_config

    try:
        config = AutoConfig.from_pretrained(name, **kwargs)
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CommandError(f"--model: cannot read the config of {name!r}: {first_line}") from None
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CommandError(
            f"--model: expected a transformers causal LM of type {', '.join(SUPPORTED_MODEL_TYPES)}; "
            f"{name!r} is a {model_type!r} model"
        )
    try:  # before the weights load: their size can make a refusal minutes late
        check_attention_config(config)
    except ValueError as error:
        raise CommandError(f"--model: {name!r}: {str(error).partition(': ')[2]}") from None
    quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = load_causal_lm(name, dtype=dtype, **kwargs).to(device).eval()
    except Exception as error:  # transformers raises many types for a missing or invalid model
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CommandError(f"--model: cannot load {name!r}: {first_line}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def quiet_transformers() -> None:
    """No weight-loading progress bars: the command's own output stays readable."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def sampling_settings(model, temperature: Optional[float], top_p: Optional[float], top_k: Optional[int]) -> dict:
    """Decoding settings: the values given, else the model's generation config (greedy when it says so).

    A temperature of 0 means greedy decoding; `top_p` or `top_k` with greedy decoding is refused
    (it would be ignored), and so is a positive temperature below `MIN_DECODING_TEMPERATURE`.
    """
    config = model.generation_config
    if temperature is not None and 0 < temperature < MIN_DECODING_TEMPERATURE:
        raise CommandError(
            f"--temperature: expected 0 (greedy) or at least {MIN_DECODING_TEMPERATURE:g}; got {temperature:g}"
        )
    greedy_by = "--temperature 0" if temperature == 0 else "the model's generation config"
    if temperature is None:
        temperature = (config.temperature or 1.0) if config.do_sample else 0.0
    if temperature == 0:
        for option, given in (("--top-p", top_p), ("--top-k", top_k)):
            if given is not None:
                raise CommandError(
                    f"{option}: only applies when sampling, and {greedy_by} decodes greedily (give --temperature > 0)"
                )
        return {"do_sample": False}
    settings = {"do_sample": True, "temperature": float(temperature)}
    top_p = top_p if top_p is not None else config.top_p
    top_k = top_k if top_k is not None else config.top_k
    if top_p is not None:
        settings["top_p"] = float(top_p)
    if top_k is not None:
        settings["top_k"] = int(top_k)
    return settings


def is_out_of_memory(error: RuntimeError) -> bool:
    """Whether `error` is an allocation failure: CUDA's `OutOfMemoryError`, or the CPU
    allocator's `RuntimeError`."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)


def printable(text: str) -> str:
    """`text` with control characters (but newlines and tabs) shown as escapes, safe for a terminal."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def format_bytes(count: float) -> str:
    units = ("B", "KiB", "MiB", "GiB")
    index = 0
    while count >= 1024 and index < len(units) - 1:
        count, index = count / 1024, index + 1
    return f"{count:.1f} {units[index]}"
