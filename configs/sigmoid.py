"""Sigmoid attention baseline: sigmoid(q.k / sqrt(d) - log N_i), no normalisation.

    python train.py --config=configs/sigmoid.py:tiny --workdir=runs/sigmoid-tiny
    python train.py --config=configs/sigmoid.py:gpt2_small --workdir=runs/sigmoid-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from configs import base


def get_config(size: str = "tiny"):
    return base.get_config("sigmoid", size)
