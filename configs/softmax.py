"""Standard softmax attention (the baseline).

    python train.py --config=configs/softmax.py:tiny --workdir=runs/softmax-tiny
    python train.py --config=configs/softmax.py:gpt2_small --workdir=runs/softmax-small --config.data.source=bin \
        --config.data.path='fineweb10B/fineweb_train_*.bin' --config.data.val_path='fineweb10B/fineweb_val_*.bin'
"""
from configs import base


def get_config(size: str = "tiny"):
    return base.get_config("softmax", size)
