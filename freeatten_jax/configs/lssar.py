"""LSSAR (Gao et al., arXiv 2501.13428): LSSA followed by re-weighting relu(N_i A - 1)^p, p = 15.

    freeatten-train --config=lssar:tiny --workdir=runs/lssar-tiny
    freeatten-train --config=lssar:gpt2_small --workdir=runs/lssar-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("lssar", size)
