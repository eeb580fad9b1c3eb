"""LSSA (Gao et al., arXiv 2501.13428): L1-normalised softplus(log d * log N_i * cos(q, k)).

    freeatten-train --config=lssa:tiny --workdir=runs/lssa-tiny
    freeatten-train --config=lssa:gpt2_small --workdir=runs/lssa-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("lssa", size)
