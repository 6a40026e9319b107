"""SaveConfig, SaveConfigMode and ReductionConfig against the reference's examples and smdebug's JSON."""

import json

import numpy as np
import pytest

import smdebug
from smdebug.config import ReductionConfig, SaveConfig, SaveConfigMode, to_bool
from smdebug.exceptions import ConfigError
from smdebug.modes import ModeKeys


def saved(config, mode=ModeKeys.GLOBAL, steps=range(0, 1001)):
    return [s for s in steps if config.should_save_step(mode, s)]


# -- SaveConfig: the reference's worked examples ------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, [0, 500, 1000]),
        ({"save_interval": 1}, list(range(0, 1001))),
        ({"save_interval": 100, "end_step": 200}, [0, 100]),
        ({"save_interval": 100, "end_step": 201}, [0, 100, 200]),
        ({"save_interval": 100, "start_step": 150}, [200, 300, 400, 500, 600, 700, 800, 900, 1000]),
        ({"save_steps": [3, 7]}, [0, 3, 7, 500, 1000]),
    ],
)
def test_reference_examples(kwargs, expected):
    config = SaveConfig(**kwargs)
    for mode in ModeKeys:
        assert saved(config, mode) == expected


def test_exported_at_package_level():
    assert smdebug.SaveConfig is SaveConfig and smdebug.ReductionConfig is ReductionConfig
    assert smdebug.SaveConfigMode is SaveConfigMode


def test_save_steps_outside_the_range_are_still_saved():
    config = SaveConfigMode(save_interval=10, start_step=20, end_step=40, save_steps=[5, 45])
    assert [s for s in range(60) if config.should_save_step(s)] == [5, 20, 30, 45]


def test_defaults_and_strings_accepted():
    assert SaveConfigMode().to_json_dict() == {
        "save_interval": 500,
        "save_steps": [],
        "start_step": 0,
        "end_step": None,
    }
    mode = SaveConfigMode(save_interval="10", start_step="2", end_step="30", save_steps="7,3, 7")
    assert (mode.save_interval, mode.start_step, mode.end_step, mode.save_steps) == (10, 2, 30, [3, 7])
    assert SaveConfigMode(save_steps=[7, 3]) == SaveConfigMode(save_steps="3,7")
    assert SaveConfigMode(save_steps=range(0, 30, 10)).save_steps == [0, 10, 20]  # any iterable of steps
    assert SaveConfigMode(save_steps=np.array([7, 3])).save_steps == [3, 7]


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"save_interval": 0}, "save_interval", "0"),
        ({"save_interval": "abc"}, "save_interval", "'abc'"),
        ({"save_interval": 2.5}, "save_interval", "2.5"),
        ({"save_interval": True}, "save_interval", "True"),
        ({"start_step": -1}, "start_step", "-1"),
        ({"end_step": "x"}, "end_step", "'x'"),
        ({"save_steps": [1, "b"]}, "save_steps", "'b'"),
        ({"save_steps": "1,-2"}, "save_steps", "'1,-2'"),
        ({"save_steps": 5}, "save_steps", "save_interval=5"),  # refused as in smdebug 1.0
    ],
)
def test_bad_save_values_name_field_and_value(kwargs, field, value):
    with pytest.raises(ConfigError) as info:
        SaveConfig(**kwargs)
    assert field in str(info.value) and value in str(info.value)


def test_assignment_is_validated():
    mode = SaveConfigMode()
    mode.save_interval = "5"
    assert mode.save_interval == 5
    with pytest.raises(ConfigError, match=r"save_interval.*-3"):
        mode.save_interval = -3


# -- SaveConfig per mode ----------------------------------------------------------------------------------
def test_reference_per_mode_example():
    config = SaveConfig(
        mode_save_configs={
            smdebug.modes.TRAIN: SaveConfigMode(save_interval=1),
            smdebug.modes.EVAL: SaveConfigMode(save_interval=2),
            smdebug.modes.PREDICT: SaveConfigMode(save_interval=3),
            smdebug.modes.GLOBAL: SaveConfigMode(save_interval=4),
        }
    )
    steps = range(13)
    assert saved(config, ModeKeys.TRAIN, steps) == list(range(13))
    assert saved(config, ModeKeys.EVAL, steps) == [0, 2, 4, 6, 8, 10, 12]
    assert saved(config, ModeKeys.PREDICT, steps) == [0, 3, 6, 9, 12]
    assert saved(config, ModeKeys.GLOBAL, steps) == [0, 4, 8, 12]
    assert all(config.is_mode_set(m) for m in ModeKeys)


def test_modes_not_given_take_the_defaults():
    config = SaveConfig(mode_save_configs={"train": {"save_interval": "10", "start_step": 5}})
    assert config.get_save_config(ModeKeys.TRAIN) == SaveConfigMode(save_interval=10, start_step=5)
    assert config.is_mode_set("TRAIN") and not config.is_mode_set(ModeKeys.EVAL)
    for mode in (ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL):
        assert config.get_save_config(mode) == SaveConfigMode()
        assert saved(config, mode) == [0, 500, 1000]


def test_other_arguments_configure_the_modes_not_listed():
    config = SaveConfig({ModeKeys.TRAIN: {"start_step": 5}}, save_interval=10)
    assert config.get_save_config(ModeKeys.TRAIN) == SaveConfigMode(save_interval=10, start_step=5)
    assert config.get_save_config(ModeKeys.EVAL) == SaveConfigMode(save_interval=10)
    assert config.is_mode_set(ModeKeys.EVAL)


def test_collection_merge_with_hook_default():
    hook = SaveConfig(save_interval=10, end_step=100)
    coll = SaveConfig(mode_save_configs={ModeKeys.EVAL: SaveConfigMode(save_interval=3)})
    coll.merge_default_save_config(hook)
    assert coll.get_save_config(ModeKeys.EVAL) == SaveConfigMode(save_interval=3)
    for mode in (ModeKeys.TRAIN, ModeKeys.PREDICT, ModeKeys.GLOBAL):
        assert coll.get_save_config(mode) == SaveConfigMode(save_interval=10, end_step=100)
        assert not coll.is_mode_set(mode)
    # The copies are the collection's own: changing them leaves the hook alone.
    coll.get_save_config(ModeKeys.TRAIN).save_interval = 7
    assert hook.get_save_config(ModeKeys.TRAIN).save_interval == 10


def test_end_step_zero_disables_a_collection():
    coll = SaveConfig()
    coll.end_step = 0
    for mode in ModeKeys:
        assert saved(coll, mode) == []
    assert coll.end_step == 0


def test_end_step_set_before_merge_survives_it():
    coll = SaveConfig(mode_save_configs={})  # every mode left to the hook
    coll.end_step = 0
    coll.start_step = "3"
    coll.merge_default_save_config(SaveConfig(save_interval=2))
    assert coll.get_save_config(ModeKeys.TRAIN) == SaveConfigMode(save_interval=2, start_step=3, end_step=0)
    assert saved(coll, ModeKeys.TRAIN) == []


def test_property_getter_shared_or_global():
    config = SaveConfig({ModeKeys.TRAIN: {"save_interval": 1}, ModeKeys.GLOBAL: {"save_interval": 4}})
    assert config.save_interval == 4
    assert config.start_step == 0
    config.save_interval = 8
    assert all(config.get_save_config(m).save_interval == 8 for m in ModeKeys)
    config.save_steps = "1,2"
    assert config.get_save_config(ModeKeys.EVAL).save_steps == [1, 2]
    with pytest.raises(ConfigError, match="save_interval"):
        config.save_interval = 0


def test_set_save_config_and_bad_modes():
    config = SaveConfig()
    config.set_save_config("eval", {"save_interval": 3})
    assert config.get_save_config(ModeKeys.EVAL).save_interval == 3
    with pytest.raises(ConfigError, match=r"mode_save_configs: invalid value 'bogus'"):
        SaveConfig(mode_save_configs={"bogus": SaveConfigMode()})
    with pytest.raises(ConfigError, match="SaveConfigMode"):
        config.set_save_config(ModeKeys.TRAIN, 5)
    with pytest.raises(ConfigError, match=r"save_intervall: unknown key with value 3"):
        SaveConfig.from_dict({"TRAIN": {"save_intervall": 3}})


def test_parse():
    assert SaveConfig.parse(None) == SaveConfig()
    config = SaveConfig(save_interval=3)
    assert SaveConfig.parse(config) is config
    assert SaveConfig.parse(SaveConfigMode(save_interval=3)) == config
    assert SaveConfig.parse({"save_interval": 3}) == config
    assert SaveConfig.parse({"TRAIN": {"save_interval": 3}}).get_save_config("train").save_interval == 3
    with pytest.raises(ConfigError, match="save_config"):
        SaveConfig.parse(3)


def test_save_config_json_round_trip():
    config = SaveConfig({ModeKeys.TRAIN: SaveConfigMode(save_interval=1, save_steps=[5])}, end_step=50)
    data = config.to_json_dict()
    assert list(data) == ["TRAIN", "EVAL", "PREDICT", "GLOBAL"]
    assert data["TRAIN"] == {"save_interval": 1, "save_steps": [5], "start_step": 0, "end_step": None}
    assert data["EVAL"] == {"save_interval": 500, "save_steps": [], "start_step": 0, "end_step": 50}
    back = SaveConfig.from_dict(json.loads(json.dumps(data)))
    assert back == config
    assert SaveConfig.from_dict(None) is None
    assert config != SaveConfig()
    assert "TRAIN=SaveConfigMode(save_interval=1" in repr(config)


def test_from_dict_reads_smdebug_unset_modes():
    config = SaveConfig.from_dict(
        {"TRAIN": {"save_interval": 2}, "EVAL": None}, default_values={"end_step": 9}
    )
    assert config.get_save_config("TRAIN") == SaveConfigMode(save_interval=2, end_step=9)
    assert not config.is_mode_set("EVAL")


# -- ReductionConfig ----------------------------------------------------------------------------------
def test_reference_reduction_example():
    config = ReductionConfig(reductions=["std", "variance"], abs_reductions=["mean"], norms=["l1"])
    assert config.reduction_pairs() == [("std", False), ("variance", False), ("l1", False), ("mean", True)]
    assert config.save_raw_tensor is False and config.save_shape is False


def test_reduction_lists_as_strings_and_validation():
    config = ReductionConfig(reductions="min, max", abs_norms="l2", save_raw_tensor="true", save_shape="0")
    assert config.reductions == ["min", "max"] and config.abs_norms == ["l2"]
    assert config.save_raw_tensor is True and config.save_shape is False
    with pytest.raises(ConfigError) as info:
        ReductionConfig(reductions=["mean", "avg"])
    assert "reductions" in str(info.value) and "'avg'" in str(info.value) and "median" in str(info.value)
    with pytest.raises(ConfigError, match=r"norms.*'l3'.*l1, l2"):
        ReductionConfig(norms=["l3"])
    with pytest.raises(ConfigError, match=r"abs_reductions.*'l1'"):
        ReductionConfig(abs_reductions=["l1"])
    with pytest.raises(ConfigError, match=r"save_raw_tensor.*'yes'"):
        ReductionConfig(save_raw_tensor="yes")


REFERENCE_REDUCTIONS = (
    "min max median mean std variance sum prod l1 l2 "
    "abs_min abs_max abs_median abs_mean abs_std abs_variance abs_sum abs_prod abs_l1 abs_l2"
).split()


def test_all_twenty_reduction_names_of_the_reference():
    assert len(REFERENCE_REDUCTIONS) == 20
    config = ReductionConfig.from_reductions_string(",".join(REFERENCE_REDUCTIONS))
    plain = ["min", "max", "median", "mean", "std", "variance", "sum", "prod"]
    assert config.reductions == plain and config.abs_reductions == plain
    assert config.norms == ["l1", "l2"] and config.abs_norms == ["l1", "l2"]
    assert len(config.reduction_pairs()) == 20
    for name in REFERENCE_REDUCTIONS:
        single = ReductionConfig.from_reductions_string(name)
        (pair,) = single.reduction_pairs()
        assert pair == (name.removeprefix("abs_"), name.startswith("abs_"))


def test_reductions_string_parsing():
    config = ReductionConfig.from_reductions_string("min,abs_max,l2", save_raw_tensor="True")
    assert config == ReductionConfig(
        reductions=["min"], abs_reductions=["max"], norms=["l2"], save_raw_tensor=True
    )
    # smdebug's own spelling of norms
    assert ReductionConfig.from_reductions_string("l1_norm,abs_l2_norm") == ReductionConfig(
        norms=["l1"], abs_norms=["l2"]
    )
    assert ReductionConfig.from_reductions_string("") == ReductionConfig()
    with pytest.raises(ConfigError) as info:
        ReductionConfig.from_reductions_string("min,abs_avg", field="HookParameters.reductions")
    assert "HookParameters.reductions" in str(info.value) and "'abs_avg'" in str(info.value)


def test_reduction_pairs_without_duplicates():
    config = ReductionConfig(reductions=["max", "max", "min"], abs_reductions=["max"])
    assert config.reduction_pairs() == [("max", False), ("min", False), ("max", True)]


def test_reduction_config_json_round_trip_in_smdebug_form():
    config = ReductionConfig(
        reductions=["mean"], abs_reductions=["max"], norms=["l2"], abs_norms=["l1"], save_shape=True
    )
    data = config.to_json_dict()
    assert data == {
        "save_raw_tensor": False,
        "reductions": "mean,l2_norm,abs_max,abs_l1_norm",
        "save_shape": True,
    }
    assert ReductionConfig.from_dict(json.loads(json.dumps(data))) == config
    assert ReductionConfig.from_dict({"norms": ["l1"], "save_raw_tensor": "true"}) == ReductionConfig(
        norms=["l1"], save_raw_tensor=True
    )
    assert ReductionConfig.from_dict(None) is None
    with pytest.raises(ConfigError, match=r"bogus: unknown key with value 1"):
        ReductionConfig.from_dict({"bogus": 1})


@pytest.mark.parametrize(
    "text, value", [("True", True), ("true", True), ("1", True), ("False", False), ("0", False)]
)
def test_bool_strings(text, value):
    assert to_bool(text) is value
    assert to_bool(value) is value


def test_bad_bool_string():
    with pytest.raises(ConfigError, match=r"save_shape.*'maybe'"):
        ReductionConfig(save_shape="maybe")


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: SaveConfig(save_intreval=3),
            "SaveConfig got an unexpected argument 'save_intreval'; did you mean 'save_interval'?",
        ),
        (lambda: SaveConfigMode(save_step=[1]), "did you mean 'save_steps'?"),
        (lambda: ReductionConfig(reduction=["mean"]), "did you mean 'reductions'?"),
        (lambda: smdebug.Collection("w", include_regexs=["a"]), "did you mean 'include_regex'?"),
        (lambda: ReductionConfig(zzz=1), "(it takes reductions, abs_reductions, norms"),
    ],
)
def test_a_mistyped_keyword_names_the_nearest_one(make, message):
    with pytest.raises(TypeError) as info:
        make()
    assert message in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"save_interval": 5},
            "save_interval is a SaveConfig setting: save_config=smd.SaveConfig(save_interval=5)",
        ),
        ({"save_steps": [1, 2]}, "save_config=smd.SaveConfig(save_steps=[1, 2])"),
        ({"save_intervals": 3}, "save_config=smd.SaveConfig(save_interval=3)"),
        (
            {"norms": ["l2"]},
            "norms is a ReductionConfig setting: reduction_config=smd.ReductionConfig(norms=['l2'])",
        ),
        ({"include_collection": ["weights"]}, "did you mean 'include_collections'?"),
    ],
)
def test_a_hook_given_a_save_or_reduction_setting_says_where_it_goes(tmp_path, kwargs, message):
    # the JSON configuration's HookParameters take save_interval..., so scripts give them to a hook too
    from smdebug.hook import BaseHook

    with pytest.raises(TypeError, match="a hook got an unexpected argument") as info:
        BaseHook(out_dir=str(tmp_path / "run"), **kwargs)
    assert message in str(info.value)
