"""`python train.py --config=configs/relu.py:tiny` from the repo; the config itself: freeatten_jax/configs/relu.py."""
from freeatten_jax.configs.relu import get_config  # noqa: F401
