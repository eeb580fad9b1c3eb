"""Scalable-Softmax (Nakanishi, arXiv 2501.19399): logits scaled by a learnable s_h * log N_i.

    python train.py --config=configs/ssmax.py:tiny --workdir=runs/ssmax-tiny
    python train.py --config=configs/ssmax.py:gpt2_small --workdir=runs/ssmax-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
    python train.py --config=configs/ssmax.py:ssmax_162m --workdir=runs/ssmax-162m \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from configs import base


def get_config(size: str = "tiny"):
    return base.get_config("ssmax", size)
