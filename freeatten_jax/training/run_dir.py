"""A run on disk, read only: its checkpoints opened without writing, its model and config (`load_params`), the run
as a Python object (`load_run`, the public way to use a checkpoint outside the commands), WORKDIR[@STEP] names, and
where a warm-started run's weights came from (its init.json, written by training.warm_start):

    import freeatten_jax
    run = freeatten_jax.load_run("runs/lssar-tiny")          # the latest checkpoint; step=N for another
    texts = run.generate("ROMEO:", 100, num_samples=4, top_p=0.9)
    logits = run.model(tokens_BT)                              # an nnx Transformer in eval mode
"""

import contextlib
import dataclasses
import json
import logging
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from freeatten_jax.errors import UserError
from freeatten_jax.nn import sharding
from freeatten_jax.training import integrity, state, storage
from freeatten_jax.training.checkpoint import Checkpointer, CheckpointMismatchError, CheckpointNotFoundError, describe

INIT_FILE = "init.json"  # in the run folder: where a warm-started run's weights came from


def split_step(text: str) -> tuple[str, int | None]:
    """(path, STEP or None) of PATH[@STEP]."""
    path, at, step = text.rpartition("@")
    return (path, int(step)) if at and step.isdigit() else (text, None)


@contextlib.contextmanager
def reading(workdir):
    """A read-only Checkpointer of `workdir`'s checkpoints (it writes nothing), closed on leaving."""
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        yield ckpt
    finally:
        ckpt.close()


def _root_cause(error: Exception) -> Exception:
    """The exception `error` was raised from, and so on to the first: orbax wraps tensorstore's, which names the file
    and what is wrong with it, in one that names an array index and dumps the store's pybind spec."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


@contextlib.contextmanager
def damaged_in_one_line(ckpt: Checkpointer, step: int):
    """Reading checkpoint `step` of `ckpt`: missing, truncated or garbage files (orbax, tensorstore and json raise many
    types) are one CheckpointNotFoundError saying what is wrong and naming WORKDIR@STEP of the checkpoint before it."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        earlier = [s for s in ckpt.all_steps() if s < step]
        hint = f"; the checkpoint before it: {ckpt.workdir}@{earlier[-1]}" if earlier else ""
        raise CheckpointNotFoundError(
            f"checkpoint step {step} in {ckpt.directory} cannot be read ({describe(_root_cause(e))}){hint}"
        ) from e


def load_params(workdir, step: int | None = None, mesh=None):
    """(model in eval mode, its typed Config, step) from a run's checkpoint (the latest by default).

    Reads the parameters and model variables only (no optimizer state); `mesh` defaults to one device.
    """
    with reading(workdir) as ckpt:
        step = ckpt.require_latest() if step is None else step
        with damaged_in_one_line(ckpt, step):
            cfg = ckpt.run_config(step)
            mesh = mesh or sharding.make_mesh((1, 1, 1), jax.devices()[:1])
            target, _ = sharding.abstract(lambda: state.model_state(cfg.model, cfg.train.seed), mesh, cfg.mesh.rules)
            restore = ocp.args.PyTreeRestore(
                item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
            )
            restored = ckpt.manager.restore(step, args=ocp.args.Composite(state=restore))["state"]
            saved = (ckpt.fingerprints(step) or {}).get("state")
            if saved is not None and (bad := [k for k, v in integrity.arrays(restored).items() if saved.get(k) != v]):
                raise CheckpointMismatchError(f"array {bad[0]} differs from its fingerprint")
    _, eval_def = state.graphdefs(cfg.model)
    return state.model_of(eval_def, restored), cfg, step


def origin(workdir) -> str:
    """Where a warm-started run's weights came from, as reports name it: the source's variant and checkpoint step
    (`softmax@450`), followed by the source's own origin if it had one (`softmax@0 (SmolLM2-135M)`: a run started from
    an import), or the Hub folder's name (`SmolLM2-135M`); empty for a run trained from scratch."""
    record = storage.path(workdir) / INIT_FILE
    if not record.exists():
        return ""
    record = json.loads(record.read_text())
    path, step = split_step(record["source"])
    if step is None:
        return storage.path(path).name
    before = record.get("source_origin")
    return f"{record.get('source_variant', 'source')}@{step}" + (f" ({before})" if before else "")


@contextlib.contextmanager
def quiet_orbax():
    """Orbax warns on every read-only restore (absl WARNING lines on the console); keep them out of it."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclasses.dataclass
class Run:
    """A run's model (eval mode), its tokenizer (None for .bin shards without data.tokenizer_path), its typed
    training config and the checkpoint step loaded."""

    workdir: str
    model: object
    tokenizer: object | None
    config: object
    step: int

    def encode(self, text: str) -> np.ndarray:
        """Token ids [T] int32 of `text` with the run's tokenizer."""
        if self.tokenizer is None:
            raise UserError(
                f"run {self.workdir} trained on pre-tokenized .bin shards without data.tokenizer_path: "
                f"it has no tokenizer to encode a prompt"
            )
        return np.asarray(self.tokenizer.encode(text), np.int32)

    def generate(
        self,
        prompt: str,
        max_new_tokens: int,
        *,
        num_samples: int = 1,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos: str | None = None,
        seed: int = 0,
        timing: dict | None = None,
    ) -> list[str]:
        """`num_samples` continuations of `prompt` (prompt excluded), sampled together as one batch; each stops
        after `eos` (one token) if given. `timing`, if given, receives the seconds to the first token
        (compilation included), the seconds after it and the tokens sampled after it."""
        from freeatten_jax.nn.decoding import generate

        if num_samples < 1:
            raise UserError(f"num_samples must be >= 1, got {num_samples}")
        prompt_T = self.encode(prompt)
        if not len(prompt_T):
            raise UserError("the prompt is empty")
        eos_id = None
        if eos is not None:
            eos_ids = self.encode(eos)
            if len(eos_ids) != 1:
                raise UserError(f"eos={eos!r} is {len(eos_ids)} tokens; it must be exactly one")
            eos_id = int(eos_ids[0])
        clock = {"start": time.perf_counter(), "steps": 0}

        def on_token(token_B):  # waits for the first token only: the decoding loop is not synchronised per step
            if "first" not in clock:
                token_B.block_until_ready()
                clock["first"] = time.perf_counter()
            clock["steps"] += 1

        prompt_BT = np.repeat(prompt_T[None], num_samples, axis=0)
        out_BT = np.asarray(
            generate(
                self.model,
                prompt_BT,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                eos_id=eos_id,
                seed=seed,
                on_token=on_token,
            )
        )
        if timing is not None:
            timing.update(
                first_token_s=clock["first"] - clock["start"],
                after_first_s=time.perf_counter() - clock["first"],
                tokens_after_first=(clock["steps"] - 1) * num_samples,
            )
        texts = []
        for new_T in out_BT[:, len(prompt_T) :]:
            if eos_id is not None and (eos_id == new_T).any():
                new_T = new_T[: int(np.argmax(new_T == eos_id)) + 1]
            texts.append(self.tokenizer.decode(new_T))
        return texts


def load_run(workdir, step: int | None = None, mesh=None) -> Run:
    """The run in `workdir` (or WORKDIR@STEP) at checkpoint `step` (None: @STEP's, else the latest), parameters only (no
    optimizer state), on one device unless `mesh` is given. A missing or unreadable checkpoint is a one-line UserError."""
    from freeatten_jax import data

    workdir, at = split_step(str(workdir))
    with quiet_orbax():
        model, cfg, step = load_params(workdir, step=at if step is None else step, mesh=mesh)
    return Run(workdir, model, data.run_tokenizer(workdir, cfg.data), cfg, int(step))
