"""freeatten-generate's speed line (the command end to end: tests/evaluation/test_suite.py)."""

from freeatten_jax.cli.generate import speed_line


def test_the_speed_line_gives_a_rate_only_when_a_later_token_was_timed():
    timed = speed_line(12, 2, 6, {"first_token_s": 1.234, "tokens_after_first": 10, "after_first_s": 0.5})
    assert (
        timed
        == "checkpoint step 12; 2 sample(s) x up to 6 tokens: first token after 1.23 s (compilation included), then 20.0 tokens/s"
    )
    stopped = speed_line(3, 4, 200, {"first_token_s": 0.5, "tokens_after_first": 0, "after_first_s": 0.0})
    assert "nan" not in stopped and stopped.endswith("no later token to time (every sample stopped at its first)")
