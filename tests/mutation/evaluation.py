"""The curated mutants of freeatten_jax/evaluation/ (the suite, its tasks, results, reports and statistics)."""

from .common import SWITCHES, Mutant

EVAL = "tests/evaluation/test_loss.py"
RESUME = "tests/evaluation/test_results.py"


MUTANTS = [
    Mutant(
        "suite.measure: eval-time switches skipped on MQAR runs (rope_theta=50x scores the checkpoint as trained)",
        "freeatten_jax/evaluation/suite.py",
        "    switches.apply(model, cfg, switch)\n",
        '    switches.apply(model, cfg, switch) if cfg.data.source != "mqar" else None\n',
        ("tests/evaluation/test_mqar.py", "-k", "rope_theta"),
    ),
    Mutant(
        "misuse: the harness model's workdir that is no run not named",
        "freeatten_jax/evaluation/harness.py",
        "    except CheckpointNotFoundError as e:",
        "    except KeyError as e:",
        ("tests/attention/test_misuse.py", "-k", "workdir"),
    ),
    # --- evaluation
    Mutant(
        "report: a key rank without the candidates and chance's rank (passkey 0/1 beside rank 1.000)",
        "freeatten_jax/evaluation/report.py",
        'return f"mean rank of true key among {candidates} (chance {(candidates + 1) / 2:g})"',
        'return "mean rank of true key"',
        ("tests/evaluation/test_suite.py::test_summary_pools_seeds_per_variant_and_switch",),
    ),
    Mutant(
        "eval loss: first train_len positions",
        "freeatten_jax/evaluation/loss.py",
        "losses_WT[:, -train_len:]",
        "losses_WT[:, :train_len]",
        (EVAL, "-k", "loss_last_train_len"),
    ),
    Mutant(
        "needle mass: 5 tokens off",
        "freeatten_jax/evaluation/attention_stats.py",
        "needle.start : needle.stop]",
        "needle.start + 5 : needle.stop + 5]",
        (EVAL, "-k", "needle_mass"),
    ),
    Mutant(
        "attention entropy: sign flipped",
        "freeatten_jax/evaluation/attention_stats.py",
        "ent_HT.append(np.asarray(-jnp.sum(",
        "ent_HT.append(np.asarray(jnp.sum(",
        (EVAL, "-k", "entropy_and_max"),
    ),
    Mutant(
        "passkey: scored by startswith, not first-integer equality",
        "freeatten_jax/evaluation/passkey.py",
        "return first_integer(generated_text) == key",
        "return generated_text.strip().startswith(key)",
        ("tests/evaluation/test_suite.py::test_passkey_scoring_is_first_integer_equality_and_rank",),
    ),
    Mutant(
        "switch rope_theta=50x read as absolute 50",
        "freeatten_jax/evaluation/switches.py",
        "cfg.model.rope_theta * float(value[:-1])",
        "float(value[:-1])",
        (EVAL, "-k", "each_switch"),
    ),
    Mutant(
        "plots: no training-length mark on the loss plot",
        "freeatten_jax/evaluation/plots.py",
        '_mark_train_len(ax, {r.train_len for r in runs})\n    ax.set_xscale("log", base=2)\n    if lows:\n        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))\n    _legend(ax)\n    return fig\n\n\ndef draw_per_position',  # noqa: E501
        'ax.set_xscale("log", base=2)\n    if lows:\n        ax.set_ylim(*y_limits(np.concatenate(lows), np.concatenate(highs), MIN_LOSS_SPAN))\n    _legend(ax)\n    return fig\n\n\ndef draw_per_position',  # noqa: E501
        ("tests/evaluation/test_suite.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: y-axis zooms to the data (no minimum span)",
        "freeatten_jax/evaluation/plots.py",
        "pad = max((min_span - (hi - lo)) / 2, 0.05 * (hi - lo))",
        "pad = 0.05 * (hi - lo)",
        ("tests/evaluation/test_suite.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: the loss plot without its interval band",
        "freeatten_jax/evaluation/plots.py",
        '(m["mean"], *m["ci"]) for m in summaries',
        '(m["mean"], m["mean"], m["mean"]) for m in summaries',
        ("tests/evaluation/test_suite.py::test_loss_plot_has_interval_band_training_length_mark_and_a_minimum_span",),
    ),
    Mutant(
        "plots: retrieval never a heatmap",
        "freeatten_jax/evaluation/plots.py",
        "len(lengths) * len(depths) > 1 for",
        "len(lengths) * len(depths) > 99 for",
        ("tests/evaluation/test_suite.py::test_retrieval_plot_is_a_depth_by_length_heatmap_when_the_grid_has_cells",),
    ),
    Mutant(
        "report: no warning for runs at different steps",
        "freeatten_jax/evaluation/report.py",
        '(("step", "checkpoint steps"), ("train_len", "training lengths"))',
        '(("train_len", "training lengths"),)',
        ("tests/evaluation/test_suite.py::test_report_warns_when_compared_runs_differ_in_step_or_training_length",),
    ),
    Mutant(
        "eval --quick: the full span",
        "freeatten_jax/evaluation/settings.py",
        "passkey_depths=(0.5,),",
        "passkey_depths=(0.1, 0.5, 0.9),",
        ("tests/evaluation/test_suite.py::test_quick_settings_and_the_estimate_line",),
    ),
    Mutant(
        "stats: each term draws its own seeds",
        "freeatten_jax/evaluation/stats.py",
        "        total_N += sign * values_RW[runs_NR[..., None], windows_NRW].mean(axis=(1, 2))",
        "        total_N += sign * values_RW[rng.integers(len(values_RW), size=runs_NR.shape)[..., None], windows_NRW].mean(axis=(1, 2))",  # noqa: E501
        ("tests/evaluation/test_stats.py::test_a_contrast_draws_the_same_seeds_for_every_term",),
    ),
    Mutant(
        "paired: rise relative to softmax without softmax's 1x",
        "freeatten_jax/evaluation/paired.py",
        "_cell(stats.contrast([(1, diff[m]), (-1, diff[1])]))",
        "_cell(stats.contrast([(1, diff[m])]))",
        ("tests/evaluation/test_paired.py",),
    ),
    Mutant(
        "mqar report: pairs a variant's seed k with another seed of softmax",
        "freeatten_jax/evaluation/mqar_report.py",
        "    ours, theirs = pick(rs), pick(base)\n",
        "    ours, theirs = pick(rs), pick(base)[::-1]\n",
        ("tests/evaluation/test_mqar.py::test_the_report_pairs_each_variant_with_softmax_by_seed_and_instance",),
    ),
    # --- warm-start switch experiment, typed results, MQAR placements and per-query hits, seed-level statistics,
    # the frozen LSSA temperature (issues 33-35)
    Mutant(
        "eval: a warm-started run pooled with runs from scratch",
        "freeatten_jax/evaluation/suite.py",
        'variant=cfg.model.variant_name + (f" from {origin} +{loaded.step}" if origin else ""),',
        "variant=cfg.model.variant_name,",
        (
            "tests/training/test_warm_start.py::test_a_warm_start_holds_the_sources_weights_at_step_0_and_scores_as_the_switched_source",
        ),
    ),
    Mutant(
        "eval: WORKDIR@STEP evaluates the latest checkpoint",
        "freeatten_jax/evaluation/suite.py",
        "    loaded = load_run(workdir, step=step, mesh=mesh)",
        "    loaded = load_run(workdir, mesh=mesh)",
        (
            "tests/training/test_warm_start.py::test_a_warm_start_holds_the_sources_weights_at_step_0_and_scores_as_the_switched_source",
        ),
    ),
    Mutant(
        "results: results.json does not read back what was written",
        "freeatten_jax/evaluation/results.py",
        'return LengthLoss(**{k: tuple(v) if k.endswith("_ci") else v for k, v in x.items()})',
        "return LengthLoss(**x)",
        ("tests/evaluation/test_suite.py::test_results_json_reads_back_the_typed_results_written",),
    ),
    Mutant(
        "eval --merge: results measured under other settings reported together",
        "freeatten_jax/evaluation/results.py",
        "        if theirs_is != ours_is:",
        "        if False:",
        ("tests/evaluation/test_suite.py::test_merge_reports_earlier_results_beside_new_runs_measured_alike",),
    ),
    Mutant(
        "eval --merge: a checkpoint both merged and measured again",
        "freeatten_jax/evaluation/results.py",
        "        if again := sorted(names & {r.name for r in theirs}):",
        "        if again := []:",
        ("tests/evaluation/test_suite.py::test_merge_reports_earlier_results_beside_new_runs_measured_alike",),
    ),
    # --- evaluation settings declared once, resumable evaluation (issues 48, 53)
    Mutant(
        "eval settings: MQAR settings not compared",
        "freeatten_jax/evaluation/settings.py",
        "kinds = {TEXT, MQAR} if mqar else {TEXT}",
        "kinds = {TEXT}",
        ("tests/evaluation/test_settings.py",),
    ),
    Mutant(
        "eval merge: a setting older results lack read as null, not as its default",
        "freeatten_jax/evaluation/results.py",
        "json.dumps(theirs.get(key, defaults.get(key)))",
        "json.dumps(theirs.get(key))",
        ("tests/evaluation/test_settings.py", "-k", "before_a_setting"),
    ),
    Mutant(
        "eval resume: a finished cell measured again",
        "freeatten_jax/evaluation/suite.py",
        "    saved = store.get(name)",
        "    saved = None",
        (RESUME, "-k", "skips"),
    ),
    Mutant(
        "eval resume: the key generator not restored from the cell read back",
        "freeatten_jax/evaluation/suite.py",
        '            rng.bit_generator.state = saved["rng"]\n',
        "",
        (RESUME, "-k", "middle"),
    ),
    Mutant(
        "eval resume: SIGTERM ignored",
        "freeatten_jax/evaluation/suite.py",
        "        if stop.requested:",
        "        if False:",
        (RESUME, "-k", "sigterm"),
    ),
    Mutant(
        "eval resume: cells measured under other settings mixed",
        "freeatten_jax/evaluation/suite.py",
        '    results.check_alike(\n        f"--out={out}", theirs, ours, keys,',
        '    (\n        f"--out={out}", theirs, ours, keys,',
        (RESUME, "-k", "refused"),
    ),
    Mutant(
        "eval: two evaluations on one --out",
        "freeatten_jax/evaluation/suite.py",
        '    with lock.hold(folder, flag="--out"):',
        "    if True:",
        (RESUME, "-k", "owns"),
    ),
    Mutant(
        "mqar report: a placement's cost taken the wrong way round (end minus start, end minus dilute)",
        "freeatten_jax/evaluation/mqar_report.py",
        "stats.seed_level([(1, per_instance(rs, multiplier, a)), (-1, per_instance(rs, multiplier, b))])",
        "stats.seed_level([(-1, per_instance(rs, multiplier, a)), (1, per_instance(rs, multiplier, b))])",
        ("tests/evaluation/test_mqar.py::test_the_report_gives_placement_start_minus_end_per_variant_over_seeds",),
    ),
    Mutant(
        "mqar report: first-time accuracy over every query",
        "freeatten_jax/evaluation/mqar_report.py",
        "fresh_RWP = [np.asarray(x.repeated) == 0 for x in rows]",
        "fresh_RWP = [np.asarray(x.repeated) >= 0 for x in rows]",
        ("tests/evaluation/test_mqar.py::test_the_report_pairs_each_variant_with_softmax_by_seed_and_instance",),
    ),
    Mutant(
        "stats: the seed-level interval uses the normal quantile",
        "freeatten_jax/evaluation/stats.py",
        "scipy_stats.t.ppf((1 + level) / 2, runs - 1)",
        "scipy_stats.norm.ppf((1 + level) / 2)",
        ("tests/evaluation/test_stats.py", "tests/evaluation/test_paired.py"),
    ),
    Mutant(
        "switch: p drops a frozen temperature",
        "freeatten_jax/evaluation/switches.py",
        'model.set_attention("lssar", **kept, p=None if value == "off" else float(value))',
        'model.set_attention("lssar", p=None if value == "off" else float(value))',
        ("tests/evaluation/test_suite.py::test_the_p_switch_keeps_a_frozen_temperature",),
    ),
    Mutant(
        "switch rope_linear applies llama3",
        "freeatten_jax/evaluation/switches.py",
        '"rope_linear": _rope_scaling("linear"),',
        '"rope_linear": _rope_scaling("llama3"),',
        (SWITCHES, "-k", "rope_linear"),
    ),
    Mutant(
        "switch rope_llama3: the length before scaling Llama 3.1's 8192, not the trained length",
        "freeatten_jax/evaluation/switches.py",
        "Scaling(kind, float(value), original_len=cfg.model.max_len)",
        "Scaling(kind, float(value))",
        (SWITCHES, "-k", "rope_llama3"),
    ),
]
