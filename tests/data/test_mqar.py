"""MQAR (data.mqar, evaluation.mqar): the sequences' layout, the same pairs at every length, and the scoring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from freeatten_jax.data import mqar
from freeatten_jax.evaluation import mqar as mqar_eval


@pytest.mark.parametrize("form", mqar.FORMS)
def test_sequence_holds_pairs_then_queries_with_their_answers(form):
    task = mqar.Task(num_keys=8, num_values=8, pairs=4, noise_tokens=16, form=form)
    inst = mqar.draw(task, 64, np.random.default_rng(0))
    tokens_L, mask_T = mqar.render(task, inst, 64)
    assert tokens_L.shape == (65,) and mask_T.shape == (64,) and mask_T.sum() == 4
    assert tokens_L.min() >= 0 and tokens_L.max() < task.vocab_size
    pairs = {int(k): int(v) for k, v in zip(inst.keys_P, inst.values_P)}
    for offset, key in zip(inst.offsets_P, inst.keys_P):
        expected = [key * 8 + pairs[key]] if form == "fused" else [key, 8 + pairs[key]]
        assert tokens_L[offset : offset + task.pair_width].tolist() == expected
    others = np.setdiff1d(
        np.arange(65 - task.query_tokens), np.concatenate([o + np.arange(task.pair_width) for o in inst.offsets_P])
    )
    assert (tokens_L[others] >= task.noise_start).all()  # everything else before the queries is noise
    for t in np.flatnonzero(mask_T):  # target t predicts token t + 1: the answer to the query at t
        query, answer = int(tokens_L[t]), int(tokens_L[t + 1])
        key = query - 64 if form == "fused" else query
        assert answer == (64 + 8 + pairs[key] if form == "fused" else 8 + pairs[key])
    queries = task.query_answer(inst.keys_P, inst.values_P)[inst.queried_P, 0]
    assert [int(tokens_L[t]) for t in np.flatnonzero(mask_T)] == queries.tolist()


def test_queries_ask_for_pairs_drawn_with_replacement():
    """A key may be asked twice or not at all, so no answer follows from the answers before it."""
    task, rng = mqar.Task(pairs=4), np.random.default_rng(0)
    queried = np.stack([mqar.draw(task, 32, rng).queried_P for _ in range(200)])
    repeats = np.array([len(set(q)) < 4 for q in queried])
    assert queried.min() == 0 and queried.max() == 3 and 0.8 < repeats.mean() < 0.99  # 1 - 4!/4^4 = 0.906


def test_longer_lengths_keep_the_pairs_and_fill_the_gap_with_noise():
    task = mqar.Task(pairs=4)
    short_BL, short_BT = mqar.batch(task, 32, 32, 5, seed=3)
    long_BL, long_BT = mqar.batch(task, 32, 128, 5, seed=3)
    context = 33 - task.query_tokens
    assert (long_BL[:, :context] < task.noise_start).sum() == (short_BL[:, :context] < task.noise_start).sum() == 5 * 4
    pair_positions = short_BL[:, :context] < task.noise_start
    assert (long_BL[:, :context][pair_positions] == short_BL[:, :context][pair_positions]).all()  # same pairs, same offsets
    assert (long_BL[:, context : 129 - task.query_tokens] >= task.noise_start).all()  # the gap is noise
    assert (long_BL[:, -task.query_tokens :] == short_BL[:, -task.query_tokens :]).all()  # same queries and answers
    assert (long_BT[:, -task.query_tokens + 1 :] == short_BT[:, -task.query_tokens + 1 :]).all() and long_BT.sum() == 20


def test_at_the_end_the_training_window_sits_last_so_each_query_reaches_back_as_far_as_in_training():
    """Placement end: noise first, then the training window's pairs at their offsets and the queries; the distance
    from each query to its pair is training's, while at the start it grows by the added length."""
    task, train_len, length = mqar.Task(pairs=4), 32, 128
    short_BL, _ = mqar.batch(task, train_len, train_len, 5, seed=3)
    end_BL, end_BT = mqar.batch(task, train_len, length, 5, seed=3, placement="end")
    context, shift = train_len + 1 - task.query_tokens, length - train_len
    pair_positions = short_BL[:, :context] < task.noise_start
    assert (end_BL[:, shift : shift + context][pair_positions] == short_BL[:, :context][pair_positions]).all()
    assert (end_BL[:, :shift] >= task.noise_start).all() and (
        end_BL[:, -task.query_tokens :] == short_BL[:, -task.query_tokens :]
    ).all()
    assert end_BT.sum() == 20 and (np.flatnonzero(end_BT[0]) == np.arange(length + 1 - task.query_tokens, length, 2)).all()
    repeated_1x, distance_1x = mqar.batch_query_facts(task, train_len, train_len, 5, seed=3)
    repeated_end, distance_end = mqar.batch_query_facts(task, train_len, length, 5, seed=3, placement="end")
    _, distance_start = mqar.batch_query_facts(task, train_len, length, 5, seed=3, placement="start")
    assert (distance_end == distance_1x).all() and (distance_start == distance_1x + shift).all()
    for b in range(5):  # the distance is from the query token back to its pair's token, which holds the queried key
        queries = np.arange(length + 1 - task.query_tokens, length + 1, 2)
        pair_tokens = end_BL[b, queries - distance_end[b]]
        assert (pair_tokens // task.num_values == end_BL[b, queries] - task.num_keys * task.num_values).all()
    queried = np.stack([inst.queried_P for inst in mqar.draws(task, train_len, 5, 3)])
    expected = [[q in row[:j] for j, q in enumerate(row)] for row in queried]
    assert (repeated_1x == expected).all() and (repeated_end == repeated_1x).all() and repeated_1x.any()
    with pytest.raises(ValueError, match="placement 'middle' is unknown; valid placements: start, end, dilute"):
        mqar.batch(task, train_len, length, 1, seed=0, placement="middle")


@pytest.mark.parametrize("form", mqar.FORMS)
def test_dilute_puts_competing_pairs_of_unqueried_keys_before_the_training_window_as_dense_as_in_training(form):
    """Placement dilute: the end placement's tokens from the training window on, and before it, among end's own noise,
    `pairs` competing pairs per training length (4 at 1x up to 64 at 16x), real pairs of keys the instance's pairs do
    not use (so none answers a query), fixed by the instance."""
    task, train_len, count = mqar.Task(pairs=4, form=form), 32, 6
    instances = mqar.draws(task, train_len, count, seed=3)
    for m in (1, 2, 4, 8, 16):
        length, shift = m * train_len, (m - 1) * train_len
        dilute_BL, dilute_BT = mqar.batch(task, train_len, length, count, seed=3, placement="dilute")
        end_BL, end_BT = mqar.batch(task, train_len, length, count, seed=3, placement="end")
        assert (dilute_BL[:, shift:] == end_BL[:, shift:]).all() and (dilute_BT == end_BT).all()  # the queried pairs, as at end
        facts = [mqar.batch_query_facts(task, train_len, length, count, seed=3, placement=p) for p in ("dilute", "end")]
        assert all((a == b).all() for a, b in zip(*facts))
        for b, instance in enumerate(instances):
            prefix_S, end_prefix_S = dilute_BL[b, :shift], end_BL[b, :shift]
            offsets_C, keys_C, values_C = mqar.competing(task, instance, length)
            assert len(offsets_C) == 4 * (m - 1) and len(offsets_C) + 4 == 4 * m  # 4 pairs in all at 1x, 64 at 16x
            at_S = np.zeros(shift, bool)
            for offset, key, value in zip(offsets_C, keys_C, values_C):
                expected = [key * 8 + value] if form == "fused" else [key, 8 + value]
                assert prefix_S[offset : offset + task.pair_width].tolist() == expected  # a real key-value pair
                at_S[offset : offset + task.pair_width] = True
            assert at_S.sum() == len(offsets_C) * task.pair_width  # no two overlap
            assert (prefix_S[~at_S] == end_prefix_S[~at_S]).all() and (end_prefix_S >= task.noise_start).all()
            assert not set(keys_C.tolist()) & set(instance.keys_P.tolist())  # distinct from every queried key
            if m == 16:  # every unused key competes; the values vary
                assert set(keys_C.tolist()) == set(range(8)) - set(instance.keys_P.tolist()) and len(set(values_C)) > 1
    again = mqar.batch(task, train_len, 512, count, seed=3, placement="dilute")[0]
    assert (again == mqar.batch(task, train_len, 512, count, seed=3, placement="dilute")[0]).all()  # deterministic
    assert not (again[0, :480] == again[1, :480]).all()
    one_x = [mqar.batch(task, train_len, train_len, count, seed=3, placement=p)[0] for p in mqar.PLACEMENTS]
    assert all((x == one_x[0]).all() for x in one_x)  # 1x: every placement is training's window
    with pytest.raises(ValueError, match="dilute needs keys the 4 pairs do not use; num_keys is 4"):
        mqar.batch(mqar.Task(num_keys=4, pairs=4), train_len, 64, 1, seed=0, placement="dilute")


def test_bad_tasks_are_one_line_errors():
    with pytest.raises(ValueError, match="form 'three' is unknown"):
        mqar.Task(form="three")
    with pytest.raises(ValueError, match="pairs must be in"):
        mqar.Task(num_keys=4, pairs=5)
    with pytest.raises(ValueError, match="more than the window"):
        mqar.context_tokens(mqar.Task(pairs=8, form="two_token"), 16)


class _Recall(nnx.Module):
    """An exact fused-form solver: at a query for key k, one-hot logits on the answer of the pair with key k
    seen before it; `wrong` answers with the value of the first pair instead."""

    def __init__(self, task, wrong=False):
        self.task, self.wrong = task, wrong

    def __call__(self, tokens_BT):
        k, v = self.task.num_keys, self.task.num_values
        is_pair_BT = tokens_BT < k * v
        is_query_BT = (tokens_BT >= k * v) & (tokens_BT < k * v + k)
        query_key_BT = tokens_BT - k * v
        match_BTS = is_pair_BT[:, None, :] & ((tokens_BT // v)[:, None, :] == query_key_BT[:, :, None])
        if self.wrong:
            match_BTS = is_pair_BT[:, None, :] & (jnp.cumsum(is_pair_BT, axis=1) == 1)[:, None, :]
        value_BT = jnp.sum(jnp.where(match_BTS, tokens_BT[:, None, :] % v, 0), axis=-1)
        guess_BT = jnp.where(is_query_BT, k * v + k + value_BT, 0)
        return jax.nn.one_hot(guess_BT, self.task.vocab_size)


def test_scoring_counts_each_answer_at_every_length():
    task = mqar.Task(pairs=4)
    rows = mqar_eval.accuracy_by_length(_Recall(task), task, 32, (1, 4), instances=6, seed=0, placements=("start", "end"))
    assert [(r.placement, r.length, r.queries, r.accuracy, r.first_time_accuracy) for r in rows] == [
        (placement, n, 24, 1.0, 1.0) for placement in ("start", "end") for n in (32, 128)
    ]
    exact = mqar_eval.accuracy_by_length(_Recall(task), task, 32, (16,), instances=6, seed=0, placements=("dilute",))
    assert [(r.placement, r.length, r.accuracy) for r in exact] == [("dilute", 512, 1.0)]  # competing keys: no answer
    # answering with the first pair in the context: at end that is a pair of the instance, at dilute a competing one
    first_pair = {
        p: mqar_eval.accuracy_by_length(_Recall(task, wrong=True), task, 32, (4,), 200, seed=0, placements=(p,))[0].accuracy
        for p in ("end", "dilute")
    }
    assert first_pair["dilute"] < 0.2 < first_pair["end"]  # dilute: right by value collisions only (1 in 8)
    wrong = mqar_eval.accuracy_by_length(_Recall(task, wrong=True), task, 32, (1,), instances=50, seed=0)[0]
    assert 0.15 < wrong.accuracy < 0.45  # right only for the query of the first pair (1 in 4) and value collisions
    assert len(wrong.per_instance) == 50 and np.mean(wrong.per_instance) == pytest.approx(wrong.accuracy)
    hits_BP, repeated_BP = np.asarray(wrong.hits), np.asarray(wrong.repeated, bool)
    assert hits_BP.shape == (50, 4) and hits_BP.mean() == pytest.approx(wrong.accuracy)
    assert wrong.first_time_accuracy == pytest.approx(hits_BP[~repeated_BP].mean()) != wrong.accuracy
    assert (np.asarray(wrong.distance) == mqar.batch_query_facts(task, 32, 32, 50, seed=0)[1]).all()


def test_training_windows_are_fresh_instances_fixed_by_seed_and_index_and_the_loss_counts_the_answers():
    task = mqar.Task(pairs=4)
    windows = mqar.Windows(task, 32, seed=5)
    assert (windows(7) == windows(7)).all() and not (windows(7) == windows(8)).all()
    assert not (windows(7) == mqar.Windows(task, 32, seed=6)(7)).all()
    tokens_L, mask_T = mqar.render(task, mqar.draw(task, 32, np.random.default_rng((5, 7))), 32)
    assert (tokens_L == windows(7)).all() and mqar.answer_targets(task, 32) == tuple(np.flatnonzero(mask_T))
    with pytest.raises(ValueError, match="more than the window"):
        mqar.Windows(mqar.Task(pairs=8), 8, seed=0)
