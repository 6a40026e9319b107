"""S3 as out_dir and as trial path, through s3fs against moto's server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SECRET_KEY, start_training

import smdebug
from smdebug.exceptions import ConfigError
from smdebug.hook import BaseHook
from smdebug.trials import create_trial

TENSORS = 13


def write_run(uri: str, steps: int, tensors: int = TENSORS) -> dict:
    """A run of ``steps`` steps with ``tensors`` tensors each, written with the core's hook; its values."""
    rng = np.random.default_rng(0)
    expected = {}
    hook = BaseHook(out_dir=uri, save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(steps):
        hook.begin_step()
        for i in range(tensors):
            value = rng.standard_normal((4, 5)).astype(np.float32)
            hook.save_tensor(f"layer{i}/weight", value)
            expected[(f"layer{i}/weight", step)] = value
    hook.close()
    return expected


def test_training_to_s3_reads_back(s3_uri):
    proc = start_training(s3_uri, 6)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    trial = create_trial(s3_uri)
    assert trial.steps() == list(range(6))
    assert trial.training_ended()
    names = trial.tensor_names()
    assert "gradient/Sequential_0.weight" in names and "MSELoss_output_0" in names
    for name in names:
        tensor = trial.tensor(name)
        assert tensor.steps() == list(range(6))
        for step in tensor.steps():
            assert np.all(np.isfinite(tensor.value(step)))
    # SGD moved the weights between the steps
    w = trial.tensor("Sequential_0.weight")
    assert not np.array_equal(w.value(0), w.value(5))


def test_every_value_read_back_exactly_with_few_requests(s3_uri):
    expected = write_run(s3_uri, steps=60)
    trial = create_trial(s3_uri)
    assert len(trial.tensor_names()) == TENSORS
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            np.testing.assert_array_equal(tensor.value(step), expected[(name, step)])
    # batched range reads: about one request per event file, not one per value (smdebug 1.0.34's way)
    assert trial._fetcher.requests <= 60 + 5
    assert len(expected) == 60 * TENSORS


def test_values_read_step_by_step_are_batched_too(s3_uri):
    expected = write_run(s3_uri, steps=20, tensors=3)
    trial = create_trial(s3_uri)
    for step in trial.steps():
        for name in trial.tensor_names(step=step):
            np.testing.assert_array_equal(trial.tensor(name).value(step), expected[(name, step)])
    assert trial._fetcher.requests <= 20 + 2


def test_out_dir_holding_a_run_is_refused_on_s3(s3_uri):
    write_run(s3_uri, steps=1, tensors=1)
    with pytest.raises(ConfigError, match="already holds") as info:
        BaseHook(out_dir=s3_uri)
    assert s3_uri in str(info.value)
    assert SECRET_KEY not in str(info.value)


def test_endpoint_from_storage_options(s3_server, s3_uri, monkeypatch):
    """fsspec's own configuration works as well as the AWS environment."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", s3_server.endpoint)
    import fsspec.config

    monkeypatch.setattr(fsspec.config, "conf", {})
    fsspec.config.set_conf_env(fsspec.config.conf)
    expected = write_run(s3_uri, steps=2, tensors=2)
    trial = create_trial(s3_uri)
    np.testing.assert_array_equal(trial.tensor("layer1/weight").value(1), expected[("layer1/weight", 1)])


def test_doubled_slashes_in_an_s3_path_name_the_same_run(s3_uri):
    """``s3://bucket/a//run`` (a prefix joined with a trailing slash) is written where it is read back: S3
    cannot list a key with an empty folder name, so a run written under one could never be read."""
    doubled = s3_uri.replace("/run", "//run/")
    expected = write_run(doubled, steps=3, tensors=2)
    for uri in (doubled, s3_uri):
        trial = create_trial(uri)
        assert trial.steps() == [0, 1, 2] and trial.training_ended()
        np.testing.assert_array_equal(trial.tensor("layer1/weight").value(2), expected[("layer1/weight", 2)])
