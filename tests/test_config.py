"""VaSEConfig: defaults from the paper, validation messages that explain the constraint."""

from __future__ import annotations

import pickle
import re

import pytest

from vase_triton import POLICIES, VaSEConfig, policies


def test_defaults_follow_the_paper():
    config = VaSEConfig()
    assert (config.policy, config.window, config.n_sink, config.pool_kernel) == ("vase", 64, 4, 5)
    assert config.capacity == config.budget + config.window
    # budget // 4 protected tokens in all, the 4 sinks among them (as the paper counts them).
    assert config.resolved_n_protect == config.budget // 4
    assert config.stochastic and config.protects_values and config.evicts
    assert config.eviction_temperature == 1.0
    assert config.score_mode == "recompute"  # the paper's importance: softmax over the candidates only


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_is_accepted(policy):
    config = VaSEConfig(policy=policy, budget=128, window=16)
    assert config.protects_values == (policy == "vase")
    assert config.evicts == (policy != "full")
    assert config.resolved_n_protect == (32 if policy == "vase" else 0)


def test_default_n_protect_is_clipped_to_what_fits():
    config = VaSEConfig(budget=80, window=64)
    assert config.resolved_n_protect == 80 - 64


@pytest.mark.parametrize("temperature", [0.0, 1e-39, 1e-31])
def test_temperatures_below_the_floor_are_deterministic(temperature):
    config = VaSEConfig(temperature=temperature)
    assert not config.stochastic and config.eviction_temperature == 0.0
    assert VaSEConfig(temperature=1e-29).eviction_temperature == 1e-29


@pytest.mark.parametrize("temperature", [0.0, 1e-39])
def test_random_needs_a_sampling_temperature(temperature):
    with pytest.raises(ValueError, match="random.*no deterministic form"):
        VaSEConfig(policy="random", temperature=temperature)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"policy": "topk"}, "policy: expected one of vase, vase-dkv"),
        ({"budget": 64, "window": 64}, "budget > window"),
        ({"budget": 100, "window": 64, "n_protect": 40}, "n_protect: expected 0 <= n_protect <= budget - window = 36"),
        ({"budget": 100, "window": 64, "n_sink": 37}, "n_sink: expected 0 <= n_sink <= budget - window = 36"),
        ({"score_mode": "exact"}, "score_mode: expected one of emitted, recompute"),
        ({"temperature": float("inf")}, "temperature: expected a finite value"),
        ({"temperature": -0.5}, "temperature"),
        ({"value_stat": "max"}, "value_stat: expected one of range, absmax, l2, var"),
        ({"pool_kernel": 4}, "pool_kernel"),
        ({"rkv_lambda": 1.5}, "rkv_lambda"),
        ({"window": 0}, "window"),
        ({"n_sink": -1}, "n_sink"),
        ({"seed": -1}, "seed"),
        ({"policy": "full", "protect_values": True}, "protect_values: policy 'full' never evicts"),
        ({"policy": "vase-dkv", "dkv_rank": 1025}, "dkv_rank: expected 1 <= dkv_rank <= 1024"),
        ({"budget": 2**31 - 64}, "budget: expected budget + window < 2**31"),
        ({"prefill_chunk_size": 63}, "prefill_chunk_size: expected >= window = 64"),
    ],
    ids=["policy", "budget", "n_protect", "n_sink_fit", "score_mode", "temperature_inf", "temperature", "value_stat",
         "pool", "lambda", "window", "sink", "seed", "protect_full", "dkv_rank_wide",
         "budget_int32", "chunk_below_window"],
)
def test_invalid_values_raise_value_error_naming_the_constraint(kwargs, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        VaSEConfig(**kwargs)


def test_a_policy_that_never_evicts_takes_chunks_shorter_than_the_window():
    assert VaSEConfig(policy="full", prefill_chunk_size=1).prefill_chunk_size == 1


def test_wrong_types_and_unknown_fields():
    with pytest.raises(TypeError, match="budget: expected an int"):
        VaSEConfig(budget=100.0)
    with pytest.raises(TypeError, match="protect_values: expected True, False or None"):
        VaSEConfig(protect_values="yes")
    with pytest.raises(TypeError, match="rkv_lambda: expected a float; got bool True"):
        VaSEConfig(rkv_lambda=True)
    with pytest.raises(TypeError, match="rkv_lambda: expected a float; got str '0.5'"):
        VaSEConfig(rkv_lambda="0.5")
    with pytest.raises(TypeError, match="unknown VaSEConfig field"):
        VaSEConfig().replace(bugdet=10)
    assert VaSEConfig().replace(budget=512).budget == 512


@pytest.mark.parametrize("protect_values", [True, None])
def test_n_protect_with_a_policy_that_never_evicts_says_it_never_evicts(protect_values):
    with pytest.raises(ValueError) as error:
        VaSEConfig(policy="full", protect_values=protect_values, n_protect=10)
    assert str(error.value) == "n_protect: policy 'full' never evicts, so n_protect would be ignored; drop n_protect"


def test_n_protect_without_value_protection_says_how_to_turn_it_on():
    with pytest.raises(ValueError, match="value protection is off for policy 'snapkv'.*pass protect_values=True"):
        VaSEConfig(policy="snapkv", n_protect=10)
    assert VaSEConfig(policy="snapkv", protect_values=True, n_protect=10).resolved_n_protect == 10


def test_pickle_round_trips_and_validates_again(monkeypatch):
    config = VaSEConfig(policy="vase", budget=512, window=32, n_protect=40, temperature=0.5, seed=7)
    assert pickle.loads(pickle.dumps(config)) == config
    monkeypatch.setitem(policies._REGISTRY, "custom-pickled", POLICIES["snapkv"])
    pickled = pickle.dumps(VaSEConfig(policy="custom-pickled"))
    monkeypatch.delitem(policies._REGISTRY, "custom-pickled")
    with pytest.raises(ValueError, match="policy: expected one of .* known once register_policy has run in this"):
        pickle.loads(pickled)
