"""`python train.py --config=configs/lssa.py:tiny` from the repo; the config itself: freeatten_jax/configs/lssa.py."""
from freeatten_jax.configs.lssa import get_config  # noqa: F401
