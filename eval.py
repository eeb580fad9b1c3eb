"""Evaluate from the repository (= `freeatten-eval`): `python eval.py --workdir=runs/x --out=reports/x`."""

from freeatten_jax.cli import scripts

if __name__ == "__main__":
    scripts.evaluate()
