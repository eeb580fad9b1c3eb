"""The extrapolation suite end to end on tiny checkpoints trained here; freeatten-generate on them."""

import csv
import dataclasses
import gzip
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import read_metrics

from freeatten_jax import data
from freeatten_jax.configs import base
from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.evaluation import loss, passkey, results, suite, switches
from freeatten_jax.training import config


def _config(variant, text_glob):
    cfg = base.get_config(variant, "tiny")
    cfg.model.update(num_layers=1, d_model=32, num_heads=2, mlp_dim=64)  # every layer: test_eval_metrics' switches
    cfg.data.update(source="text", path=text_glob, val_fraction=0.1)
    cfg.train.update(steps=12, batch_size=8, seq_len=32, log_every=6, eval_every=12, eval_windows=6, checkpoint_every=12)
    cfg.optim.warmup_steps = 2
    cfg.checkpoint.async_save = False
    return cfg


@pytest.fixture(scope="module")
def trained(text_glob, trained_run):
    """{variant: (workdir, final training metrics)} for tiny lssa and ssmax runs on the session's corpus."""
    runs = {}
    for variant in ("lssa", "ssmax"):
        workdir = trained_run(f"eval-{variant}", _config(variant, text_glob))
        runs[variant] = (str(workdir), read_metrics(workdir)[-1])
    return runs


SETTINGS = suite.Settings(multipliers=(1, 2, 8), eval_tokens=3 * 257, passkey_depths=(0.5,), passkey_keys=1, passkey_candidates=4)


@pytest.mark.slow
def test_suite_writes_every_output(trained, tmp_path, capsys):
    workdirs = [trained["lssa"][0], trained["ssmax"][0]]
    runs = suite.run_suite(workdirs, ["p=off", "s=0.5"], SETTINGS, str(tmp_path))  # p=15: below; RoPE: test_eval_metrics
    progress = capsys.readouterr().err  # the plan, the bar naming the run and the task, then the estimate
    assert progress.startswith(
        "evaluating 3 run(s) (checkpoint x switch) at 3 lengths (1x, 2x, 8x), 1 passkey depth(s) x 1 key(s)"
    )
    assert "lssa (lssa) [none]" in progress and "ssmax (ssmax) [s=0.5]" in progress and "loss at length 256" in progress
    assert "passkey at length 64" in progress and "first of 3 runs took " in progress
    said = progress.splitlines()[1:4]  # each switch that gives no row, said once, after the plan
    assert said == [
        f"{workdirs[0]}: p=off is lssa's own p: no extra row",
        f"{workdirs[0]}: switch s applies to ssmax checkpoints, not lssa",
        f"{workdirs[1]}: switch p applies to lssa/lssar checkpoints, not ssmax",
    ]
    labels = [(r.variant, r.switch) for r in runs]
    assert labels == [("lssa", "none"), ("ssmax", "none"), ("ssmax", "s=0.5")]  # p=off changes nothing: skipped
    saved, _ = results.read(tmp_path / "results.json")
    assert saved == runs  # results.json holds the typed results, read back equal
    for name in ("loss_vs_length", "per_position", "passkey", "attention", "needle_mass", "ssmax_s"):
        with (tmp_path / f"{name}.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert rows, name
    for name in ("loss_vs_length", "per_position", "passkey", "retrieval", "entropy_vs_n"):
        png = (tmp_path / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 1000
    report = (tmp_path / "report.md").read_text()
    assert {r.loss_unit for r in runs} == {"nats per byte"} and "mean next-token loss, nats per byte, [95%" in report
    assert "Not scored (n/a):\n- length 32: the passkey prompt without filler is 247 tokens" in report
    for heading in ("Loss vs length", "Passkey retrieval", "Attention entropy", "Learned SSMax s", "loss_vs_length.png"):
        assert heading in report
    for r in runs:
        assert [x.length for x in r.lengths] == [32, 64, 256] and r.span_tokens == 3 * 257
        scored = [x.tokens_scored for x in r.lengths]  # the same span at every length, up to one longest window
        assert scored == [23 * 32, 11 * 64, 3 * 256] and max(scored) - min(scored) < 257
        assert all(x.loss_ci[0] <= x.loss <= x.loss_ci[1] for x in r.lengths)
        assert all(np.isfinite(x.loss) and x.windows > 0 for x in r.lengths)
        assert len(r.per_position) == 256
        assert {c.length for c in r.passkey if c.accuracy is not None} == {256}
        assert all("longer than the length" in c.reason for c in r.passkey if c.length < 256)
        assert len(r.needle_mass) == 1  # one row per layer
        assert {c.length for c in r.retrieval if c.accuracy is not None} == {64, 256}  # 32 + 1 cannot hold it
    assert runs[1].ssmax_s is not None and runs[0].ssmax_s is None
    # the s override reaches every head
    assert np.allclose(runs[2].ssmax_s, 0.5) and not np.allclose(runs[1].ssmax_s, 0.5)


@pytest.mark.slow
def test_loss_at_1x_equals_training_validation_loss(trained, tmp_path):
    workdir, final = trained["lssa"]
    settings = suite.Settings(multipliers=(1,), eval_tokens=6 * 33, passkey_depths=())  # training's: 6 windows of 32 + 1
    run = suite.run_suite([workdir], [], settings, str(tmp_path))[0]
    one_x = run.lengths[0]
    assert one_x.windows == 6 and one_x.tokens_scored == 6 * 32
    assert one_x.loss == pytest.approx(final["val_loss"], rel=1e-5)
    assert one_x.loss_ci[0] < one_x.loss < one_x.loss_ci[1]


@pytest.mark.slow
def test_merge_reports_earlier_results_beside_new_runs_measured_alike(trained, tmp_path):
    settings = suite.Settings(multipliers=(1, 2), eval_tokens=2 * 65, passkey_depths=())
    (lssa,) = suite.run_suite([trained["lssa"][0]], [], settings, str(tmp_path / "a"))
    earlier = tmp_path / "a" / "results.json.gz"  # as docs/results/ ships it
    earlier.write_bytes(gzip.compress((tmp_path / "a" / "results.json").read_bytes()))
    (ssmax,) = suite.run_suite([trained["ssmax"][0]], [], settings, str(tmp_path / "b"), merge=(str(earlier),))
    both, described = results.read(tmp_path / "b" / "results.json")
    assert both == [lssa, ssmax] and described["workdirs"] == [trained["lssa"][0], trained["ssmax"][0]]
    assert described["merged"] == [str(earlier)]
    other = tmp_path / "other.json"  # a second earlier file: its runs join too
    results.write(other, [dataclasses.replace(lssa, name="other")], {**described, "workdirs": ["other"]})
    suite.run_suite([trained["ssmax"][0]], [], settings, str(tmp_path / "d"), merge=(str(earlier), str(other)))
    assert [r.name for r in results.read(tmp_path / "d" / "results.json")[0]] == [lssa.name, "other", ssmax.name]
    report = (tmp_path / "b" / "report.md").read_text()
    assert f"| {lssa.label} | {lssa.workdir} |" in report and f"| {ssmax.label} | {ssmax.workdir} |" in report
    refused = {  # before anything is measured: no output folder
        "measured with multipliers=[1, 2], this evaluation with [1, 4]": ([trained["ssmax"][0]], (1, 4)),
        f"holds {lssa.name}, which is measured here too": ([trained["lssa"][0]], (1, 2)),
    }
    for message, (workdirs, multipliers) in refused.items():
        changed = dataclasses.replace(settings, multipliers=multipliers)
        with pytest.raises(UserError, match=re.escape(f"--merge={earlier}: {message}")):
            suite.run_suite(workdirs, [], changed, str(tmp_path / "c"), merge=(str(earlier),))
        assert not (tmp_path / "c").exists()
    with pytest.raises(UserError, match="not a results file that freeatten-eval wrote"):
        suite.run_suite([trained["ssmax"][0]], [], settings, str(tmp_path / "c"), merge=(str(tmp_path / "b" / "report.md"),))


@pytest.mark.slow
def test_reweighting_switch_changes_lssa_and_off_reproduces_it(trained, tmp_path):
    settings = suite.Settings(multipliers=(1, 2), eval_tokens=2 * 257, passkey_depths=())
    none, p15 = suite.run_suite([trained["lssa"][0]], ["p=15", "p=off"], settings, str(tmp_path))  # p=off: a no-op here
    off = suite.evaluate(trained["lssa"][0], switches.parse("p=off"), settings, suite.SplitCache())
    losses = lambda r: [x.loss for x in r.lengths]
    assert losses(off) == losses(none) and off.per_position == none.per_position
    assert off.attention == none.attention
    assert all(a != b for a, b in zip(losses(p15), losses(none)))


def test_span_windows_cut_the_same_tokens_at_every_length_and_match_training_windows():
    sequences = [np.arange(1000), np.arange(1000, 1500)]
    for length in (9, 49, 99):
        windows_WL = loss.span_windows(sequences, length, 1200)
        assert windows_WL.shape[1] == length + 1 and windows_WL.max() < 1200  # inside the span only
        assert 1200 - windows_WL.size < 2 * (length + 1)  # each of the 2 sequences loses less than a window
    np.testing.assert_array_equal(loss.span_windows(sequences, 9, 7 * 10), data.eval_windows(sequences, 9, 7))


def test_results_json_reads_back_the_typed_results_written(tmp_path):
    interval = (1.5, 2.5)  # intervals are tuples; JSON holds them as lists
    length = results.LengthLoss(16, 1, 2.0, interval, 2.1, interval, [2.0], 1, 16)
    cell = results.RetrievalCell(16, 0.5)
    run = results.RunResult("r", "runs/r", 6, "lssa", "none", 0, 16, 1e4, lengths=[length], passkey=[cell])
    results.write(tmp_path / "results.json", [run], {"seed": 0})
    assert results.read(tmp_path / "results.json") == ([run], {"seed": 0})


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    values = np.random.default_rng(1).normal(2.0, 0.5, size=64)
    low, high = loss.bootstrap_ci(values, seed=3)
    assert (low, high) == loss.bootstrap_ci(values, seed=3) != loss.bootstrap_ci(values, seed=4)
    assert low < values.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * values.std() / np.sqrt(64), rel=0.2)  # the normal-theory width
    summary = loss.summarise(np.tile(values[:, None], (1, 8)), train_len=4)
    assert summary["tokens_scored"] == 64 * 8 and summary["loss_ci"] == loss.bootstrap_ci(values, seed=0)


LANDMARK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the "
    "important information there.\n"
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The grass\n"
    "The pass key is 40712. Remember it. 40712 is the pass key.\n"
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The grass is green. The sky is blue. Th\n"  # noqa: E501
    "What is the pass key? The pass key is"
)


def test_passkey_prompt_is_the_landmark_text_and_fits_the_length():
    from freeatten_jax.data.tokenizer import ByteTokenizer

    lines = LANDMARK.split("\n")
    before, after = len(lines[1]), len(lines[3])  # filler characters on each side of the needle
    depth = before / (before + after)
    assert passkey.prompt_text(before + after, depth, "40712") == LANDMARK
    tokens_T, needle = passkey.build_prompt(ByteTokenizer(), len(LANDMARK.encode()), depth, "40712")
    assert ByteTokenizer().decode(tokens_T) == LANDMARK  # the most filler that fits, needle at the depth
    assert ByteTokenizer().decode(tokens_T[needle]) == "The pass key is 40712. Remember it. 40712 is the pass key.\n"
    shorter_T, _ = passkey.build_prompt(ByteTokenizer(), len(LANDMARK.encode()) - 1, 0.5, "40712")
    assert len(shorter_T) == len(LANDMARK.encode()) - 1
    with pytest.raises(ValueError, match="without filler is 247 tokens, longer than the length 200"):
        passkey.build_prompt(ByteTokenizer(), 200, 0.5, "40712")


def test_quick_settings_and_the_estimate_line():
    quick = suite.Settings(eval_tokens=0).quick()
    assert (quick.multipliers, quick.passkey_depths, quick.passkey_keys, quick.span_windows) == ((1, 4, 16), (0.5,), 1, 4)
    assert suite.span_tokens(quick, 64) == 4 * (16 * 64 + 1) and suite.span_tokens(suite.Settings(), 64) == 16 * (16 * 64 + 1)
    assert suite.estimate(30.0, 8) == "first of 8 runs took 30 s: the whole evaluation will take about 4 min"
    assert suite.estimate(120.0, 8).endswith("about 16 min; --quick gives a first look in a fraction of that")


def test_passkey_scoring_is_first_integer_equality_and_rank():
    assert passkey.is_retrieved(" 12345.", "12345") and passkey.is_retrieved("is 12345 and 999", "12345")
    assert not passkey.is_retrieved(" 123456", "12345")  # startswith would have counted it
    assert not passkey.is_retrieved(" 1234", "12345") and not passkey.is_retrieved(" the key", "12345")
    assert not passkey.is_retrieved(" 99 then 12345", "12345")  # only the first integer counts
    assert passkey.first_integer("a 7b 8") == "7" and passkey.first_integer("none") is None
    assert passkey.key_rank(-1.0, [-2.0, -3.0]) == 1 and passkey.key_rank(-2.5, [-2.0, -3.0, -1.0]) == 3
    assert passkey.key_rank(-2.0, [-2.0]) == 2  # a tie is not a win


def _fake_run(variant, switch, seed, depths=(0.5,), step=12, train_len=32):
    rng = np.random.default_rng(seed)
    cells = [
        results.RetrievalCell(n, d, keys=2, accuracy=None if n == 32 else float(rng.integers(3)) / 2)
        for n in (32, 64)
        for d in depths
    ]
    lengths = [
        results.LengthLoss(
            n, n // 32, 3.0 + 0.001 * i, (2.9, 3.2), 3.0, (2.9, 3.2), (3.0 + 0.001 * i + rng.normal(0, 0.3, 8)).tolist(), 8, 8 * n
        )
        for i, n in enumerate((32, 64))
    ]
    return results.RunResult(
        name=f"{variant}{seed}",
        workdir="",
        step=step,
        variant=variant,
        switch=switch,
        seed=seed,
        train_len=train_len,
        rope_theta=10_000.0,
        per_position=rng.random(64).tolist(),
        lengths=lengths,
        passkey=cells,
        retrieval=cells,
        attention=results.AttentionStats(rng.random((2, 2, 3)).tolist(), [], [1, 2, 4]),
    )


def test_plots_draw_one_line_per_variant_and_switch_with_seed_bands(tmp_path):
    from freeatten_jax.evaluation import plots

    runs = [
        _fake_run(v, s, seed)
        for seed in (0, 1)
        for v, s in (("softmax", "none"), ("softmax", "rope_theta=50x"), ("lssar", "none"))
    ]
    assert [(key, len(rs)) for key, rs in plots.groups(runs).items()] == [
        (("softmax", "none"), 2),
        (("softmax", "rope_theta=50x"), 2),
        (("lssar", "none"), 2),
    ]
    style = plots.styles(runs)
    assert style("softmax", "none")["color"] == style("softmax", "rope_theta=50x")["color"] != style("lssar", "none")["color"]
    assert (
        style("softmax", "none")["linestyle"]
        == style("lssar", "none")["linestyle"]
        != style("softmax", "rope_theta=50x")["linestyle"]
    )
    for name in plots.write_all(tmp_path, runs).values():
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span():
    """The band is the 95% interval over seeds, then windows (one run: over its windows), the training length is
    marked, and a 0.001-nat wobble is not zoomed into a spike: the y-axis spans at least MIN_LOSS_SPAN."""
    from freeatten_jax.evaluation import plots, stats

    for runs in ([_fake_run("lssar", "none", 0)], [_fake_run("lssar", "none", seed) for seed in (0, 1, 2)]):
        ax = plots.draw_loss_vs_length(runs).axes[0]
        marks = [line for line in ax.lines if list(line.get_xdata()) == [32, 32]]
        assert len(marks) == 1 and "training length" in marks[0].get_label()
        (band,) = ax.collections
        ys = np.concatenate([path.vertices[:, 1] for path in band.get_paths()])
        expected = [stats.mean_with_interval([r.lengths[i].per_window for r in runs])["ci"] for i in range(2)]
        assert ys.min() == pytest.approx(min(low for low, _ in expected)) and ys.max() == pytest.approx(
            max(h for _, h in expected)
        )
        low, high = ax.get_ylim()
        assert high - low >= plots.MIN_LOSS_SPAN and low <= ys.min() and high >= ys.max()
    assert plots.y_limits([0.0], [2.0], 0.5) == pytest.approx((-0.1, 2.1))  # wide data: 5% padding, no forced span


def test_retrieval_plot_is_a_depth_by_length_heatmap_when_the_grid_has_cells():
    from freeatten_jax.evaluation import plots

    runs = [_fake_run("softmax", "none", seed, depths=(0.1, 0.9)) for seed in (0, 1)] + [
        _fake_run("lssar", "none", 0, depths=(0.1, 0.9))
    ]
    lengths, depths, acc_DL = plots.accuracy_grid(runs[:2], "passkey")
    assert lengths == [32, 64] and depths == [0.1, 0.9] and np.isnan(acc_DL[:, 0]).all()
    expected = [np.mean([c.accuracy for r in runs[:2] for c in r.passkey if c.length == 64 and c.depth == d]) for d in depths]
    assert acc_DL[:, 1] == pytest.approx(expected)  # pooled over runs, weighted by keys (equal here)
    fig = plots.draw_accuracy(runs, "passkey", "Passkey")
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in heatmaps] == ["softmax (2 runs)", "lssar"]
    assert heatmaps[0].images[0].get_array().shape == (2, 2)
    single = _fake_run("lssar", "none", 0)
    single.passkey = [results.RetrievalCell(64, 0.5, keys=4, accuracy=0.75)]
    (ax,) = plots.draw_accuracy([single], "passkey", "Passkey").axes  # one cell: a point on a line plot, not a 1x1 map
    assert not ax.images and list(ax.lines[0].get_ydata()) == [0.75]


def test_report_warns_when_compared_runs_differ_in_step_or_training_length():
    from freeatten_jax.evaluation import report

    same = [_fake_run("softmax", "none", 0), _fake_run("lssar", "none", 1)]
    assert report.comparability_warnings(same) == []
    mixed = [_fake_run("softmax", "none", 0, step=51), _fake_run("lssar", "none", 1, step=10, train_len=64)]
    warnings_ = report.comparability_warnings(mixed)
    assert warnings_ == [
        "Warning: the runs compared have different checkpoint steps (10: lssar1; 51: softmax0); their differences are not only the variant's.",  # noqa: E501
        "Warning: the runs compared have different training lengths (32: softmax0; 64: lssar1); their differences are not only the variant's.",  # noqa: E501
    ]


@pytest.mark.parametrize(
    "units, expected",
    [
        (["nats per byte"] * 2, "nats per byte"),
        (["nats per token"] * 2, "nats per token"),
        (["nats per byte", "nats per token"], results.MIXED_UNITS),
        (["", ""], results.MIXED_UNITS),  # results files written before units were recorded
    ],
)
def test_the_report_and_plots_state_the_runs_loss_unit(units, expected, tmp_path):
    """nats per byte for runs of the byte tokenizer (as the README's demo table says), per token for any other; both
    named where the runs differ or a merged file does not say. Attention entropy stays in nats."""
    from freeatten_jax.evaluation import plots, report

    runs = [_fake_run("softmax", "none", 0), _fake_run("lssar", "none", 0)]
    for run, unit in zip(runs, units):
        run.loss_unit = unit
    text = report.markdown(runs, {**dataclasses.asdict(SETTINGS), "multipliers": [1, 2]}, {})
    assert f"## Loss vs length (mean next-token loss, {expected}, [95% bootstrap interval over windows])" in text
    assert f"Loss over all positions ({expected}): mean over runs" in text
    assert f"Loss minus softmax's at the same length ({expected})" in text
    assert f"Rise from 1x: loss at the length minus loss at 1x ({expected})" in text
    assert f"the papers' comparison ({expected})" in text and "Attention entropy (nats)" in text
    assert plots.draw_loss_vs_length(runs).axes[0].get_ylabel() == f"mean next-token loss ({expected})"
    assert plots.draw_per_position(runs).axes[0].get_ylabel() == f"loss ({expected}, moving average)"


def _typed(variant):
    return config.parse(base.get_config(variant))


def test_the_p_switch_keeps_a_frozen_temperature():
    from flax import nnx

    from freeatten_jax.nn import Transformer

    cfg = _typed("lssa_fixed")
    model = Transformer(dataclasses.replace(cfg.model, vocab_size=256), rngs=nnx.Rngs(0))
    switches.apply(model, cfg, switches.parse("p=15"))
    assert [(layer.variant, dict(layer.options)) for layer in model.attention_layers] == [
        ("lssar", {"p": 15.0, "temperature_length": 64.0})
    ] * cfg.model.num_layers


def test_switches_that_change_nothing_are_skipped():
    lssa, lssar = _typed("lssa"), _typed("lssar")
    assert not switches.applicable(lssa, switches.parse("p=off"))
    assert switches.applicable(lssa, switches.parse("p=15"))
    assert not switches.applicable(lssar, switches.parse("p=15"))
    assert switches.applicable(lssar, switches.parse("p=3")) and switches.applicable(lssar, switches.parse("p=off"))
    assert not switches.applicable(_typed("softmax"), switches.parse("p=15"))
    assert switches.applicable(lssar, switches.parse("p=15,rope_theta=2x"))
    assert switches.skipped(lssar, switches.parse("p=15.0")) == "p=15.0 is lssar's own p: no extra row"
    assert switches.skipped(lssar, switches.NONE) is None and switches.skipped(lssar, switches.parse("p=3")) is None
    ssmax_protocol = switches.parse("rope_theta=50x@softmax+ssmax")
    assert ssmax_protocol.label == "rope_theta=50x" and ssmax_protocol.variants == ("softmax", "ssmax")
    assert switches.applicable(_typed("softmax"), ssmax_protocol) and switches.applicable(_typed("ssmax"), ssmax_protocol)
    assert not switches.applicable(lssar, ssmax_protocol) and not switches.applicable(lssa, ssmax_protocol)
    with pytest.raises(ConfigError, match="switch variant 'softmx' is unknown"):
        switches.parse("rope_theta=50x@softmx")


def test_switch_parsing_and_errors(trained, tmp_path):
    assert switches.parse("p=15,rope_theta=50x").settings == (("p", "15"), ("rope_theta", "50x"))
    with pytest.raises(ConfigError, match="valid switches: p, rope_theta, s"):
        switches.parse("temperature=2")
    with pytest.raises(ConfigError, match="key=value"):
        switches.parse("p")
    with pytest.raises(ConfigError, match="not a number"):
        switches.parse("p=fifteen")
    with pytest.raises(UserError, match=f"--workdir={tmp_path / 'missing'}: no such folder$"):
        suite.run_suite([str(tmp_path / "missing")], [], SETTINGS, str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no checkpoint"):
        suite.run_suite([str(tmp_path / "empty")], [], SETTINGS, str(tmp_path / "out"))
    with pytest.raises(UserError, match="held-out tokens"):
        suite.run_suite([trained["lssa"][0]], [], suite.Settings(multipliers=(1, 4096)), str(tmp_path / "out"))


@pytest.mark.slow
def test_freeatten_generate_continues_a_prompt_with_the_runs_tokenizer(trained, tmp_path, run_cli):
    from freeatten_jax.cli import generate as generate_cli
    from freeatten_jax.data.tokenizer import ByteTokenizer, load_from_run
    from freeatten_jax.nn import generate
    from freeatten_jax.training.run_dir import load_params, load_run

    workdir = trained["lssa"][0]
    assert type(load_from_run(workdir)) is ByteTokenizer  # training saved the run's tokenizer in its folder
    model, _, _ = load_params(workdir)
    prompt = ByteTokenizer().encode("the king ").astype(np.int32)
    greedy = ByteTokenizer().decode(np.asarray(generate(model, prompt[None], 6, temperature=0.0))[0, len(prompt) :])
    loaded = load_run(workdir)
    generate_text = lambda *args, **sampling: loaded.generate(*args, **sampling)[0]  # noqa: E731
    assert generate_text("the king ", 6, temperature=0.0) == greedy
    eos = greedy[1]  # stops right after the first time it is generated
    assert generate_text("the king ", 6, temperature=0.0, eos=eos) == greedy[: greedy.index(eos) + 1]
    sampled = {generate_text("the king ", 6, top_k=5, top_p=0.9, seed=s) for s in range(3)}
    assert all(len(text.encode()) == 6 for text in sampled) and len(sampled) > 1
    code = "import sys; from freeatten_jax.cli.generate import main; sys.argv[0] = 'freeatten-generate'; main()"
    cmd = [sys.executable, "-c", code, f"--workdir={workdir}", "--prompt=the king ", "--max_new_tokens=6", "--temperature=0"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0 and result.stdout == "the king " + greedy + "\n", result.stderr[-2000:]
    batched_code, batched = run_cli(generate_cli.main, *cmd[3:], "--num_samples=2", "--step=12")  # the same main, in-process
    assert batched_code == 0 and f"the king {greedy}\n{'-' * 40}\nthe king {greedy}\n" in "\n".join(batched) + "\n", batched
    report = batched[-1]
    assert report.startswith("checkpoint step 12; 2 sample(s) x up to 6 tokens: first token after ") and report.endswith(
        " tokens/s"
    )


@pytest.mark.slow
def test_load_run_is_the_public_way_to_use_a_trained_model(trained, caplog):
    import logging

    import freeatten_jax
    from freeatten_jax.data.tokenizer import ByteTokenizer
    from freeatten_jax.training import run_dir

    workdir = trained["ssmax"][0]
    caplog.clear()
    run = freeatten_jax.load_run(workdir)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # orbax's read-only restore notices are not shown
    model, cfg, step = run_dir.load_params(workdir)
    assert run.step == step == 12 and run.config == cfg and type(run.tokenizer) is ByteTokenizer and run.workdir == workdir
    tokens = jnp.asarray(run.encode("the king and")[None])
    np.testing.assert_array_equal(run.model(tokens), model(tokens))
    timing = {}
    samples = run.generate("the king ", 5, num_samples=3, top_k=5, top_p=0.9, seed=1, timing=timing)
    assert len(samples) == 3 and len(set(samples)) > 1 and all(len(s.encode()) == 5 for s in samples)  # rows sample independently
    assert timing["tokens_after_first"] == 4 * 3 and timing["first_token_s"] > 0 and timing["after_first_s"] > 0
    assert run.generate("the king ", 5, num_samples=3, temperature=0.0) == [run.generate("the king ", 5, temperature=0.0)[0]] * 3
    with pytest.raises(UserError, match="checkpoint step 5 in"):
        freeatten_jax.load_run(workdir, step=5)


def _summary_run(variant, switch, losses, hits, entropy=1.0, s=None):
    """A run with loss (and its interval) per multiplier 1, 2, one retrieval cell of two keys per length, an entropy for
    rows seeing >= 1 and >= 8 keys, and optionally a learned s (1 layer, 2 heads)."""
    lengths = [results.LengthLoss(8 * m, m, x, (x - 0.1, x + 0.1), x, (x, x), [x], 1, 8 * m) for m, x in zip((1, 2), losses)]
    cells = [results.RetrievalCell(8 * m, 0.5, h / 2, None, 1.0 + h, 2) for m, h in zip((1, 2), hits)]
    attention = results.AttentionStats([[[0.0, entropy], [0.0, entropy + 1]]], [], [1, 8])  # [layers, H, N bins]
    return results.RunResult(
        variant,
        "",
        0,
        variant,
        switch,
        0,
        8,
        10_000.0,
        lengths=lengths,
        passkey=cells,
        retrieval=cells,
        attention=attention,
        ssmax_s=s,
    )


def test_summary_pools_seeds_per_variant_and_switch():
    from freeatten_jax.evaluation import report

    runs = [
        _summary_run("softmax", "none", (1.0, 2.0), (2, 0), entropy=1.0, s=[[0.2, 0.4]]),
        _summary_run("softmax", "none", (2.0, 4.0), (1, 1), entropy=2.0, s=[[0.4, 0.6]]),
        _summary_run("softmax", "rope_theta=50x", (1.5, 1.5), (0, 0)),
    ]
    text = report.grouped_tables(runs, (1, 2), candidates=5)
    assert "| variant | task | 8 | 16 | mean rank of true key among 5 (chance 3) |" in text  # a rank beside its chance
    assert "| softmax (2 runs) | 1.500 [0.900, 2.100] | 3.000 [1.900, 4.100] |" in text
    assert "| softmax [rope_theta=50x] | 1.500 [1.400, 1.600] | 1.500 [1.400, 1.600] |" in text
    assert "| softmax (2 runs) | retrieval | 3/4 | 1/4 | 2.000 |" in text
    assert "| softmax [rope_theta=50x] | passkey | 0/2 | 0/2 | 1.000 |" in text
    entropy = "| variant | N=1 | N=8-15 |\n|---|---|---|\n| softmax (2 runs) | 0.000 | 2.000 |\n"
    assert entropy + "| softmax [rope_theta=50x] | 0.000 | 1.500 |" in text  # mean over runs, layers and heads
    assert text.endswith("| variant | layer 0 |\n|---|---|\n| softmax (2 runs) | 0.400 |")  # runs that learn s only
