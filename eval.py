"""Evaluate from the repository: `python eval.py --workdir=runs/x --out=reports/x` (= `freeatten-eval`)."""

from freeatten_jax.evaluation.cli import main

if __name__ == "__main__":
    main()
