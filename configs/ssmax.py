"""`python train.py --config=configs/ssmax.py:tiny` from the repo; the config itself: freeatten_jax/configs/ssmax.py."""
from freeatten_jax.configs.ssmax import get_config  # noqa: F401
