"""Multi-query associative recall (data.mqar), with named arguments: `--config=mqar:variant=lssar,form=fused`
(all optional; variants as for `lm`, the softmax_logn control included; forms: fused, two_token). A 2-layer `tiny`
model trained at 32 tokens on 4 key-value pairs among noise tokens (16 distinct noise ids), the loss on the answers
only, 2,000 steps at a constant learning rate (about 4 minutes on 2 CPU cores with another run beside it;
docs/results.md: every variant solves it at 1x in 3 seeds of 3); `freeatten-eval` scores per-query accuracy at
1x-16x (the gap filled with noise, the same pairs).

    freeatten-train --config=mqar:variant=lssar --workdir=runs/mqar-lssar
    freeatten-eval --workdir=runs/mqar-lssar --out=reports/mqar
"""

from freeatten_jax.configs import base, lm

ARGUMENTS = ("variant", "form")
SETTINGS = {
    "model.num_layers": 2,
    "data.source": "mqar",
    "train.seq_len": 32,
    "train.batch_size": 32,
    "train.steps": 2000,
    "optim.lr": 3e-3,
    "optim.schedule": "constant",
    "optim.weight_decay": 0.0,
    "train.eval_every": 250,
    "train.log_every": 50,
    "train.checkpoint_every": 250,
    "train.eval_windows": 256,
}


def get_config(text: str = ""):
    named = lm.arguments(text, ARGUMENTS, "mqar")
    cfg = base.get_config(named.get("variant", "softmax"), "tiny")
    cfg.update_from_flattened_dict(SETTINGS)
    cfg.data.mqar_form = named.get("form", cfg.data.mqar_form)
    return cfg
