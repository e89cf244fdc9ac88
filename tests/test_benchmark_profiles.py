"""Which benchmark profile a session runs (`benchmarks.profiles`): the variable, its errors, and
suites that have no sizes for the active profile skipping instead of running another's."""

from __future__ import annotations

import pytest
import torch

from benchmarks import profiles


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
def test_default_profile_follows_the_device(monkeypatch, cuda):
    monkeypatch.delenv(profiles.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert profiles.active() == ("gpu" if cuda else "smoke")


@pytest.mark.parametrize("profile", ["gpu", "deep", "full"])
def test_gpu_profiles_refuse_a_machine_without_cuda(monkeypatch, profile):
    monkeypatch.setenv(profiles.ENVIRONMENT_VARIABLE, profile)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=f"VASE_BENCH_PROFILE={profile} needs a CUDA device"):
        profiles.active()


def test_unknown_profile_names_the_choices(monkeypatch):
    monkeypatch.setenv(profiles.ENVIRONMENT_VARIABLE, "huge")
    with pytest.raises(ValueError, match=r"expected one of smoke, gpu, deep, full, cpu; got 'huge'"):
        profiles.active()


def test_an_unknown_profile_is_a_usage_error_of_the_benchmark_session(monkeypatch):
    """pytest prints a usage error as one line; an error raised while configuring is an INTERNALERROR traceback."""
    from benchmarks import conftest

    monkeypatch.setenv(profiles.ENVIRONMENT_VARIABLE, "huge")
    with pytest.raises(pytest.UsageError, match=r"VASE_BENCH_PROFILE: expected one of .*; got 'huge'"):
        conftest.pytest_configure(None)


def test_a_suite_without_sizes_for_the_profile_skips(monkeypatch):
    monkeypatch.setenv(profiles.ENVIRONMENT_VARIABLE, "deep")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert profiles.pick({"deep": "end to end", "gpu": "kernels"}) == "end to end"
    with pytest.raises(pytest.skip.Exception, match="not part of the deep profile"):
        profiles.pick({"gpu": "kernels", "full": "kernels"})
