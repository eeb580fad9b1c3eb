"""Multi-query associative recall (MQAR, as in the Zoology benchmark) with its own vocabulary, for testing
whether retrieval survives beyond the training length.

A sequence holds `pairs` key-value pairs at random offsets among noise tokens, then `pairs` queries, each
of a key drawn from the pairs with replacement and followed by its value (the answer). Only answers are
scored. Drawn with replacement (docs/method.md §7: with every key queried once, softmax trained at 32 tokens
stalled in 2 seeds of 3), a query may repeat an earlier one: its answer then also sits 2-6 tokens back, in the
query block, and `query_facts` marks it. At m times the training length the same pairs are placed three ways:
"start" (as in training, the gap before the queries filled with more noise: every query reaches back
(m - 1) * train_len tokens further, among no more keys), "end" (noise first, then the training window: each
query reaches back as far as in training, while the number of tokens it sees, N_i, grows m-fold) or "dilute"
(as end, but the prefix also holds competing pairs at the training window's density, `pairs` per train_len
tokens: 4 pairs in all at 1x up to 64 at 16x; their keys are keys the instance's pairs do not use, so none
answers a query). The first changes distance and N_i at once; the second N_i alone; dilute minus end is what
competing keys cost at the same distance and N_i.

Two forms: "fused" (one token per pair, key * num_values + value: one attention layer solves it by
matching the query's key to the pair token's content) and "two_token" (key then value, as in Zoology: needs
an induction circuit). Token ids of the fused form: pairs [0, K*V), queries [K*V, K*V+K), answers next
(V ids), noise last; the two-token form: keys [0, K), values [K, K+V) (also the answers), noise last.

Training (`data.source=mqar`): window i of the stream is a fresh instance drawn from (seed, i) at the
training length, and the loss counts the answers only (`answer_targets`); validation draws its own
instances from VAL_SEED. Evaluation (evaluation.mqar) draws from yet another seed.

Glossary: L = length + 1 window tokens (inputs and shifted targets), T = length target positions,
P pairs, K keys, V values.
"""

import dataclasses

import numpy as np

FORMS = ("fused", "two_token")
PLACEMENTS = ("start", "end", "dilute")  # where the training window's pairs sit at a longer length (see above)


@dataclasses.dataclass(frozen=True)
class Task:
    """The vocabulary and shape of one MQAR task."""

    num_keys: int = 8
    num_values: int = 8
    pairs: int = 4
    noise_tokens: int = 16  # distinct noise ids (filler between pairs and before the queries)
    form: str = "fused"

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"mqar form {self.form!r} is unknown; valid forms: {', '.join(FORMS)}")
        if not 1 <= self.pairs <= self.num_keys:
            raise ValueError(f"mqar pairs must be in [1, num_keys={self.num_keys}], got {self.pairs}")
        if min(self.num_values, self.noise_tokens) < 1:
            raise ValueError("mqar num_values and noise_tokens must be >= 1")

    @property
    def pair_width(self) -> int:
        """Tokens one key-value pair occupies in the context."""
        return 1 if self.form == "fused" else 2

    @property
    def query_tokens(self) -> int:
        """Tokens of the query block at the end: a query and its answer per pair."""
        return 2 * self.pairs

    @property
    def noise_start(self) -> int:
        fused = self.num_keys * self.num_values + self.num_keys + self.num_values
        return fused if self.form == "fused" else self.num_keys + self.num_values

    @property
    def vocab_size(self) -> int:
        return self.noise_start + self.noise_tokens

    def pair_tokens(self, keys_P, values_P) -> np.ndarray:
        """The context tokens of the pairs [P, pair_width]."""
        if self.form == "fused":
            return (keys_P * self.num_values + values_P)[:, None]
        return np.stack([keys_P, self.num_keys + values_P], axis=1)

    def query_answer(self, keys_P, values_P) -> np.ndarray:
        """[P, 2]: each query token and its answer token."""
        if self.form == "fused":
            base = self.num_keys * self.num_values
            return np.stack([base + keys_P, base + self.num_keys + values_P], axis=1)
        return np.stack([keys_P, self.num_keys + values_P], axis=1)


@dataclasses.dataclass(frozen=True)
class Instance:
    """One draw: which keys map to which values, where the pairs sit (offsets inside the training-length
    context), which pair each query asks for; the noise is drawn from `noise_seed`."""

    keys_P: np.ndarray
    values_P: np.ndarray
    offsets_P: np.ndarray  # token offset of each pair, increasing, non-overlapping
    queried_P: np.ndarray  # the pair each query asks for (indices into the pairs, drawn with replacement)
    noise_seed: int
    train_len: int  # the length it was drawn for


def context_tokens(task: Task, train_len: int) -> int:
    """Tokens before the queries in a training window (train_len + 1 tokens); ValueError if the pairs do not fit."""
    context = train_len + 1 - task.query_tokens
    if context < task.pairs * task.pair_width:
        raise ValueError(
            f"mqar: {task.pairs} pairs and their queries need {task.pairs * task.pair_width + task.query_tokens} "
            f"tokens, more than the window of train_len + 1 = {train_len + 1}"
        )
    return context


def draw(task: Task, train_len: int, rng: np.random.Generator) -> Instance:
    """A random instance for windows of train_len + 1 tokens: distinct keys, random values, random
    non-overlapping pair offsets in the context, and the pair each query asks for."""
    context = context_tokens(task, train_len)
    slack = context - task.pairs * (task.pair_width - 1)  # stars and bars: P starts among `slack`, then spread
    starts_P = np.sort(rng.choice(slack, size=task.pairs, replace=False))
    return Instance(
        keys_P=rng.choice(task.num_keys, size=task.pairs, replace=False),
        values_P=rng.integers(task.num_values, size=task.pairs),
        offsets_P=starts_P + np.arange(task.pairs) * (task.pair_width - 1),
        queried_P=rng.integers(task.pairs, size=task.pairs),
        noise_seed=int(rng.integers(2**31)),
        train_len=train_len,
    )


def _shift(instance: Instance, length: int, placement: str) -> int:
    """How far the training window's pairs move at `length`: 0 at the start, length - train_len at the end (and
    with the competing pairs before it)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"mqar placement {placement!r} is unknown; valid placements: {', '.join(PLACEMENTS)}")
    if length < instance.train_len:
        raise ValueError(f"mqar: length {length} is shorter than the training length this instance was drawn for")
    return 0 if placement == "start" else length - instance.train_len


def competing(task: Task, instance: Instance, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets [C], keys [C], values [C]) of the competing pairs that placement dilute puts before the training window
    at `length`: C = pairs * (length - train_len) // train_len, at random non-overlapping offsets in that prefix, keys
    drawn with replacement from the keys the instance's pairs do not use, values at random; fixed by the instance."""
    prefix = length - instance.train_len
    count = task.pairs * prefix // instance.train_len
    free_F = np.setdiff1d(np.arange(task.num_keys), instance.keys_P)
    if count and not len(free_F):
        raise ValueError(f"mqar placement dilute needs keys the {task.pairs} pairs do not use; num_keys is {task.num_keys}")
    rng = np.random.default_rng([instance.noise_seed, 1])  # not the noise's stream
    starts_C = np.sort(rng.choice(prefix - count * (task.pair_width - 1), size=count, replace=False))
    return (
        starts_C + np.arange(count) * (task.pair_width - 1),
        rng.choice(free_F, size=count),
        rng.integers(task.num_values, size=count),
    )


def render(task: Task, instance: Instance, length: int, placement: str = "start") -> tuple[np.ndarray, np.ndarray]:
    """(tokens [length + 1] int32, answer mask [length] bool over the target positions) of one instance at
    `length` (>= the training length it was drawn for): the pairs placed (with dilute, the competing pairs too),
    noise elsewhere before the query block."""
    shift = _shift(instance, length, placement)
    tokens_L = np.random.default_rng(instance.noise_seed).integers(task.noise_tokens, size=length + 1) + task.noise_start
    context = length + 1 - task.query_tokens
    placed = [(instance.offsets_P + shift, instance.keys_P, instance.values_P)]
    if placement == "dilute":
        placed.append(competing(task, instance, length))
    for offsets_C, keys_C, values_C in placed:
        for offset, pair in zip(offsets_C, task.pair_tokens(keys_C, values_C)):
            tokens_L[offset : offset + task.pair_width] = pair
    tokens_L[context:] = task.query_answer(instance.keys_P, instance.values_P)[instance.queried_P].reshape(-1)
    mask_T = np.zeros(length, bool)
    mask_T[context:length:2] = True  # target position t predicts token t + 1: the answers at context + 1, + 3, ...
    return tokens_L.astype(np.int32), mask_T


def query_facts(task: Task, instance: Instance, length: int, placement: str = "start") -> tuple[np.ndarray, np.ndarray]:
    """(repeated [P] bool: the query asks for a pair an earlier query asked for, so its answer is also in the query
    block; distance [P]: tokens from the query back to the first token of its pair), at `length`."""
    shift = _shift(instance, length, placement)
    queried_P = instance.queried_P
    repeated_P = np.array([q in queried_P[:j] for j, q in enumerate(queried_P)])
    query_positions_P = length + 1 - task.query_tokens + 2 * np.arange(task.pairs)
    return repeated_P, query_positions_P - (instance.offsets_P[queried_P] + shift)


def draws(task: Task, train_len: int, count: int, seed: int) -> list[Instance]:
    """The first `count` instances drawn with `seed`: a batch's, the same at every length and placement."""
    rng = np.random.default_rng(seed)
    return [draw(task, train_len, rng) for _ in range(count)]


def batch(
    task: Task, train_len: int, length: int, count: int, seed: int, placement: str = "start"
) -> tuple[np.ndarray, np.ndarray]:
    """`count` instances drawn for train_len from `seed`, rendered at `length`: tokens [count, length + 1] and
    answer masks [count, length]. The same seed gives the same pairs at every length (paired across lengths)."""
    rendered = [render(task, instance, length, placement) for instance in draws(task, train_len, count, seed)]
    return np.stack([t for t, _ in rendered]), np.stack([m for _, m in rendered])


def batch_query_facts(
    task: Task, train_len: int, length: int, count: int, seed: int, placement: str = "start"
) -> tuple[np.ndarray, np.ndarray]:
    """`query_facts` of `batch`'s instances: repeated [count, P] bool, distance [count, P]."""
    facts = [query_facts(task, instance, length, placement) for instance in draws(task, train_len, count, seed)]
    return np.stack([r for r, _ in facts]), np.stack([d for _, d in facts])


VAL_SEED = 1_000_003  # validation instances (training draws from (seed, window index): a different stream)


def answer_targets(task: Task, length: int) -> tuple[int, ...]:
    """The target positions [T] holding the answers of a window of `length` (the only ones the loss counts)."""
    return tuple(range(context_tokens(task, length), length, 2))


class Windows:
    """The training stream: global window index -> int32 window [L] of a fresh instance (grain map over indices)."""

    def __init__(self, task: Task, seq_len: int, seed: int):
        context_tokens(task, seq_len)  # fails now, naming the sizes, not in a worker
        self.task, self.seq_len, self.seed = task, seq_len, seed

    def __call__(self, index: int) -> np.ndarray:
        instance = draw(self.task, self.seq_len, np.random.default_rng((self.seed, int(index))))
        return render(self.task, instance, self.seq_len)[0]
