"""Train from the repository (= `freeatten-train`):
`python train.py --config=configs/lm.py:variant=lssar,size=tiny --workdir=runs/x`."""

from freeatten_jax.training.cli import main

if __name__ == "__main__":
    main()
