"""Sigmoid attention baseline: sigmoid(q.k / sqrt(d) - log N_i), no normalisation.

    freeatten-train --config=sigmoid:tiny --workdir=runs/sigmoid-tiny
    freeatten-train --config=sigmoid:gpt2_small --workdir=runs/sigmoid-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("sigmoid", size)
