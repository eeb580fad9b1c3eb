"""freeatten_jax: length-extrapolating attention (softmax, SSMax, LSSA, LSSAR) for JAX and Flax NNX."""
__version__ = "0.1.0"
