"""smdebug 1.0's configuration API where we differed: HookParameters.include_collections in the JSON
configuration, and the JSON round trip of SaveConfig, SaveConfigMode and ReductionConfig."""

import json

import pytest

from smdebug.config import ReductionConfig, SaveConfig, SaveConfigMode
from smdebug.exceptions import ConfigError
from smdebug.json_config import parse_hook_config
from smdebug.modes import ModeKeys


# -- HookParameters.include_collections ---------------------------------------------------------------------
def test_hook_parameters_include_collections_is_a_comma_separated_string():
    config = parse_hook_config(
        {"LocalPath": "/tmp/x", "HookParameters": {"include_collections": "weights, losses,gradients"}}
    )
    assert config.include_collections == ["weights", "losses", "gradients"]


def test_hook_parameters_include_collections_joins_the_configured_collections():
    config = parse_hook_config(
        {
            "LocalPath": "/tmp/x",
            "HookParameters": {"include_collections": "losses,weights"},
            "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "biases"}],
        }
    )
    assert config.include_collections == ["weights", "biases", "losses"]


def test_hook_parameters_include_collections_bad_value_is_one_clear_error():
    with pytest.raises(ConfigError, match="HookParameters.include_collections"):
        parse_hook_config({"LocalPath": "/tmp/x", "HookParameters": {"include_collections": 3}})


# -- to_json / from_json ------------------------------------------------------------------------------------
def test_save_config_mode_json_round_trip():
    mode = SaveConfigMode(save_interval=7, start_step=2, end_step=30, save_steps=[1, 5])
    text = mode.to_json()
    assert json.loads(text) == {"save_interval": 7, "save_steps": [1, 5], "start_step": 2, "end_step": 30}
    assert SaveConfigMode.from_json(text) == mode


def test_save_config_json_round_trip_keeps_each_mode():
    config = SaveConfig(
        mode_save_configs={
            ModeKeys.TRAIN: SaveConfigMode(save_interval=3),
            ModeKeys.EVAL: SaveConfigMode(save_steps=[4, 8]),
        }
    )
    text = config.to_json()
    data = json.loads(text)
    assert set(data) == {"TRAIN", "EVAL", "PREDICT", "GLOBAL"}
    assert data["TRAIN"]["save_interval"] == 3
    back = SaveConfig.from_json(text)
    assert back == config
    assert back.to_json_dict() == config.to_json_dict()
    assert back.get_save_config(ModeKeys.EVAL).save_steps == [4, 8]


def test_reduction_config_json_round_trip_in_smdebug_form():
    config = ReductionConfig(reductions=["min"], abs_reductions=["max"], norms=["l1"], abs_norms=["l2"])
    text = config.to_json()
    assert json.loads(text)["reductions"] == "min,l1_norm,abs_max,abs_l2_norm"
    assert ReductionConfig.from_json(text) == config
    assert ReductionConfig.from_dict(config.to_json_dict()) == config


@pytest.mark.parametrize("empty", [None, "", "  ", "null", "{}"])
def test_from_json_of_an_empty_configuration_gives_the_defaults(empty):
    assert SaveConfig.from_json(empty) == SaveConfig()
    assert SaveConfigMode.from_json(empty) == SaveConfigMode()
    assert ReductionConfig.from_json(empty) == ReductionConfig()


def test_from_json_of_bad_json_is_one_clear_error():
    with pytest.raises(ConfigError, match="SaveConfig.from_json: invalid JSON"):
        SaveConfig.from_json("{save_interval: 3")


# -- a hook's collections read the hook's save configuration (reference: Creating or retrieving a Collection) --
def test_a_hooks_collections_read_its_save_config_until_given_their_own(tmp_path):
    """The reference: a collection get_collection creates "uses the reduction configuration and save
    configuration passed to the hook"; the built-in ones too, before training as after."""
    from smdebug.collection import Collection
    from smdebug.hook import BaseHook

    hook = BaseHook(
        out_dir=str(tmp_path / "run"),
        save_config=SaveConfig(
            mode_save_configs={ModeKeys.EVAL: SaveConfigMode(save_interval=3)}, save_interval=7
        ),
    )
    for coll in (hook.get_collection("losses"), hook.get_collection("brand_new")):
        assert coll.save_config.get_save_config(ModeKeys.TRAIN).save_interval == 7, coll.name
        assert coll.save_config.get_save_config(ModeKeys.EVAL).save_interval == 3, coll.name
    added = Collection("added", include_regex=["x"])
    added.save_config = SaveConfig(mode_save_configs={ModeKeys.TRAIN: SaveConfigMode(save_steps=[2])})
    hook.add_collection(added)
    assert added.save_config.get_save_config(ModeKeys.TRAIN).save_steps == [2]  # its own
    assert added.save_config.get_save_config(ModeKeys.EVAL).save_interval == 3  # the hook's
    # the reference's way to stop a default collection still works, before and after training starts
    hook.get_collection("losses").save_config.end_step = 0
    hook.begin_step()
    assert not hook.has_due_collection("losses")
    hook.end_step()
    hook.close()


def test_save_config_mode_save_configs_attribute_holds_each_mode():
    """smdebug 1.0's SaveConfig keeps its modes in ``mode_save_configs``, which scripts read."""
    config = SaveConfig(mode_save_configs={ModeKeys.TRAIN: SaveConfigMode(save_interval=2)}, save_interval=5)
    modes = config.mode_save_configs
    assert set(modes) == set(ModeKeys)
    assert modes[ModeKeys.TRAIN] == SaveConfigMode(save_interval=2)
    assert modes[ModeKeys.EVAL] == SaveConfigMode(save_interval=5)
    modes[ModeKeys.EVAL].save_interval = 3  # the mode's own object: a change to it is the config's
    assert config.should_save_step(ModeKeys.EVAL, 3) and not config.should_save_step(ModeKeys.EVAL, 5)


def test_save_config_from_save_config_mode_configures_every_mode():
    config = SaveConfig.from_save_config_mode(SaveConfigMode(save_interval=4, end_step=9))
    assert all(config.is_mode_set(m) for m in ModeKeys)
    assert [s for s in range(12) if config.should_save_step(ModeKeys.EVAL, s)] == [0, 4, 8]
    with pytest.raises(ConfigError, match="save_config_mode"):
        SaveConfig.from_save_config_mode({"save_interval": 4})


# -- a value of the wrong type: smdebug 1.0's TypeError, and still our ConfigError ---------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda c: setattr(c, "save_config", 5),
        lambda c: SaveConfig(mode_save_configs=5),
        lambda c: SaveConfig.from_save_config_mode({"save_interval": 2}.items()),
        lambda c: ReductionConfig(reductions=5),
        lambda c: ReductionConfig(norms=["l2", 3]),
    ],
    ids=["collection.save_config", "mode_save_configs", "from_save_config_mode", "reductions", "norms"],
)
def test_a_configuration_value_of_the_wrong_type_is_a_type_error(make):
    from smdebug.core.collection import Collection

    with pytest.raises(TypeError) as caught:
        make(Collection("c"))
    assert isinstance(caught.value, ConfigError)  # (our callers catch ConfigError)
    assert "expected" in str(caught.value)


@pytest.mark.parametrize("bad", [5, ["weights", 3]])
def test_collection_include_of_a_non_string_says_so(bad):
    from smdebug.core.collection import Collection

    coll = Collection("c")
    with pytest.raises(TypeError, match="include_regex: expected a string or a list of strings"):
        coll.include(bad)
    coll.include(("a.*", "b.*"))  # any iterable of strings, as before
    assert coll.include_regex == ["a.*", "b.*"]


def test_get_collection_without_create_of_a_missing_one_is_smdebugs_error(tmp_path):
    from smdebug.exceptions import SMDebugError
    from smdebug.hook import BaseHook

    hook = BaseHook(out_dir=str(tmp_path / "run"))
    with pytest.raises(SMDebugError, match="'nope' does not exist") as caught:
        hook.get_collection("nope", create=False)
    assert isinstance(caught.value, KeyError)  # what a mapping raises, as before
    assert hook.get_collection("losses", create=False).name == "losses"
    hook.close()
