"""The curated mutants of freeatten_jax/cli/ (the console scripts' arguments and errors)."""

from .common import FAULTS, Mutant

MUTANTS = [
    Mutant(
        "cli: a second Ctrl-C prints KeyboardInterrupt's traceback",
        "freeatten_jax/cli/shared.py",
        "        except KeyboardInterrupt:\n            if flags",
        "        except ZeroDivisionError:\n            if flags",
        ("tests/training/test_signals.py",),
    ),
    Mutant(
        "evaluation: a multi-process launcher not refused",
        "freeatten_jax/cli/evaluate.py",
        "if sign := distributed.multi_process_sign():",
        "if sign := None:",
        ("tests/training/test_distributed.py", "-k", "cannot_span"),
    ),
    Mutant(
        "storage: tensorstore's callbacks into a failed save's closed loop reported (tracebacks)",
        "freeatten_jax/cli/shared.py",
        "    if not _into_a_closed_loop(report):",
        "    if True:",
        (FAULTS, "-k", "closed_loop"),
    ),
    Mutant(
        "--help exits 1",
        "freeatten_jax/cli/shared.py",
        "        sys.exit(0)",
        "        sys.exit(1)",
        ("tests/cli/test_usage.py", "-k", "generate"),
    ),
    Mutant(
        "eval: --switch=p=-3 accepted",
        "freeatten_jax/cli/evaluate.py",
        'math.isfinite(float(v)) and float(v) > 0, "a number > 0 or off"',
        'math.isfinite(float(v)), "a number > 0 or off"',
        (f"{FAULTS}::test_bad_eval_or_generate_input_is_one_error_line[switch p=-3]",),
    ),
    Mutant(
        "train command: the user's compilation cache replaced by one beside the data",
        "freeatten_jax/cli/train.py",
        "        if not jax.config.jax_compilation_cache_dir:\n",
        "        if True:\n",
        (f"{FAULTS}::test_the_train_command_keeps_the_users_compilation_cache_and_else_caches_beside_the_data",),
    ),
    Mutant(
        "exit code: SIGTERM exits 0",
        "freeatten_jax/cli/train.py",
        "cluster).preempted:",
        "cluster).preempted and False:",
        (FAULTS, "-k", "sigterm"),
    ),
    Mutant(
        "cli: a plugin that fails to load keeps its 20-line traceback",
        "freeatten_jax/cli/shared.py",
        "            logging.get_absl_handler().addFilter(plugin_failure_in_one_line)\n",
        "",
        ("tests/training/test_config.py::test_a_plugin_that_fails_to_load_is_one_log_line",),
    ),
    Mutant(
        "cli: a native thread may write after the error line",
        "freeatten_jax/cli/shared.py",
        "        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n",
        "",
        (f"{FAULTS}::test_the_error_line_stays_last_and_whole_when_threads_report_errors_around_it",),
    ),
    Mutant(
        "cli: the error line may start in the middle of a thread's error report",
        "freeatten_jax/cli/shared.py",
        "    with _STDERR_LOCK:\n        sys.stderr.write(line",
        "    if True:\n        sys.stderr.write(line",
        (f"{FAULTS}::test_the_error_line_stays_last_and_whole_when_threads_report_errors_around_it",),
    ),
    Mutant(
        "eval flags: a setting's check not applied",
        "freeatten_jax/cli/fields.py",
        "if value is None or value == [] and not self.empty_ok or self.check and not self.check[0](value):",
        "if value is None or value == [] and not self.empty_ok:",
        ("tests/evaluation/test_settings.py",),
    ),
    Mutant(
        "eval flags: the last setting without a flag",
        "freeatten_jax/cli/fields.py",
        "    for f in dataclasses.fields(cls):",
        "    for f in dataclasses.fields(cls)[:-1]:",
        ("tests/evaluation/test_settings.py",),
    ),
    Mutant(
        "freeatten-eval: a RoPE scaling switch by 0 accepted",
        "freeatten_jax/cli/evaluate.py",
        '_FACTOR = (lambda v: math.isfinite(float(v)) and float(v) > 0, "a finite number > 0")',
        '_FACTOR = (lambda v: True, "a finite number > 0")',
        ("tests/training/test_faults.py::test_bad_eval_or_generate_input_is_one_error_line", "-k", "rope_linear"),
    ),
]
