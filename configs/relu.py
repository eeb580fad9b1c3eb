"""ReLU attention baseline: relu(q.k / sqrt(d)) / N_i, no normalisation.

    python train.py --config=configs/relu.py:tiny --workdir=runs/relu-tiny
    python train.py --config=configs/relu.py:gpt2_small --workdir=runs/relu-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from configs import base


def get_config(size: str = "tiny"):
    return base.get_config("relu", size)
