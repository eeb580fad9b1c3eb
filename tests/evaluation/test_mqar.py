"""MQAR through the application: `--config=mqar:...` trains on answers only and `freeatten-eval` scores its accuracy
by length into mqar.csv / mqar.md; the softmax_logn control keeps its temperature fixed."""

import csv
import dataclasses
import gzip

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import read_metrics

from freeatten_jax import data
from freeatten_jax.configs import mqar as mqar_config
from freeatten_jax.data import mqar
from freeatten_jax.errors import ConfigError
from freeatten_jax.evaluation import mqar as mqar_eval
from freeatten_jax.evaluation import mqar_report, results, stats, suite, switches
from freeatten_jax.training import config, optim
from freeatten_jax.training import state as train_state
from freeatten_jax.training import step as train_step
from freeatten_jax.training.loss import next_token_losses


def _cfg(variant="softmax", **overrides):
    cfg = mqar_config.get_config(f"variant={variant}")
    cfg.update_from_flattened_dict(
        {
            "model.num_layers": 1,
            "model.d_model": 32,
            "model.num_heads": 2,
            "model.mlp_dim": 64,
            "train.seq_len": 24,
            "train.batch_size": 8,
            "train.steps": 4,
            "train.eval_every": 2,
            "train.log_every": 1,
            "train.eval_windows": 8,
            "train.checkpoint_every": 4,
            "optim.warmup_steps": 1,
            "mesh.shape": (1, 1, 1),
            **overrides,
        }
    )
    return cfg


def test_named_arguments_and_the_control():
    cfg = config.parse(mqar_config.get_config("variant=lssar,form=two_token"))
    assert (cfg.model.attention, cfg.data.source, cfg.data.mqar_form, cfg.model.num_layers) == ("lssar", "mqar", "two_token", 2)
    assert cfg.model.vocab_size == mqar.Task(form="two_token").vocab_size
    control = config.parse(mqar_config.get_config("variant=softmax_logn"))
    assert control.model.attention == "ssmax" and not control.model.ssmax_learn_s and control.model.variant_name == "softmax_logn"
    assert config.parse(mqar_config.get_config("variant=ssmax")).model.variant_name == "ssmax"
    with pytest.raises(ConfigError, match="'size' is not a named argument"):
        mqar_config.get_config("size=tiny")
    with pytest.raises(data.DataError, match="pairs must be in"):
        config.parse(_cfg(**{"data.mqar_pairs": 9}))


def test_the_training_loss_is_the_mean_over_the_answers_only():
    cfg = config.parse(_cfg())
    tx = optim.make(cfg.optim, cfg.train.steps)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1, 1), ("data", "fsdp", "tensor", "context"))
    _, shardings = train_state.abstract_state(cfg, mesh, tx)
    state = train_state.create(cfg, mesh, tx, shardings)
    _, eval_def = train_state.graphdefs(cfg.model)
    windows = data.synthetic_windows(cfg.data, 24, seed=0)
    tokens_BL = np.stack([windows(i) for i in range(8)])
    targets = data.loss_targets(cfg.data, 24)
    assert len(targets) == 4 and targets[-1] == 23
    losses_BT = np.asarray(jax.jit(lambda s: next_token_losses(nnx.merge(eval_def, s["params"], s["rest"]), tokens_BL))(state))
    total, count = train_step.make_eval_step(cfg)(state, tokens_BL, np.ones(8, np.float32))
    _, metrics = train_step.make_train_step(cfg, shardings)(state, tokens_BL)  # donates `state`: last
    np.testing.assert_allclose(metrics["loss"], losses_BT[:, list(targets)].mean(), rtol=1e-5)
    assert abs(losses_BT.mean() - losses_BT[:, list(targets)].mean()) > 1e-3  # the two differ: the test can tell
    np.testing.assert_allclose(total / count, losses_BT[:, list(targets)].mean(), rtol=1e-5)


@pytest.fixture(scope="module")
def mqar_runs(trained_run):
    """Tiny MQAR runs: softmax seeds 0 and 1, and the softmax_logn control seed 0."""
    return {
        name: str(trained_run(f"mqar-{name}", _cfg(variant, **{"train.seed": seed})))
        for name, variant, seed in (("softmax-0", "softmax", 0), ("softmax-1", "softmax", 1), ("logn-0", "softmax_logn", 0))
    }


def test_training_resumes_the_stream_and_the_control_keeps_s(mqar_runs):
    from freeatten_jax.training.run_dir import load_run

    rows = read_metrics(mqar_runs["logn-0"])
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(np.isfinite(r["val_loss"]) for r in rows if "val_loss" in r)
    model = load_run(mqar_runs["logn-0"]).model
    s = np.asarray(model.attention_layers[0].s_H[...])
    np.testing.assert_array_equal(s, np.full_like(s, 1 / np.log(24)))  # four Adam steps left it where it started


def test_eval_scores_accuracy_by_length_into_mqar_csv(mqar_runs, tmp_path, capsys):
    settings = suite.Settings(multipliers=(1, 2), mqar_instances=16)
    runs = suite.run_suite(list(mqar_runs.values()), [], settings, str(tmp_path))
    assert capsys.readouterr().err.startswith(
        "evaluating 3 run(s) (checkpoint x switch) at 2 lengths (1x, 2x), MQAR: 16 instances"
    )
    with (tmp_path / "mqar.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "variant",
        "switch",
        "seed",
        "train_len",
        "placement",
        "length",
        "accuracy",
        "first_time_accuracy",
        "queries",
    ]
    assert [(r["variant"], r["seed"], r["placement"], r["length"], r["queries"]) for r in rows] == [
        (v, s, p, n, "64")
        for v, s in (("softmax", "0"), ("softmax", "1"), ("softmax_logn", "0"))
        for p in ("start", "end", "dilute")
        for n in ("24", "48")
    ]
    at_1x = {(r["variant"], r["seed"], r["placement"]): r["accuracy"] for r in rows if r["length"] == "24"}
    assert all(at_1x[v, s, "start"] == at_1x[v, s, p] for v, s, p in at_1x)  # 1x: every placement is training's
    with gzip.open(tmp_path / "mqar_queries.csv.gz", "rt") as f:
        queries = list(csv.DictReader(f))
    assert len(queries) == 3 * 3 * 2 * 64 and {q["placement"] for q in queries} == {"start", "end", "dilute"}
    first_end_2x = [q for q in queries if q["variant"] == "softmax" and q["seed"] == "1" and q["placement"] == "end"]
    first_end_2x = [int(q["hit"]) for q in first_end_2x if q["length"] == "48" and q["repeated"] == "0"]
    row = next(r for r in rows if (r["variant"], r["seed"], r["placement"], r["length"]) == ("softmax", "1", "end", "48"))
    assert float(row["first_time_accuracy"]) == pytest.approx(np.mean(first_end_2x))
    for run in runs:
        for x in run.mqar:
            assert x.accuracy == pytest.approx(np.mean(x.per_instance)) and len(x.per_instance) == 16
    text = (tmp_path / "mqar.md").read_text()
    assert "| softmax (2 runs) |" in text and "| softmax_logn |" in text and (tmp_path / "mqar.png").exists()
    assert not (tmp_path / "report.md").exists()  # no text runs: no text report


def test_a_rope_theta_switch_applies_to_mqar_runs(mqar_runs, monkeypatch):
    """`--switch=rope_theta=50x` on an MQAR checkpoint (of any variant): every MQAR cell is scored with RoPE's base
    raised 50x in every layer, and the run records it."""
    scored = []

    def spy(model, *args, **kwargs):  # the RoPE bases of the model each cell is scored with
        scored.append({float(layer.rope_theta) for layer in model.attention_layers})
        return real(model, *args, **kwargs)

    real = mqar_eval.query_hits
    monkeypatch.setattr(mqar_eval, "query_hits", spy)
    settings = suite.Settings(multipliers=(1, 4), mqar_instances=8, mqar_placements=("start", "dilute"))
    plain = suite.evaluate(mqar_runs["logn-0"], switches.NONE, settings, suite.SplitCache())
    switched = suite.evaluate(mqar_runs["logn-0"], switches.parse("rope_theta=50x"), settings, suite.SplitCache())
    assert scored == [{10_000.0}] * 4 + [{500_000.0}] * 4
    assert (plain.rope_theta, switched.rope_theta, switched.switch) == (10_000.0, 500_000.0, "rope_theta=50x")
    assert [(x.placement, x.length) for x in switched.mqar] == [(p, n) for p in ("start", "dilute") for n in (24, 96)]


def _run(variant, seed, per_instance_MW):
    """Instance accuracy a (in quarters): its first 4a queries hit; queries 1 and 3 repeat an earlier key."""
    mqar = []
    for m, x in zip((1, 4), per_instance_MW):
        hits = [[int(p < round(4 * a)) for p in range(4)] for a in x]
        first_time = float(np.mean([h for row in hits for p, h in enumerate(row) if p in (0, 2)]))
        row = results.MqarLength(
            8 * m, m, 4 * len(x), float(np.mean(x)), list(x), "start", first_time, hits, [[0, 1, 0, 1]] * len(x)
        )
        mqar.append(row)
    return results.RunResult(f"{variant}-{seed}", "", 1, variant, "none", seed, 8, 10_000.0, mqar=mqar)


def test_the_report_pairs_each_variant_with_softmax_by_seed_and_instance():
    rng = np.random.default_rng(0)
    base = [rng.integers(0, 5, size=(2, 200)) / 4 for _ in range(3)]
    same = [_run("softmax", s, b) for s, b in enumerate(base)] + [_run("lssa", s, b) for s, b in enumerate(base)]
    text = mqar_report.markdown(same)
    assert "| lssa (3 runs) | +0.000 [+0.000, +0.000] | +0.000 [+0.000, +0.000] |" in text
    better = [_run("lssar", s, np.clip(b + [[0.0], [0.25]], 0, 1)) for s, b in enumerate(base)]
    lssar_rows = [line for line in mqar_report.markdown(same[:3] + better).splitlines() if line.startswith("| lssar")]
    row, seed_row = lssar_rows[-2:]  # the differences: bootstrap, then per seed
    one_x, four_x = row.strip("| ").split(" | ")[1:3]
    assert one_x == "+0.000 [+0.000, +0.000]" and float(four_x.split(" [")[1].split(",")[0]) > 0  # 4x: detected
    expected = stats.paired_difference(mqar_report.per_instance(better, 4), mqar_report.per_instance(same[:3], 4))
    assert four_x == f"{expected['difference']:+.3f} [{expected['ci'][0]:+.3f}, {expected['ci'][1]:+.3f}]"
    # beside it, the difference per seed with a t interval over the 3 seeds
    per_seed = [np.mean(b[1] - a[1]) for a, b in zip(base, [np.clip(b + [[0.0], [0.25]], 0, 1) for b in base])]
    mean, half = np.mean(per_seed), 4.302653 * np.std(per_seed, ddof=1) / np.sqrt(3)
    four_x_seeds = seed_row.strip("| ").split(" | ")[2]
    assert four_x_seeds == f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] ({' '.join(f'{d:+.2f}' for d in per_seed)})"
    # first-time queries: their own table, from the hits of the queries that repeat no earlier key
    first = text.split("accuracy on first-time queries")[1].split("\n## ")[0]
    softmax_1x = stats.mean_with_interval([[np.mean([q < round(4 * a) for q in (0, 2)]) for a in b[0]] for b in base])
    assert f"| softmax (3 runs) | {softmax_1x['mean']:.3f} [{softmax_1x['ci'][0]:.3f}, {softmax_1x['ci'][1]:.3f}]" in first


def test_the_report_gives_placement_start_minus_end_per_variant_over_seeds():
    rng = np.random.default_rng(1)
    start_RMW = [rng.integers(0, 5, size=(2, 50)) / 4 for _ in range(3)]
    end_RMW = [np.clip(x + [[0.0], [0.25]], 0, 1) for x in start_RMW]  # at 4x the end placement retrieves more
    runs = []
    for seed, (start, end) in enumerate(zip(start_RMW, end_RMW)):
        run = _run("lssa", seed, start)
        run.mqar += [dataclasses.replace(x, placement="end") for x in _run("lssa", seed, end).mqar]
        runs.append(run)
    section = mqar_report.markdown(runs).split("placement start minus at end")[1]
    (row,) = [line for line in section.splitlines() if line.startswith("| lssa")]
    one_x, four_x = row.strip("| ").split(" | ")[1:3]
    assert one_x == "+0.000 [+0.000, +0.000] (+0.00 +0.00 +0.00)"
    per_seed = [np.mean(s[1] - e[1]) for s, e in zip(start_RMW, end_RMW)]
    mean, half = np.mean(per_seed), 4.302653 * np.std(per_seed, ddof=1) / np.sqrt(3)
    assert (
        mean < 0 and four_x == f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] ({' '.join(f'{d:+.2f}' for d in per_seed)})"
    )
