"""`load_run`: a trained run as a Python object (model, tokenizer, config, step), the public way to use a
checkpoint outside the commands:

    import freeatten_jax
    run = freeatten_jax.load_run("runs/lssar-tiny")          # the latest checkpoint; step=N for another
    texts = run.generate("ROMEO:", 100, num_samples=4, top_p=0.9)
    logits = run.model(tokens_BT)                              # an nnx Transformer in eval mode
"""

import contextlib
import dataclasses
import logging
import time

import numpy as np

from freeatten_jax.errors import UserError


@contextlib.contextmanager
def _quiet_orbax():
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
    """The run in `workdir` at checkpoint `step` (None: the latest), parameters only (no optimizer state), on one
    device unless `mesh` is given. A missing or unreadable checkpoint is a one-line UserError."""
    from freeatten_jax import data
    from freeatten_jax.training import checkpoint

    with _quiet_orbax():
        model, cfg, step = checkpoint.load_params(workdir, step=step, mesh=mesh)
    return Run(str(workdir), model, data.run_tokenizer(workdir, cfg.data), cfg, int(step))
