"""The curated mutants of freeatten_jax/data/ (sources, tokenizers, pipelines, synthetic tasks)."""

from .common import FAULTS, Mutant

MUTANTS = [
    Mutant(
        "data.mqar.competing: dilute's competing pairs may take the instance's keys (one can answer a query)",
        "freeatten_jax/data/mqar.py",
        "free_F = np.setdiff1d(np.arange(task.num_keys), instance.keys_P)",
        "free_F = np.arange(task.num_keys)",
        ("tests/data/test_mqar.py", "-k", "dilute"),
    ),
    Mutant(
        "data.mqar.competing: dilute holds a fixed 4 competing pairs at every length (no growth with length)",
        "freeatten_jax/data/mqar.py",
        "count = task.pairs * prefix // instance.train_len",
        "count = task.pairs * bool(prefix)",
        ("tests/data/test_mqar.py", "-k", "dilute"),
    ),
    Mutant(
        "data: a training file rewritten at the same size goes unnoticed",
        "freeatten_jax/data/watch.py",
        "            if now_mtime != mtime:",
        "            if False:",
        (FAULTS, "tests/training/test_integrity.py", "-k", "changes_while_training or file_watch"),
    ),
    Mutant(
        "shards: a changed size not checked",
        "freeatten_jax/data/shards.py",
        "if len(raw) != 2 * count or os.fstat(self._fd).st_size != self.file_size:",
        "if len(raw) != 2 * count:",
        ("tests/training/test_integrity.py", "-k", "shard_changing"),
    ),
    Mutant(
        "corpus: the first download silent",
        "freeatten_jax/data/corpus.py",
        'print(f"fetching the default corpus',
        '(lambda *args, **kwargs: None)(f"fetching the default corpus',
        ("tests/data/test_pipeline.py::test_the_first_fetch_says_what_it_does_and_a_cached_corpus_is_silent",),
    ),
    Mutant(
        "mqar: answers one position late",
        "freeatten_jax/data/mqar.py",
        "    return tuple(range(context_tokens(task, length), length, 2))",
        "    return tuple(range(context_tokens(task, length) + 1, length, 2))",
        (
            "tests/data/test_mqar.py::test_training_windows_are_fresh_instances_fixed_by_seed_and_index_and_the_loss_counts_the_answers",
        ),
    ),
    Mutant(
        "mqar: every key queried once (the answers before a query narrow it down)",
        "freeatten_jax/data/mqar.py",
        "queried_P=rng.integers(task.pairs, size=task.pairs),",
        "queried_P=rng.permutation(task.pairs),",
        ("tests/data/test_mqar.py::test_queries_ask_for_pairs_drawn_with_replacement",),
    ),
    Mutant(
        "mqar: training windows ignore the seed",
        "freeatten_jax/data/mqar.py",
        "np.random.default_rng((self.seed, int(index)))",
        "np.random.default_rng((0, int(index)))",
        (
            "tests/data/test_mqar.py::test_training_windows_are_fresh_instances_fixed_by_seed_and_index_and_the_loss_counts_the_answers",
        ),
    ),
    Mutant(
        "mqar: the end placement leaves the pairs where training put them",
        "freeatten_jax/data/mqar.py",
        'return 0 if placement == "start" else length - instance.train_len',
        "return 0",
        ("tests/data/test_mqar.py",),
    ),
    Mutant(
        "mqar: a repeated query counted as first-time",
        "freeatten_jax/data/mqar.py",
        "repeated_P = np.array([q in queried_P[:j] for j, q in enumerate(queried_P)])",
        "repeated_P = np.zeros(len(queried_P), bool)",
        ("tests/data/test_mqar.py",),
    ),
]
