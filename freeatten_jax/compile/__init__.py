"""Compile a training step or the attention kernels for chips you do not have (`freeatten-compile`)."""

from freeatten_jax.compile.run import DoesNotFit, Report, compile_attention, compile_train_step  # noqa: F401 (package API)
from freeatten_jax.compile.targets import TARGETS  # noqa: F401
