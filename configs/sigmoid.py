"""`python train.py --config=configs/sigmoid.py:tiny` from the repo; the config itself: freeatten_jax/configs/sigmoid.py."""
from freeatten_jax.configs.sigmoid import get_config  # noqa: F401
