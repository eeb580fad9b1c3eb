"""`python train.py --config=configs/softmax.py:tiny` from the repo; the config itself: freeatten_jax/configs/softmax.py."""
from freeatten_jax.configs.softmax import get_config  # noqa: F401
