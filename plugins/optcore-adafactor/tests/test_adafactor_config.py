"""Hyper-parameter validation: the schema, direct construction, param groups."""

from __future__ import annotations

import pytest
import torch

from optcore import ConfigError
from optcore.plugin import validate_hparams
from optcore_adafactor import Adafactor, AdafactorConfig

DEFAULTS = {
    "lr": None,
    "eps": (1e-30, 1e-3),
    "clip_threshold": 1.0,
    "decay_rate": -0.8,
    "beta1": None,
    "weight_decay": 0.0,
    "scale_parameter": True,
    "relative_step": True,
    "warmup_init": False,
}


def _params() -> list[torch.Tensor]:
    return [torch.zeros(3, 2, requires_grad=True)]


def test_defaults_are_those_of_fairseq_and_hugging_face() -> None:
    # plus optcore's own switch of the implementation, which changes no number
    expected = {**DEFAULTS, "implementation": "auto"}
    assert validate_hparams(AdafactorConfig, {}, "Adafactor") == expected
    assert {k: v for k, v in Adafactor(_params()).defaults.items()} == expected


def test_schema_lists_every_init_argument() -> None:
    import inspect

    init = [n for n in inspect.signature(Adafactor.__init__).parameters if n not in ("self", "params")]
    assert list(AdafactorConfig.model_fields) == init
    assert all(f.description for f in AdafactorConfig.model_fields.values())


@pytest.mark.parametrize(
    ("config", "field", "advice"),
    [
        ({"lr": 1e-3}, "lr", "relative_step=False"),
        ({"relative_step": False}, "lr", "set lr"),
        ({"relative_step": False, "lr": 1e-3, "warmup_init": True}, "warmup_init", "relative_step=True"),
    ],
)
def test_conflicting_step_size_settings_say_what_to_change(config: dict, field: str, advice: str) -> None:
    for build in (lambda: validate_hparams(AdafactorConfig, config, "Adafactor"), lambda: Adafactor(_params(), **config)):
        with pytest.raises(ConfigError) as info:
            build()
        assert [p[0] for p in info.value.problems] == [field]
        assert advice in str(info.value)


def test_every_bad_field_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        Adafactor(_params(), eps=(1e-30,), beta1=1.0, clip_threshold=0.0, decay_rate=0.5, weight_decay=-1)
    fields = {p[0].split(".")[0] for p in info.value.problems}
    assert fields == {"eps", "beta1", "clip_threshold", "decay_rate", "weight_decay"}


def test_strings_from_config_files_are_parsed() -> None:
    values = validate_hparams(
        AdafactorConfig,
        {"eps": "(1e-30, 1e-3)", "beta1": "0.9", "lr": "1e-3", "relative_step": "false", "scale_parameter": "False"},
        "Adafactor",
    )
    assert values["eps"] == (1e-30, 1e-3) and values["beta1"] == 0.9 and values["lr"] == 1e-3
    assert values["relative_step"] is False and values["scale_parameter"] is False


def test_unknown_field_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match="did you mean 'clip_threshold'"):
        validate_hparams(AdafactorConfig, {"clip_treshold": 1.0}, "Adafactor")


def test_scheduler_advice_is_in_the_field_descriptions() -> None:
    fields = AdafactorConfig.model_fields
    for name in ("lr", "relative_step", "scale_parameter"):
        text = fields[name].description or ""
        assert "relative_step=False" in text and "scale_parameter=False" in text, name


def test_param_groups_are_validated_too() -> None:
    with pytest.raises(ConfigError, match="relative_step=False"):
        Adafactor([{"params": _params(), "lr": 0.1}])
    opt = Adafactor([{"params": _params()}, {"params": _params(), "beta1": "0.5"}])
    assert opt.param_groups[1]["beta1"] == 0.5 and opt.param_groups[0]["beta1"] is None
