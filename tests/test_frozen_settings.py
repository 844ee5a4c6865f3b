"""The parsed profiles.yaml refuses changes in place (``utils.frozen``), and its run keys are those
of the file as written."""
import copy
import json
import pickle

import pytest

from plugin_lib.harness import models
from plugin_lib.harness import profile as config
from plugin_lib.utils.frozen import FrozenDict, FrozenList, freeze


def test_every_change_in_place_at_any_depth_raises_naming_the_remedy(profiles_as_written):
    settings = config.settings()
    twin = models.model_spec("llama-3.1-8b-twin-small")  # a plain dict around the registry's own entries
    rope = twin["config"]["rope_scaling"]
    seeds = settings["profiles"]["smoke"]["seeds"]
    changes = [lambda: settings.__setitem__("models", {}), lambda: settings["models"].pop("gpt2-xl"),
               lambda: rope.update(rope_theta=1.0), lambda: rope.setdefault("rope_theta", 1.0),
               lambda: twin["config"].__delitem__("vocab_size"), lambda: seeds.append(9), lambda: seeds.sort(),
               lambda: seeds.__setitem__(0, 9), lambda: seeds.__iadd__([9])]
    for change in changes:
        with pytest.raises(TypeError, match="cannot be changed in place: change a copy"):
            change()
    assert settings == profiles_as_written
    twin["display"] = "mine"  # the spec's own top level is the caller's to change
    assert models.model_spec("llama-3.1-8b-twin-small")["display"] != "mine"


def test_frozen_settings_read_and_hash_as_the_file_as_written(profiles_as_written):
    settings = config.settings()
    assert isinstance(settings["profiles"], dict) and isinstance(settings["profiles"]["smoke"]["seeds"], list)
    # json writes them as it writes plain dicts and lists, so run keys are unchanged
    assert json.dumps(settings, sort_keys=True) == json.dumps(profiles_as_written, sort_keys=True)
    assert json.dumps(settings) == json.dumps(profiles_as_written)


@pytest.mark.parametrize("thaw", [copy.deepcopy, lambda v: pickle.loads(pickle.dumps(v))], ids=["deepcopy", "pickle"])
def test_a_deep_copy_or_a_pickled_copy_is_plain_and_free_to_change(thaw):
    value = freeze({"a": [1, {"b": [2]}], "c": {"d": 3}})
    assert type(value) is FrozenDict and type(value["a"]) is FrozenList and type(value["a"][1]) is FrozenDict
    copied = thaw(value)
    assert copied == value and type(copied) is dict and type(copied["a"]) is list and type(copied["a"][1]) is dict
    copied["a"][1]["b"].append(4)
    copied["c"]["e"] = 5
    assert value == {"a": [1, {"b": [2]}], "c": {"d": 3}}
    assert type(copy.copy(value)) is dict and type(copy.copy(value["a"])) is list
