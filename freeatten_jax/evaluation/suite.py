"""Runs the extrapolation suite (docs/method.md §7) over checkpoints x eval-time switches and writes the report.

Glossary: W windows, L window tokens, C candidate keys, T prompt tokens.
"""

import dataclasses
import functools
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from freeatten_jax import data
from freeatten_jax.attention import mesh_axes
from freeatten_jax.data import retrieval
from freeatten_jax.errors import UserError
from freeatten_jax.evaluation import attention_stats, cells, likelihood, loss, mqar, passkey, report, results, ruler, switches
from freeatten_jax.evaluation.cells import Cells
from freeatten_jax.evaluation.settings import Settings, compared
from freeatten_jax.nn import sharding
from freeatten_jax.nn.decoding import generate
from freeatten_jax.training import checkpoint, config, lock, run_dir, signals
from freeatten_jax.training.run_dir import load_run


class SplitCache:
    """Held-out data per data config, loaded once."""

    def __init__(self):
        self._cache = {}

    def __call__(self, cfg_data) -> data.Splits:
        key = json.dumps(dataclasses.asdict(cfg_data), sort_keys=True)
        if key not in self._cache:
            self._cache[key] = data.load_splits(cfg_data)
        return self._cache[key]


def span_tokens(settings: Settings, train_len: int) -> int:
    """The held-out span (tokens) every length is scored on."""
    return settings.eval_tokens or settings.span_windows * (max(settings.multipliers) * train_len + 1)


def _windows(splits: data.Splits, length: int, tokens: int, multiplier: int) -> np.ndarray:
    available = sum(len(s) for s in splits.val)
    if min(available, tokens) < length + 1:
        raise data.DataError(
            f"evaluation length {length} ({multiplier}x the training length) needs {length + 1} held-out tokens; "
            f"the span has {min(available, tokens)} (validation split {available}, --eval_tokens {tokens}): "
            f"use smaller --multipliers, a larger --eval_tokens or more validation data"
        )
    return loss.span_windows(splits.val, length, tokens)


def _score_prompt(model, tokenizer, prompt_T: np.ndarray, key: str, others: list[str], mesh) -> tuple[bool, float, int]:
    """(greedy first-integer hit, log-likelihood of the key after the prompt, its rank among the candidates); over the
    mesh's 'context' axis: the KV cache split over it (nn.decoding)."""
    key_tokens = np.asarray(tokenizer.encode(" " + key), np.int32)
    with sharding.use_mesh(mesh, sharding.DEFAULT_RULES):
        out = generate(model, prompt_T[None], len(key_tokens) + 2, temperature=0.0)  # room to overrun the key
    hit = passkey.is_retrieved(tokenizer.decode(np.asarray(out[0, len(prompt_T) :])), key)
    candidates = [key_tokens] + [np.asarray(tokenizer.encode(" " + k), np.int32) for k in others]
    totals = likelihood.continuations(model, prompt_T, candidates, mesh)
    return hit, float(totals[0]), passkey.key_rank(totals[0], totals[1:])


def _cell(store: Cells, name: str, doing: str, compute):
    """A generator: the cell `name`'s saved payload if it is done, else (yielding `doing` first, for the progress
    display and the stop check) `compute()`'s, saved. Either way as read back from JSON, so that a resumed evaluation
    assembles the same results as an uninterrupted one."""
    saved = store.get(name)
    if saved is None:
        yield doing
        saved = store.put(name, compute())
    return saved


def _retrieval_cell(model, tokenizer, build, length: int, depth: float, settings: Settings, mesh, rng, longest: bool) -> dict:
    """One cell of the retrieval grid: {"cell": its RetrievalCell, "masses": the needle mass [layers, H] of each prompt
    at the longest length, "rng": the key generator's state after it}.

    `build(tokenizer, length, depth, key) -> (prompt tokens, needle slice)`; a cell that cannot be scored (no
    tokenizer, or the prompt does not fit the length) carries the reason instead of numbers."""
    cell, masses = results.RetrievalCell(length, depth), []
    if tokenizer is None:
        cell.reason = "the run has no tokenizer (set data.tokenizer_path for .bin shards)"
        return {"cell": dataclasses.asdict(cell), "masses": masses, "rng": rng.bit_generator.state}
    hits, logliks, ranks = [], [], []
    for key in passkey.random_keys(rng, settings.passkey_keys):
        try:
            prompt_T, needle = build(tokenizer, length, depth, key)
        except ValueError as e:
            cell.reason = str(e)
            break
        others = [k for k in passkey.random_keys(rng, settings.passkey_candidates * 2) if k != key]
        hit, loglik, rank = _score_prompt(model, tokenizer, prompt_T, key, others[: settings.passkey_candidates - 1], mesh)
        hits.append(hit), logliks.append(loglik), ranks.append(rank)
        if longest:
            masses.append(np.asarray(attention_stats.needle_mass(model, jnp.asarray(prompt_T[None]), needle)).tolist())
    if hits:
        cell.accuracy, cell.mean_key_loglik = float(np.mean(hits)), float(np.mean(logliks))
        cell.mean_key_rank, cell.keys = float(np.mean(ranks)), len(hits)
    return {"cell": dataclasses.asdict(cell), "masses": masses, "rng": rng.bit_generator.state}


def _retrieval(model, tokenizer, task: str, build, lengths: list[int], settings: Settings, mesh, store: Cells):
    """Yields what it scores next; returns (grid cells of length x depth, needle-mass [layers, H] for each prompt at
    the longest length). The keys come from one seeded generator, drawn in grid order: a cell read back restores the
    generator's state after it."""
    rng = np.random.default_rng(settings.seed)
    grid, masses = [], []
    for length in lengths:
        for depth in settings.passkey_depths:
            score = functools.partial(
                _retrieval_cell, model, tokenizer, build, length, depth, settings, mesh, rng, length == lengths[-1]
            )
            saved = yield from _cell(store, f"{task}-{length}-{depth!r}", f"{task} at length {length}, depth {depth:g}", score)
            rng.bit_generator.state = saved["rng"]
            grid.append(results.RetrievalCell(**saved["cell"]))
            masses += saved["masses"]
    return grid, masses


MQAR_SEED = 2_000_003  # the evaluation's MQAR instances: neither training's stream nor validation's (data.mqar)


def measure(checkpoint_at: str, switch: switches.Switch, settings: Settings, splits_of, store: Cells):
    """Every measurement for one checkpoint (WORKDIR[@STEP]) under one switch: MQAR accuracy by length for an MQAR
    run, else loss, retrieval and attention analysis on held-out text; the cells done already (in `store`) are read back,
    the others measured and saved there. A generator: it yields what it measures next (for a progress display) and
    returns the RunResult. A warm-started run's variant is named with its origin and its steps since
    (`ssmax from softmax@450 +150`), so that it is not pooled with runs from scratch."""
    mesh = _context_mesh(settings.context)
    workdir, step = run_dir.split_step(checkpoint_at)
    loaded = load_run(workdir, step=step, mesh=mesh)
    model, cfg = loaded.model, loaded.config
    switches.apply(model, cfg, switch)
    model.set_implementation(settings.implementation)
    origin = run_dir.origin(workdir)
    run = results.RunResult(
        name=pathlib.Path(workdir).name + ("" if step is None else f"@{step}"),
        workdir=str(workdir),
        step=loaded.step,
        variant=cfg.model.variant_name + (f" from {origin} +{loaded.step}" if origin else ""),
        switch=switch.label,
        seed=cfg.train.seed,
        train_len=cfg.train.seq_len,
        rope_theta=float(model.attention_layers[0].rope_theta),
        loss_unit=data.loss_unit(loaded.tokenizer),
    )
    if cfg.data.source == "mqar":
        run.mqar = []
        train_len, task = cfg.train.seq_len, data.mqar_task(cfg.data)
        for placement in settings.mqar_placements:  # as mqar.accuracy_by_length orders its rows
            for m in settings.multipliers:
                score = functools.partial(
                    mqar.accuracy_by_length, model, task, train_len, [m], settings.mqar_instances, MQAR_SEED, (placement,)
                )
                row = yield from _cell(
                    store,
                    f"mqar-{placement}-{m * train_len}",
                    f"MQAR at length {m * train_len} ({placement})",
                    lambda score=score: dataclasses.asdict(score()[0]),
                )
                run.mqar.append(results.MqarLength(**row))
        return run
    yield from _text_measurements(run, model, cfg, loaded.tokenizer, settings, splits_of(cfg.data), mesh, store)
    return run


def evaluate(checkpoint_at: str, switch: switches.Switch, settings: Settings, splits_of) -> results.RunResult:
    """`measure`'s result, without a progress display, nothing saved."""
    with tqdm(disable=True) as progress:
        return _drive(measure(checkpoint_at, switch, settings, splits_of, Cells(None)), progress)


def _drive(measurements, progress, before_each=lambda: None) -> results.RunResult:
    """Runs a `measure` generator to its result, showing each step on `progress` (a tqdm bar): a step counts as done
    when the next one starts. `before_each()` is called before each step starts (everything before it is saved)."""
    started = 0
    while True:
        try:
            doing = next(measurements)
        except StopIteration as done:
            progress.update(started)
            return done.value
        progress.update(started)
        before_each()
        progress.set_postfix_str(doing)
        started = 1


def tasks_per_run(settings: Settings, is_mqar: bool) -> int:
    """Cells `measure` measures for one run: one per length, the analysis, each retrieval cell and each RULER task at
    each length (MQAR: one per length and placement)."""
    if is_mqar:
        return len(settings.multipliers) * len(settings.mqar_placements)
    return len(settings.multipliers) * (1 + 2 * len(settings.passkey_depths) + len(settings.ruler)) + 1


def _loss_cell(model, cfg, splits: data.Splits, span: int, m: int, settings: Settings, mesh, longest: bool) -> dict:
    """Loss at m training lengths over the span: {"loss": its LengthLoss, "per_position": the mean over windows at each
    position, at the longest length only}."""
    length = m * cfg.train.seq_len
    windows_WL = _windows(splits, length, span, m)
    _check_context(length, settings.context)
    with sharding.use_mesh(mesh, sharding.DEFAULT_RULES):  # the sequence over 'context' when it is > 1
        losses_WT = loss.token_losses(model, windows_WL, eos_id=data.document_eos(cfg.data))
    row = results.LengthLoss(length, m, **loss.summarise(losses_WT, cfg.train.seq_len, settings.seed))
    return {"loss": dataclasses.asdict(row), "per_position": losses_WT.mean(0).tolist() if longest else None}


def _analysis_cell(model, splits: data.Splits, span: int, m: int, length: int, settings: Settings) -> dict:
    """Attention entropy and max weight over the first windows of the longest length."""
    tokens_BT = jnp.asarray(_windows(splits, length, span, m)[: settings.analysis_windows, :-1])
    entropy, max_weight, n_from = attention_stats.entropy_and_max(model, tokens_BT)
    return dataclasses.asdict(results.AttentionStats(entropy.tolist(), max_weight.tolist(), n_from.tolist()))


def _text_measurements(run: results.RunResult, model, cfg, tokenizer, settings: Settings, splits: data.Splits, mesh, store):
    """Loss by length on the held-out span, attention analysis, passkey and training-format retrieval and the RULER-style
    tasks asked for, into `run`."""
    train_len = cfg.train.seq_len
    run.span_tokens = min(span_tokens(settings, train_len), sum(len(s) for s in splits.val))
    multipliers = settings.multipliers  # ascending (Settings sorts them): the last, the longest, gets the analysis
    for m in multipliers:
        score = functools.partial(_loss_cell, model, cfg, splits, run.span_tokens, m, settings, mesh, m == multipliers[-1])
        saved = yield from _cell(store, f"loss-{m * train_len}", f"loss at length {m * train_len}", score)
        run.lengths.append(results.length_loss(saved["loss"]))
        if m == multipliers[-1]:
            run.per_position = saved["per_position"]
    longest = multipliers[-1] * train_len
    analyse = functools.partial(_analysis_cell, model, splits, run.span_tokens, multipliers[-1], longest, settings)
    run.attention = results.AttentionStats(**(yield from _cell(store, "attention", "attention analysis", analyse)))
    lengths = [x.length for x in run.lengths]
    run.passkey, masses = yield from _retrieval(model, tokenizer, "passkey", passkey.build_prompt, lengths, settings, mesh, store)
    run.retrieval, _ = yield from _retrieval(
        model, tokenizer, "retrieval", retrieval.build_prompt, lengths, settings, mesh, store
    )
    run.needle_mass = np.mean(masses, axis=0).tolist() if masses else []
    text_T = ruler.held_out(splits, 2 * lengths[-1], data.document_eos(cfg.data)) if settings.ruler else None
    for task in settings.ruler:
        for m, length in zip(multipliers, lengths):
            score = functools.partial(ruler.cell, model, tokenizer, task, length, m, settings, text_T, mesh)
            saved = yield from _cell(store, f"ruler-{task}-{length}", f"RULER {task} at length {length}", score)
            run.ruler.append(results.RulerCell(**saved))
    s = attention_stats.ssmax_s(model)
    run.ssmax_s = None if s is None else s.tolist()


def _context_mesh(context: int) -> jax.sharding.Mesh:
    """The mesh of the first `context` devices, all on the 'context' axis (parameters replicated)."""
    if not 1 <= context <= jax.device_count():
        raise UserError(f"--context={context} is invalid; allowed: 1 to the {jax.device_count()} devices")
    return sharding.make_mesh((1, 1, 1, context), jax.devices()[:context])


def _check_context(length: int, context: int) -> None:
    if error := mesh_axes.context_length_error("evaluation length", length, context):
        raise UserError(f"{error}: change --multipliers or --context")


def _saved_config(checkpoint_at: str) -> tuple[int, config.Config]:
    """(step, the typed config saved with it) of checkpoint WORKDIR[@STEP] (the latest without @STEP); a UserError if it
    is not there."""
    workdir, step = run_dir.split_step(checkpoint_at)
    if not pathlib.Path(workdir).is_dir():
        raise UserError(f"--workdir={checkpoint_at}: no such folder")
    ckpt = checkpoint.Checkpointer(workdir, read_only=True)
    try:
        if step is not None and step not in ckpt.all_steps():
            raise UserError(f"--workdir={checkpoint_at}: no checkpoint step {step}; it has: {ckpt.all_steps() or 'none'}")
        step = ckpt.require_latest() if step is None else step
        with run_dir.damaged_in_one_line(ckpt, step):
            return step, ckpt.run_config(step)
    finally:
        ckpt.close()


def estimate(first_s: float, jobs: int) -> str:
    """The line printed after the first run: its time and the whole evaluation's, extrapolated (it includes the
    first run's compilation, so it errs long)."""
    total_min = first_s * jobs / 60
    hint = "; --quick gives a first look in a fraction of that" if total_min > 10 else ""
    return f"first of {jobs} runs took {first_s:.0f} s: the whole evaluation will take about {total_min:.0f} min{hint}"


class Stopped(Exception):
    """SIGTERM or SIGINT stopped the evaluation between two cells, every finished one saved: rerun the same command
    to resume (exit 75)."""


def _resumable(out: pathlib.Path, settings: Settings, mqar: bool) -> None:
    """Refuses an output folder holding cells measured under other settings; records them in a fresh one."""
    ours = dataclasses.asdict(settings)
    theirs = cells.saved_settings(out)
    if theirs is None:
        cells.save_settings(out, ours)
        return
    keys = compared(type(settings), mqar)
    results.check_alike(
        f"--out={out}", theirs, ours, keys, "rerun with those settings to resume, or use another --out", type(settings)
    )


def run_suite(
    workdirs: list[str], switch_texts: list[str], settings: Settings, out: str, merge: tuple[str, ...] = ()
) -> list[results.RunResult]:
    """Evaluates each checkpoint as trained and under each applicable switch; writes the report of these runs and of
    those in the results files `merge` to `out`. Returns the runs measured here.

    Each cell is saved in OUT/cells as it is done, and a rerun skips those done; one process at a time owns `out`.
    SIGTERM or SIGINT stops it after the cell in progress: `Stopped`."""
    parsed = [switches.parse(t) for t in switch_texts]
    saved = {w: _saved_config(w) for w in workdirs}
    configs = {w: cfg for w, (_, cfg) in saved.items()}
    jobs = [(w, s) for w in workdirs for s in [switches.NONE, *parsed] if switches.applicable(configs[w], s)]
    if not jobs:
        raise UserError("nothing to evaluate: no switch applies to these checkpoints")
    is_mqar = {w: configs[w].data.source == "mqar" for w in workdirs}
    described = {**dataclasses.asdict(settings), "switches": switch_texts, "workdirs": list(workdirs)}
    names = {pathlib.Path(w).name for w in workdirs}
    earlier, described = results.earlier(list(merge), described, names, any(is_mqar.values()), type(settings))
    mqar_runs = sum(is_mqar[w] for w, _ in jobs)
    what = [f"{len(settings.passkey_depths)} passkey depth(s) x {settings.passkey_keys} key(s)"] * (mqar_runs < len(jobs))
    what += [f"MQAR: {settings.mqar_instances} instances per length"] * (mqar_runs > 0)
    print(
        f"evaluating {len(jobs)} run(s) (checkpoint x switch) at {len(settings.multipliers)} lengths "
        f"({', '.join(f'{m}x' for m in settings.multipliers)}), {', '.join(what)}; the time of the first run gives an "
        "estimate of the whole",
        file=sys.stderr,
    )
    for w, s in ((w, s) for w in workdirs for s in parsed if not switches.applicable(configs[w], s)):
        print(f"{w}: {switches.skipped(configs[w], s)}", file=sys.stderr)
    folder = pathlib.Path(out)
    with lock.hold(folder, flag="--out"):
        _resumable(folder, settings, mqar_runs > 0)
        cells.drop_partial_writes(folder)
        stores = {
            (w, s): Cells(folder / cells.FOLDER / cells.job_name(run_dir.split_step(w)[0], saved[w][0], s.label)) for w, s in jobs
        }
        runs = _measure_all(jobs, configs, settings, stores, folder)
        report.write(folder, [*earlier, *runs], described)
    return runs


def _measure_all(jobs, configs, settings: Settings, stores: dict, out: pathlib.Path) -> list[results.RunResult]:
    """The jobs' results, each read back if it is done, else measured cell by cell on a progress bar of cells done,
    total and time left; stops between cells at SIGTERM or SIGINT."""
    splits_of, runs = SplitCache(), []
    per_job = {job: tasks_per_run(settings, configs[job[0]].data.source == "mqar") for job in jobs}
    before = sum(per_job[job] if store.get(cells.RUN) else store.done() for job, store in stores.items())
    total = sum(per_job.values())
    stop = signals.StopSignal()

    def check_stop():
        if stop.requested:
            raise Stopped(
                f"{stop.name}: stopped with {progress.n} of {total} cells done, each saved in {out / cells.FOLDER}; "
                "rerun the same command to resume"
            )

    try:
        with tqdm(total=total, initial=before, desc="eval", unit="cell") as progress:
            if before:
                progress.write(f"resuming: {before} of {total} cells done already in {out / cells.FOLDER}", file=sys.stderr)
            start = time.perf_counter()
            for i, (workdir, switch) in enumerate(jobs):
                store = stores[workdir, switch]
                if done := store.get(cells.RUN):
                    runs.append(results.from_dict(done))
                    continue
                check_stop()  # before loading the next checkpoint; after the last job, the report is written
                progress.set_description(f"{pathlib.Path(workdir).name} ({configs[workdir].model.variant_name}) [{switch.label}]")
                run = _drive(measure(workdir, switch, settings, splits_of, store), progress, check_stop)
                runs.append(results.from_dict(store.put(cells.RUN, dataclasses.asdict(run))))
                if i == 0 and len(jobs) > 1 and not before:
                    progress.write(estimate(time.perf_counter() - start, len(jobs)), file=sys.stderr)
    finally:
        stop.restore()
    return runs
