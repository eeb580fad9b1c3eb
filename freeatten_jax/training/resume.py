"""Resume policy: which checkpoint a rerun continues from, and whether it may (the same model, data stream and data
files). Provably bad checkpoints are moved aside; one that cannot be read stops the run with nothing moved. A run
folder without a usable checkpoint that shows progress (bad checkpoints, or training.history's records) starts from
step 0 only when asked, its earlier records moved aside."""

from freeatten_jax import data
from freeatten_jax.errors import ConfigError, UserError
from freeatten_jax.training import config, history, integrity
from freeatten_jax.training.checkpoint import CheckpointMismatchError, CheckpointUnavailableError, describe, is_unavailable
from freeatten_jax.training.progress import log


class NoUsableCheckpointError(UserError, RuntimeError):
    """A workdir that shows progress has no usable checkpoint (every one was bad, or they are gone), and
    config.checkpoint.allow_fresh_start is off."""


# Fields a resumed run must share with its checkpoint: the parameters' shapes and origin, and the data stream.
FIXED = ("model.", "data.", "train.seq_len", "train.batch_size", "train.seed", "init.")
FREE = ("data.allow_changed",)  # and, with data.allow_changed, the data's paths:
CHANGEABLE_DATA = ("data.path", "data.val_path")
_BAD = {"unreadable": "unreadable", "fingerprint-mismatch": "not what was saved: it does not match its fingerprints"}


def flat_fields(d: dict, prefix: str = "") -> dict:
    """{"section.field": value} of a nested config dict."""
    items = {}
    for key, value in d.items():
        items.update(flat_fields(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return items


def check_resumable(saved: dict, cfg: config.Config, step: int, workdir) -> None:
    """Refuses to resume when a field that shapes the state or the data stream changed since the checkpoint
    (a field the checkpoint lacks was added since: it had its default)."""
    old, new = flat_fields(saved), flat_fields(cfg.source)
    free = FREE + (CHANGEABLE_DATA if cfg.data.allow_changed else ())
    following = {f"model.{name}" for name in config.MODEL_NOTES}  # filled in from other fields: named after them
    changed = sorted(
        (k for k in set(old) | set(new) if k.startswith(FIXED) and k not in free and k in old and old[k] != new.get(k)),
        key=lambda k: (k in following, k),
    )
    if changed:
        k, others = changed[0], ", ".join(f"config.{o}" for o in changed[1:])
        also = f"; also changed: {others}" if others else ""
        raise ConfigError(
            f"config.{k} is {new.get(k)!r} but the checkpoint at step {step} in {workdir} used {old.get(k)!r}{also}; "
            "resume with the same values or use a new --workdir"
        )


def resume(ckpt, abstract, train_iter, cfg, workdir):
    """(state, step) from the newest checkpoint that restores and matches its fingerprints, else (None, 0); when
    every checkpoint is bad, or the workdir shows progress without one, a start from scratch needs
    config.checkpoint.allow_fresh_start (and moves the earlier run's records aside)."""
    bad = []
    for step in reversed(ckpt.all_steps()):
        ckpt.check_readable(step)
        try:
            check_resumable(ckpt.config_json(step), cfg, step, workdir)
            fingerprints = ckpt.fingerprints(step)
            if fingerprints is not None and not bad:
                _check_data_unchanged(fingerprints["data_files"], ckpt.data_files, cfg, step)
            state = ckpt.restore(step, abstract, train_iter, fingerprints)
        except UserError:
            raise
        except Exception as e:  # truncated, missing or garbage files: orbax, tensorstore and json raise many types
            if is_unavailable(e):
                raise CheckpointUnavailableError(
                    f"cannot read checkpoint step {step} in {ckpt.directory} ({describe(e)}); "
                    f"nothing was moved or written: fix the storage and rerun"
                ) from e
            reason = "fingerprint-mismatch" if isinstance(e, CheckpointMismatchError) else "unreadable"
            bad.append((step, reason, describe(e), ckpt.quarantine(step, reason)))
            continue
        for number, reason, error, moved in bad:
            log(f"checkpoint {number} is {_BAD[reason]} ({error}); moved it to {moved}; continuing from step {step}")
        if fingerprints is None:
            log(
                f"warning: checkpoint {step} has no fingerprints (an older version saved it): its arrays, data iterator "
                f"and data files are not checked; the next checkpoint will have them"
            )
        confirmed = ckpt.confirmed_step()
        verdict = (
            "confirmed good" if confirmed is not None and step <= confirmed else "not yet confirmed: its next step has not run"
        )
        log(f"resumed from step {step} (checkpoint in {workdir}; {verdict})")
        return state, step
    for number, reason, error, moved in bad:
        log(f"checkpoint {number} is {_BAD[reason]} ({error}); moved it to {moved}")
    quarantined, shown = ckpt.workdir / "quarantine", history.progress(ckpt.workdir)
    if bad or (quarantined.exists() and any(quarantined.iterdir())):
        why, hint = f"no usable checkpoint in {ckpt.directory} (the bad ones are in {quarantined})", ""
    elif shown:
        why = f"no checkpoint in {ckpt.directory}, but {ckpt.workdir} shows a run's progress ({shown})"
        hint = "restore the checkpoints, or "
    else:
        return None, 0
    if not cfg.checkpoint.allow_fresh_start:
        raise NoUsableCheckpointError(
            f"{why}; not starting from scratch: {hint}rerun with --config.checkpoint.allow_fresh_start=True to train "
            f"from step 0 (the earlier records move to {ckpt.workdir / history.PREVIOUS})"
        )
    moved = history.move_aside(ckpt.workdir)
    ckpt.unconfirm()
    aside = f"; the earlier run's records moved to {moved}" if moved else ""
    log(f"no usable checkpoint in {ckpt.directory}; starting from scratch (config.checkpoint.allow_fresh_start){aside}")
    return None, 0


def _check_data_unchanged(saved: list, now: list, cfg, step: int) -> None:
    if (change := integrity.files_changed(saved, now)) is None:
        return
    if not cfg.data.allow_changed:
        raise data.DataError(
            f"the training data changed since checkpoint step {step}: {change}; resume on the same data, "
            f"or pass --config.data.allow_changed=True to go on with this data"
        )
    log(f"the training data changed since checkpoint step {step} ({change}); going on with it (config.data.allow_changed)")
