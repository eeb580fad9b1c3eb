"""`python train.py --config=configs/lssar.py:tiny` from the repo; the config itself: freeatten_jax/configs/lssar.py."""
from freeatten_jax.configs.lssar import get_config  # noqa: F401
