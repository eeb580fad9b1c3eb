"""Train from the repository (= `freeatten-train`):
`python train.py --config=lssar:tiny --workdir=runs/x`."""

from freeatten_jax.cli import scripts

if __name__ == "__main__":
    scripts.train()
