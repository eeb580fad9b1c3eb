"""The evaluation's settings are declared once (evaluation.settings): freeatten-eval's flags, their checks and --help,
and the settings that make results comparable (--merge) all derive from the fields of `Settings`."""

import dataclasses
import re

import pytest
from absl import flags

from freeatten_jax.cli import fields
from freeatten_jax.errors import UserError
from freeatten_jax.evaluation import results
from freeatten_jax.evaluation.settings import MQAR, TEXT, Settings, compared
from freeatten_jax.schema import integer, option


def _flags(cls, *args):
    """(the parsed flags `define` made for `cls` from the command line `args`, their holders)."""
    values = flags.FlagValues()
    holders = fields.define(cls, __name__, values)
    values(["prog", *args])
    return values, holders


def test_a_new_setting_becomes_a_flag_and_a_compared_setting():
    extended = dataclasses.make_dataclass(
        "Extended",
        [("stride", int, option(3, help="Tokens between windows.", check=integer(1), shapes=(TEXT,)))],
        bases=(Settings,),
        frozen=True,
    )
    values, holders = _flags(extended, "--stride=5", "--multipliers=4,1")
    assert values["stride"].default == 3 and values["stride"].help == "Tokens between windows."
    assert fields.value(extended, holders) == extended(stride=5, multipliers=(1, 4))
    with pytest.raises(flags.IllegalFlagValueError, match=re.escape("--stride=0: is invalid; allowed: an integer >= 1")):
        _flags(extended, "--stride=0")
    assert "stride" in compared(extended, mqar=False) and "stride" not in compared(Settings, mqar=True)
    ours = dataclasses.asdict(extended(stride=5))
    with pytest.raises(UserError, match=re.escape("x: measured with stride=3, this evaluation with 5; remedy")):
        results.check_alike("x", {**ours, "stride": 3}, ours, compared(extended, mqar=False), "remedy", extended)


def test_results_written_before_a_setting_existed_count_as_measured_under_its_default(tmp_path):
    extended = dataclasses.make_dataclass(
        "Extended", [("stride", int, option(3, help="h", shapes=(TEXT,)))], bases=(Settings,), frozen=True
    )
    described = {**dataclasses.asdict(extended()), "workdirs": [], "switches": []}
    earlier = tmp_path / "results.json"
    results.write(earlier, [], {k: v for k, v in described.items() if k != "stride"})
    results.earlier([str(earlier)], described, set(), mqar=False, kind=extended)  # the default: alike
    with pytest.raises(UserError, match=re.escape(f"--merge={earlier}: measured with stride=3, this evaluation with 5")):
        results.earlier([str(earlier)], {**described, "stride": 5}, set(), mqar=False, kind=extended)


def test_merge_refuses_results_measured_under_a_new_setting(tmp_path):
    extended = dataclasses.make_dataclass(
        "Extended", [("stride", int, option(3, help="h", shapes=(MQAR,)))], bases=(Settings,), frozen=True
    )
    described = {**dataclasses.asdict(extended()), "workdirs": [], "switches": []}
    earlier = tmp_path / "results.json"
    results.write(earlier, [], {**described, "stride": 4})
    results.earlier([str(earlier)], described, set(), mqar=False, kind=extended)  # an MQAR setting, text runs: alike
    with pytest.raises(UserError, match=re.escape(f"--merge={earlier}: measured with stride=4, this evaluation with 3")):
        results.earlier([str(earlier)], described, set(), mqar=True, kind=extended)


def test_every_setting_is_a_flag_with_its_default_and_the_compared_ones_are_marked():
    values, holders = _flags(Settings)
    assert fields.value(Settings, holders) == Settings()
    assert [f.name for f in dataclasses.fields(Settings)] == [name for name in holders]
    text = ("multipliers", "eval_tokens", "span_windows", "passkey_depths", "passkey_keys", "passkey_candidates")
    text += ("analysis_windows", "seed", "ruler", "ruler_examples", "ruler_candidates")
    assert compared(Settings, mqar=False) == text  # not implementation, context nor ruler_keep (the report's)
    assert compared(Settings, mqar=True) == (*text, "mqar_instances", "mqar_placements")


def test_a_list_setting_off_by_default_takes_an_empty_value():
    assert fields.value(Settings, _flags(Settings, "--ruler=niah_single,vt")[1]).ruler == ("niah_single", "vt")
    assert fields.value(Settings, _flags(Settings, "--ruler=")[1]).ruler == ()  # while --mqar_placements= is refused


@pytest.mark.parametrize(
    "arg, allowed",
    [
        ("--mqar_placements=start,middle", "some of start, end, dilute"),
        ("--mqar_placements=", "some of start, end, dilute"),
        ("--ruler=vt,niah", "some of niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe"),
        ("--ruler_keep=0", "a number in (0, 1]"),
        ("--passkey_depths=0.5,nan", "numbers in [0, 1]"),
        ("--eval_tokens=1.5", "an integer >= 0"),
        ("--seed=-1", "an integer >= 0"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_allowed_values(arg, allowed):
    with pytest.raises(flags.IllegalFlagValueError, match=re.escape(f"{arg}: is invalid; allowed: {allowed}")):
        _flags(Settings, arg)


def test_multipliers_are_ascending_however_given_so_the_last_is_the_longest():
    assert Settings(multipliers=(16, 1, 4)).multipliers == (1, 4, 16)
    assert dataclasses.replace(Settings(), multipliers=(8, 2)).multipliers == (2, 8)
