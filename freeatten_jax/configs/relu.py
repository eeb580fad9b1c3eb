"""ReLU attention baseline: relu(q.k / sqrt(d)) / N_i, no normalisation.

    freeatten-train --config=relu:tiny --workdir=runs/relu-tiny
    freeatten-train --config=relu:gpt2_small --workdir=runs/relu-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("relu", size)
