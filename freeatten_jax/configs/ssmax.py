"""Scalable-Softmax (Nakanishi, arXiv 2501.19399): logits scaled by a learnable s_h * log N_i.

    freeatten-train --config=ssmax:tiny --workdir=runs/ssmax-tiny
    freeatten-train --config=ssmax:gpt2_small --workdir=runs/ssmax-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
    freeatten-train --config=ssmax:ssmax_162m --workdir=runs/ssmax-162m \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("ssmax", size)
