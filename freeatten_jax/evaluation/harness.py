"""`freeatten`: an lm-evaluation-harness model for every checkpoint, at `multiplier` x its training length, under an
eval-time switch. Registered in lm_eval's model registry when this module is imported.

Log-likelihoods are the training loss's (training.loss.next_token_losses) on right-padded rows, so real tokens keep
their positions and N_i; rows are grouped into power-of-two lengths so that each length compiles once. Long texts
(loglikelihood_rolling) are scored in windows of the context length without overlap, each conditioned on the token
before it, as evaluation.loss cuts held-out text. Generation is greedy with the KV cache (nn.decoding.generate).

Glossary: R rows (requests, or windows of a long text), B rows in a batch, L = T + 1 row tokens, T positions, V vocabulary.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from lm_eval import utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from freeatten_jax import attention, data
from freeatten_jax.data import documents
from freeatten_jax.evaluation import switches
from freeatten_jax.nn.decoding import generate
from freeatten_jax.training.checkpoint import CheckpointNotFoundError
from freeatten_jax.training.loss import next_token_losses
from freeatten_jax.training.run_dir import Run, load_run

SMALLEST_BUCKET = 16  # rows shorter than this are padded to it: a few shapes, each compiled once


def bucket(length: int, limit: int) -> int:
    """The padded row length (positions) for a row of `length` positions: the next power of two, at most `limit`."""
    return min(limit, max(SMALLEST_BUCKET, 1 << (length - 1).bit_length()))


@functools.partial(jax.jit, static_argnames=("graphdef", "eos_id"))
def _scores(state, tokens_BL, *, graphdef, eos_id):
    """(log p(target) [B, T], whether each target is the argmax [B, T]); one forward under jit (XLA merges both)."""
    model = nnx.merge(graphdef, state)
    inputs_BT = tokens_BL[:, :-1]
    logits_BTV = model(inputs_BT, **documents.model_inputs(inputs_BT, eos_id))
    return -next_token_losses(model, tokens_BL, eos_id=eos_id), jnp.argmax(logits_BTV, axis=-1) == tokens_BL[:, 1:]


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _load(workdir) -> Run:
    """The run in `workdir` (WORKDIR or WORKDIR@STEP); a path that holds no checkpoint is a ValueError naming it."""
    if not isinstance(workdir, (str, os.PathLike)):
        raise TypeError(f"workdir must be a path (WORKDIR or WORKDIR@STEP) or a loaded Run, got {type(workdir).__name__}")
    path = os.fspath(workdir)
    try:
        return load_run(path)
    except CheckpointNotFoundError as e:
        raise ValueError(f"workdir {path!r} is not a trained run ({e}); allowed: a run's WORKDIR or WORKDIR@STEP") from None


@register_model("freeatten")
class FreeattenLM(TemplateLM):
    """A checkpoint (`workdir`: WORKDIR, WORKDIR@STEP or a Run loaded already) as an lm-eval model: context = `multiplier`
    x training length, `switch` in the project's syntax (evaluation.switches; in an lm_eval model_args string separate
    its items with ';', since ',' separates the arguments), attention `implementation`, about `batch_tokens` tokens
    per forward pass."""

    def __init__(self, workdir, multiplier: int = 1, switch: str = "", implementation: str = "auto", batch_tokens: int = 4096):
        super().__init__()
        if jax.process_count() > 1:
            raise ValueError(f"the freeatten model runs in one process; this job has {jax.process_count()}")
        self.multiplier = _positive_int("multiplier", multiplier)
        self.batch_tokens = _positive_int("batch_tokens", batch_tokens)
        if implementation not in attention.IMPLEMENTATIONS:
            raise ValueError(f"implementation {implementation!r} is unknown; allowed: {', '.join(attention.IMPLEMENTATIONS)}")
        self.switch = switches.parse(str(switch).replace(";", ",")) if switch else switches.NONE
        self.run = workdir if isinstance(workdir, Run) else _load(workdir)
        switches.apply(self.run.model, self.run.config, self.switch)  # idempotent: one Run may serve several multipliers
        self.run.model.set_implementation(implementation)
        self.max_length = self.multiplier * self.run.config.train.seq_len
        self.eos_id = data.document_eos(self.run.config.data)  # document masking as in training, else None

    @property
    def eot_token_id(self) -> int:
        """The run's document separator where it has one, else the newline's token: what an empty context starts from."""
        return int(self.eos_id if self.eos_id is not None else self.run.encode("\n")[-1])

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.run.encode(string).tolist()

    def tok_decode(self, tokens) -> str:
        return self.run.tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of log p(continuation), whether it is the greedy continuation) per ((context, continuation),
        context tokens, continuation tokens); the context is cut from the left to the model's context length."""
        rows = []
        for _, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(continuation)} tokens exceeds the context of {self.max_length}")
            rows.append((list(context) + list(continuation))[-(self.max_length + 1) :])
        logprob_R, greedy_R = self._score_rows(rows, [len(c) for _, _, c in requests])
        return [(float(lp), bool(g)) for lp, g in zip(logprob_R, greedy_R)]

    def _score_rows(self, rows: list[list[int]], scored: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Sum of log p and all-greedy over the last `scored[i]` targets of each row, rows grouped by bucket length."""
        graphdef, state = nnx.split(self.run.model)
        logprob_R, greedy_R = np.zeros(len(rows)), np.zeros(len(rows), bool)
        lengths = [bucket(len(r) - 1, self.max_length) for r in rows]
        for length in sorted(set(lengths)):
            members = [i for i, b in enumerate(lengths) if b == length]
            batch = max(1, self.batch_tokens // length)
            for start in range(0, len(members), batch):
                chunk = members[start : start + batch]
                tokens_BL = np.zeros((batch, length + 1), np.int32)  # right padding; unused rows fill the batch's one shape
                for b, i in enumerate(chunk):
                    tokens_BL[b, : len(rows[i])] = rows[i]
                scores = _scores(state, jnp.asarray(tokens_BL), graphdef=graphdef, eos_id=self.eos_id)
                logp_BT, greedy_BT = (np.asarray(x) for x in scores)
                for b, i in enumerate(chunk):
                    end = len(rows[i]) - 1
                    logprob_R[i] = logp_BT[b, end - scored[i] : end].sum(dtype=np.float64)
                    greedy_R[i] = greedy_BT[b, end - scored[i] : end].all()
        return logprob_R, greedy_R

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text: windows of the context length, each predicting its own tokens (no overlap)."""
        rows, scored, owner = [], [], []
        for n, request in enumerate(requests):
            windows = utils.get_rolling_token_windows(self.tok_encode(request.args[0]), self.eot_token_id, self.max_length, 1)
            for context, continuation in map(utils.make_disjoint_window, windows):
                rows.append(context + continuation)
                scored.append(len(continuation))
                owner.append(n)
        logprob_R, _ = self._score_rows(rows, scored)
        return np.bincount(owner, weights=logprob_R, minlength=len(requests)).tolist()

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, cut before the first stop string (`until`); prompts of one bucket length and budget
        share a batch (left-padded, see _greedy)."""
        settings = [self._generation(request.args[1]) for request in requests]
        prompts = [  # cut from the left to leave room for the tokens to generate; an empty one starts from eot_token_id
            self.tok_encode(request.args[0])[-(self.max_length - s[1]) :] or [self.eot_token_id]
            for request, s in zip(requests, settings)
        ]
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (prompt, (_, max_new)) in enumerate(zip(prompts, settings)):
            groups.setdefault((bucket(len(prompt), self.max_length - max_new), max_new), []).append(i)
        out = [""] * len(requests)
        for (length, max_new), members in groups.items():
            new_BT = self._greedy([prompts[i] for i in members], length, max_new)
            for i, new_T in zip(members, new_BT):
                text = self.tok_decode(new_T[new_T != self.eos_id] if self.eos_id is not None else new_T)
                out[i] = min((text.split(stop)[0] for stop in settings[i][0]), key=len, default=text)
        return out

    def _greedy(self, prompts: list[list[int]], length: int, max_new: int) -> np.ndarray:
        """`max_new` greedy tokens after each prompt [B, max_new]: prompts left-padded to `length` in a segment of their
        own (0), each prompt in segment 1 from position 0, so that its tokens keep their positions and N_i."""
        tokens_BT, positions_BT, segments_BT = (np.zeros((len(prompts), length), np.int32) for _ in range(3))
        for b, prompt in enumerate(prompts):
            tokens_BT[b, length - len(prompt) :] = prompt
            positions_BT[b, length - len(prompt) :] = np.arange(len(prompt))
            segments_BT[b, length - len(prompt) :] = 1
        inputs = dict(temperature=0, eos_id=self.eos_id, positions_BT=positions_BT, segment_ids_BT=segments_BT)
        return np.asarray(generate(self.run.model, tokens_BT, max_new, **inputs))[:, length:]

    def _generation(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """(stop strings, tokens to generate) of a request's generation settings; sampling is refused."""
        kwargs = dict(gen_kwargs)
        if kwargs.pop("do_sample", False) or kwargs.pop("temperature", 0) not in (0, 0.0):
            raise ValueError(f"the freeatten model generates greedily only; got do_sample/temperature in {gen_kwargs}")
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = _positive_int("max_gen_toks", kwargs.pop("max_gen_toks", 256))
        if max_new >= self.max_length:
            raise ValueError(f"max_gen_toks {max_new} leaves no prompt in the context of {self.max_length}")
        return until, max_new
