"""Reading SageMaker's hook configuration file (debughookconfig.json)."""

import json

import pytest

from smdebug import json_config
from smdebug.config import ReductionConfig, SaveConfig, SaveConfigMode
from smdebug.exceptions import ConfigError
from smdebug.hook import BaseHook
from smdebug.json_config import (
    CONFIG_FILE_PATH_ENV,
    DEFAULT_CONFIG_PATH,
    CollectionSettings,
    HookConfig,
    find_config_path,
    load_hook_config,
    parse_hook_config,
)
from smdebug.modes import ModeKeys

REALISTIC = {
    "LocalPath": "/opt/ml/output/tensors",
    "S3OutputPath": "s3://my-bucket/debugger-logs",
    "HookParameters": {
        "save_all": "false",
        "include_regex": "relu.*,fc\\d",
        "include_workers": "all",
        "reductions": "min,abs_max,l2",
        "save_raw_tensor": "True",
        "save_interval": "100",
        "start_step": "10",
        "train.save_interval": "50",
        "eval.save_steps": "1,2,3",
        "global.end_step": "1000",
    },
    "CollectionConfigurations": [
        {"CollectionName": "weights"},
        {
            "CollectionName": "gradients",
            "CollectionParameters": {"save_interval": "20", "save_histogram": "False"},
        },
        {"CollectionName": "metrics", "CollectionParameters": {"end_step": "0"}},
        {
            "CollectionName": "custom",
            "CollectionParameters": {
                "include_regex": "my_.*",
                "reductions": "mean,abs_l1",
                "predict.save_interval": "7",
            },
        },
    ],
}


def write(tmp_path, data, name="debughookconfig.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.fixture(autouse=True)
def no_sagemaker_files(monkeypatch, tmp_path):
    """Neither the environment nor /opt/ml may leak into these tests."""
    monkeypatch.delenv(CONFIG_FILE_PATH_ENV, raising=False)
    monkeypatch.setenv(json_config.TENSORBOARD_CONFIG_FILE_PATH_ENV, str(tmp_path / "no-tensorboard.json"))
    monkeypatch.setattr(json_config, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent" / "debughookconfig.json"))


def test_realistic_file(tmp_path):
    config = load_hook_config(write(tmp_path, REALISTIC))
    assert isinstance(config, HookConfig)
    assert config.out_dir == "/opt/ml/output/tensors"
    assert config.save_all is False and config.dry_run is False and config.export_tensorboard is False
    assert config.include_regex == ["relu.*", "fc\\d"]
    assert config.include_workers == "all"
    assert config.reduction_config == ReductionConfig(
        reductions=["min"], abs_reductions=["max"], norms=["l2"], save_raw_tensor=True
    )
    sc = config.save_config
    assert sc.get_save_config(ModeKeys.TRAIN) == SaveConfigMode(save_interval=50, start_step=10)
    assert sc.get_save_config(ModeKeys.EVAL) == SaveConfigMode(
        save_interval=100, start_step=10, save_steps=[1, 2, 3]
    )
    assert sc.get_save_config(ModeKeys.PREDICT) == SaveConfigMode(save_interval=100, start_step=10)
    assert sc.get_save_config(ModeKeys.GLOBAL) == SaveConfigMode(
        save_interval=100, start_step=10, end_step=1000
    )
    assert [s for s in range(200) if sc.should_save_step(ModeKeys.EVAL, s)] == [1, 2, 3, 100]
    # Every configured collection is saved, in the file's order.
    assert config.include_collections == ["weights", "gradients", "metrics", "custom"]


def test_collection_configurations(tmp_path):
    colls = load_hook_config(write(tmp_path, REALISTIC)).collections
    assert set(colls) == {"weights", "gradients", "metrics", "custom"}
    assert colls["weights"] == CollectionSettings("weights")  # nothing of its own: inherits the hook's
    grads = colls["gradients"]
    assert grads.save_histogram is False and grads.reduction_config is None
    # The collection's plain keys override the hook's, mode-prefixed ones included (smdebug's order).
    for mode in ModeKeys:
        expected_end = 1000 if mode == ModeKeys.GLOBAL else None
        expected_steps = [1, 2, 3] if mode == ModeKeys.EVAL else []
        assert grads.save_config.get_save_config(mode) == SaveConfigMode(
            save_interval=20, start_step=10, end_step=expected_end, save_steps=expected_steps
        )
    metrics = colls["metrics"].save_config
    assert all(not metrics.should_save_step(m, s) for m in ModeKeys for s in range(0, 2000, 50))
    custom = colls["custom"]
    assert custom.include_regex == ["my_.*"]
    assert custom.reduction_config == ReductionConfig(reductions=["mean"], abs_norms=["l1"])
    assert custom.save_config.get_save_config(ModeKeys.PREDICT).save_interval == 7
    assert custom.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 50


def test_mode_prefixed_keys_only():
    config = parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": {"eval.save_interval": "2"}})
    assert config.save_config.get_save_config(ModeKeys.EVAL) == SaveConfigMode(save_interval=2)
    assert config.save_config.get_save_config(ModeKeys.TRAIN) == SaveConfigMode()


def test_minimal_config_and_defaults():
    config = parse_hook_config({"LocalPath": "/tmp/run"})
    assert config.out_dir == "/tmp/run"
    assert config.save_config is None and config.reduction_config is None
    assert config.include_regex is None and config.include_collections is None
    assert config.include_workers == "one" and config.collections == {}
    # An empty list of collections means: save none of the optional ones.
    assert (
        parse_hook_config({"LocalPath": "/tmp/run", "CollectionConfigurations": []}).include_collections == []
    )


def test_s3_output_path_only_uses_sagemaker_local_dir():
    config = parse_hook_config({"S3OutputPath": "s3://bucket/prefix"})
    assert config.out_dir == json_config.DEFAULT_SAGEMAKER_OUT_DIR
    assert parse_hook_config({"LocalPath": "/tmp/l", "S3OutputPath": "s3://b/p"}).out_dir == "/tmp/l"


def test_no_local_path_defaults_to_sagemaker_tensors_dir(tmp_path, monkeypatch):
    """As smdebug 1.0: a config without LocalPath (nor S3OutputPath) saves to /opt/ml/output/tensors."""
    assert parse_hook_config({"HookParameters": {}}).out_dir == "/opt/ml/output/tensors"
    assert parse_hook_config({"LocalPath": None}).out_dir == "/opt/ml/output/tensors"
    with pytest.raises(ConfigError, match="LocalPath"):
        parse_hook_config({"LocalPath": ""})
    # the hook made from such a file resolves it too (a dry run: nothing is written under /opt)
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps({"HookParameters": {"dry_run": "true", "save_interval": "2"}}))
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, str(path))
    assert load_hook_config(str(path)).out_dir == "/opt/ml/output/tensors"
    hook = BaseHook.create_from_json_file()
    assert hook.out_dir == "/opt/ml/output/tensors" and hook.dry_run
    hook.close()


def test_tensorboard(tmp_path, monkeypatch):
    config = parse_hook_config(
        {
            "LocalPath": "/tmp/x",
            "HookParameters": {"export_tensorboard": "true", "tensorboard_dir": "/tmp/tb"},
        }
    )
    assert config.export_tensorboard is True and config.tensorboard_dir == "/tmp/tb"
    config = parse_hook_config({"LocalPath": "/tmp/x", "TensorBoardOutputConfig": {"LocalPath": "/tmp/tb2"}})
    assert config.export_tensorboard is True and config.tensorboard_dir == "/tmp/tb2"
    # SageMaker's separate TensorBoard config file
    tb_file = write(tmp_path, {"LocalPath": "/tmp/tb3", "S3OutputPath": "s3://b/tb"}, "tb.json")
    monkeypatch.setenv(json_config.TENSORBOARD_CONFIG_FILE_PATH_ENV, tb_file)
    config = load_hook_config(write(tmp_path, {"LocalPath": "/tmp/x"}))
    assert config.export_tensorboard is True and config.tensorboard_dir == "/tmp/tb3"


def test_reduction_flags_without_reductions():
    config = parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": {"save_shape": "true"}})
    assert config.reduction_config == ReductionConfig(save_raw_tensor=True, save_shape=True)


def test_duplicate_collection_entries_combine():
    config = parse_hook_config(
        {
            "LocalPath": "/tmp/x",
            "CollectionConfigurations": [
                {
                    "CollectionName": "weights",
                    "CollectionParameters": {"include_regex": "a", "save_interval": "5"},
                },
                {"CollectionName": "weights", "CollectionParameters": {"include_regex": "b"}},
            ],
        }
    )
    weights = config.collections["weights"]
    assert weights.include_regex == ["a", "b"]
    assert weights.save_config == SaveConfig(save_interval=5)
    assert config.include_collections == ["weights"]


def test_a_collection_listed_twice_keeps_each_parameter_its_later_entry_leaves_out():
    config = parse_hook_config(
        {
            "LocalPath": "/tmp/x",
            "HookParameters": {"save_interval": "10"},
            "CollectionConfigurations": [
                {"CollectionName": "weights", "CollectionParameters": {"save_interval": "2"}},
                {"CollectionName": "weights", "CollectionParameters": {"start_step": "3"}},
            ],
        }
    )
    assert config.collections["weights"].save_config == SaveConfig(save_interval=2, start_step=3)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"HookParameters": {"include_regex": "fc[12"}},
            "HookParameters.include_regex: invalid regular expression 'fc[12' (unterminated character set",
        ),
        (
            {
                "CollectionConfigurations": [
                    {"CollectionName": "c", "CollectionParameters": {"include_regex": "("}}
                ]
            },
            "CollectionConfigurations[c].include_regex: invalid regular expression '('",
        ),
    ],
)
def test_a_bad_regular_expression_is_an_error_naming_it(config, message):
    """It failed only when training started, and activation on import then trained without smdebug."""
    with pytest.raises(ConfigError) as info:
        parse_hook_config({"LocalPath": "/tmp/x", **config}, source="cfg.json")
    assert str(info.value).startswith(f"cfg.json: {message}")
    with pytest.raises(ConfigError, match="include_regex: invalid regular expression"):
        HookConfig(out_dir="/tmp/x", include_regex=["ok", "fc[12"])


def test_hook_config_model_validates():
    config = HookConfig(out_dir="/tmp/x", dry_run="1", include_regex="a,b", save_config={"save_interval": 3})
    assert config.dry_run is True and config.include_regex == ["a", "b"]
    assert config.save_config == SaveConfig(save_interval=3)
    with pytest.raises(ConfigError, match=r"include_workers.*'some'"):
        HookConfig(out_dir="/tmp/x", include_workers="some")
    with pytest.raises(ConfigError, match="out_dir"):
        HookConfig(out_dir="")


# -- find_config_path ---------------------------------------------------------------------------------
def test_find_config_path(tmp_path, monkeypatch):
    assert json_config.DEFAULT_CONFIG_PATH != DEFAULT_CONFIG_PATH  # the fixture hides /opt/ml
    assert find_config_path() is None
    path = write(tmp_path, {"LocalPath": "/tmp/x"})
    assert find_config_path(path) == path
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, path)
    assert find_config_path() == path
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"SMDEBUG_CONFIG_FILE_PATH.*missing\.json"):
        find_config_path()
    with pytest.raises(ConfigError, match=r"nope\.json"):
        find_config_path(str(tmp_path / "nope.json"))


def test_create_from_json_file_of_a_missing_file_is_a_file_not_found_error(tmp_path, monkeypatch):
    """A configuration file named by the argument or SMDEBUG_CONFIG_FILE_PATH that is missing raises
    FileNotFoundError, as in smdebug 1.0 (and still a ConfigError)."""
    from smdebug.hook import BaseHook

    with pytest.raises(FileNotFoundError, match=r"nope\.json"):
        BaseHook.create_from_json_file(str(tmp_path / "nope.json"))
    monkeypatch.setenv(CONFIG_FILE_PATH_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError) as info:
        BaseHook.create_from_json_file()
    assert isinstance(info.value, ConfigError)


def test_find_config_path_default(tmp_path, monkeypatch):
    default = write(tmp_path, {"LocalPath": "/tmp/x"}, "default.json")
    monkeypatch.setattr(json_config, "DEFAULT_CONFIG_PATH", default)
    assert find_config_path() == default


def test_constants():
    assert DEFAULT_CONFIG_PATH == "/opt/ml/input/config/debughookconfig.json"
    assert CONFIG_FILE_PATH_ENV == "SMDEBUG_CONFIG_FILE_PATH"


# -- bad files --------------------------------------------------------------------------------------
def test_bad_json_names_file_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "LocalPath": "/tmp/x",\n  "HookParameters": {"save_interval": }\n}')
    with pytest.raises(ConfigError) as info:
        load_hook_config(path)
    message = str(info.value)
    assert path in message and "line 3" in message and "column" in message


def test_bad_value_names_key_and_value(tmp_path):
    path = write(tmp_path, {"LocalPath": "/tmp/x", "HookParameters": {"save_interval": "abc"}})
    with pytest.raises(ConfigError) as info:
        load_hook_config(path)
    assert str(info.value) == (
        f"{path}: HookParameters.save_interval: invalid value 'abc' (expected a positive integer)"
    )


@pytest.mark.parametrize(
    "hook_params, key, value",
    [
        ({"save_intervall": "10"}, "save_intervall", "'10'"),
        ({"train.save_intervall": "10"}, "train.save_intervall", "'10'"),
        ({"training.save_interval": "10"}, "training.save_interval", "'10'"),
        ({"eval.end_step": "-1"}, "HookParameters.eval.end_step", "'-1'"),
        ({"save_steps": "1,x"}, "HookParameters.save_steps", "'1,x'"),
        ({"dry_run": "maybe"}, "HookParameters.dry_run", "'maybe'"),
        ({"include_workers": "some"}, "HookParameters.include_workers", "'some'"),
        ({"reductions": "min,average"}, "HookParameters.reductions", "'average'"),
        ({"save_raw_tensor": "yes"}, "HookParameters.save_raw_tensor", "'yes'"),
    ],
)
def test_bad_hook_parameters(hook_params, key, value):
    with pytest.raises(ConfigError) as info:
        parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": hook_params}, source="cfg.json")
    message = str(info.value)
    assert message.startswith("cfg.json: ") and key in message and value in message


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match="did you mean 'save_interval'"):
        parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": {"save_intervall": "10"}})


@pytest.mark.parametrize(
    "config, message",
    [
        (  # saved to SageMaker's /opt/ml/output/tensors, silently, with a warning only
            {"LocalPth": "/tmp/x"},
            "LocalPth: unknown key with value '/tmp/x'; did you mean 'LocalPath'?",
        ),
        (
            {"LocalPath": "/tmp/x", "CollectionConfiguration": [{"CollectionName": "weights"}]},
            "did you mean 'CollectionConfigurations'?",
        ),
        (  # was: CollectionName: invalid value None
            {"LocalPath": "/tmp/x", "CollectionConfigurations": [{"CollectionNam": "weights"}]},
            "CollectionConfigurations[0].CollectionNam: unknown key with value 'weights'; "
            "did you mean 'CollectionName'?",
        ),
        (  # was: ignored, and its parameters with it
            {
                "LocalPath": "/tmp/x",
                "CollectionConfigurations": [
                    {"CollectionName": "weights", "CollectionParameter": {"save_interval": "1"}}
                ],
            },
            "CollectionConfigurations[weights].CollectionParameter: unknown key with value "
            "{'save_interval': '1'} (expected CollectionName or CollectionParameters); "
            "did you mean 'CollectionParameters'?",
        ),
        (  # was: did you mean 'save_interval'?
            {"LocalPath": "/tmp/x", "HookParameters": {"trian.save_interval": "2"}},
            "HookParameters.trian.save_interval: unknown key",
        ),
    ],
)
def test_a_misspelt_key_is_an_error_naming_it_and_the_right_one(config, message):
    with pytest.raises(ConfigError) as info:
        parse_hook_config(config, source="cfg.json")
    assert str(info.value).startswith("cfg.json: ") and message in str(info.value)
    if "trian" in message:
        assert str(info.value).endswith("did you mean 'train.save_interval'?")


def test_an_unknown_section_far_from_every_known_one_is_ignored_with_a_warning(caplog):
    config = parse_hook_config({"LocalPath": "/tmp/x", "RuleConfigurations": [{"RuleName": "x"}]})
    assert config.out_dir == "/tmp/x"
    assert "ignoring unknown key 'RuleConfigurations'" in caplog.text


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ({"CollectionParameters": {}}, "CollectionConfigurations[0].CollectionName"),
        (
            {"CollectionName": "w", "CollectionParameters": {"save_histo": "1"}},
            "CollectionConfigurations[w].save_histo",
        ),
        (
            {"CollectionName": "w", "CollectionParameters": {"save_histogram": "x"}},
            "save_histogram: invalid value 'x'",
        ),
        ({"CollectionName": "w", "CollectionParameters": {"train.start_step": "a"}}, "[w].train.start_step"),
        ({"CollectionName": "w", "CollectionParameters": "oops"}, "[w].CollectionParameters"),
    ],
)
def test_bad_collection_configurations(entry, fragment):
    with pytest.raises(ConfigError) as info:
        parse_hook_config({"LocalPath": "/tmp/x", "CollectionConfigurations": [entry]})
    assert fragment in str(info.value)


def test_not_an_object(tmp_path):
    with pytest.raises(ConfigError, match=r"expected a JSON object"):
        load_hook_config(write(tmp_path, "[1, 2]"))
    with pytest.raises(ConfigError, match=r"HookParameters.*expected a JSON object"):
        parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": "save_interval=1"})


def test_save_raw_tensor_false_without_reductions_is_ignored_as_in_smdebug_10(caplog):
    # smdebug 1.0 reads save_raw_tensor only alongside reductions; honouring "false" alone saved nothing
    for where, config in (
        ("HookParameters", {"LocalPath": "/tmp/x", "HookParameters": {"save_raw_tensor": "false"}}),
        (
            "CollectionConfigurations[weights]",
            {
                "LocalPath": "/tmp/x",
                "CollectionConfigurations": [
                    {"CollectionName": "weights", "CollectionParameters": {"save_raw_tensor": "False"}}
                ],
            },
        ),
    ):
        caplog.clear()
        parsed = parse_hook_config(config)
        reduction = (
            parsed.reduction_config
            if where == "HookParameters"
            else parsed.collections["weights"].reduction_config
        )
        assert reduction.save_raw_tensor is True
        assert f"{where}.save_raw_tensor=false is ignored without reductions" in caplog.text
    with_reductions = parse_hook_config(
        {"LocalPath": "/tmp/x", "HookParameters": {"reductions": "l2", "save_raw_tensor": "false"}}
    )
    assert with_reductions.reduction_config == ReductionConfig(norms=["l2"], save_raw_tensor=False)
