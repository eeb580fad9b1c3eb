"""Standard softmax attention (the baseline).

    freeatten-train --config=softmax:tiny --workdir=runs/softmax-tiny
    freeatten-train --config=softmax:gpt2_small --workdir=runs/softmax-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from freeatten_jax.configs import base


def get_config(size: str = "tiny"):
    return base.get_config("softmax", size)
