"""`freeatten-compile`: will it fit? Compile for a TPU slice or GPUs on this machine, without them.

    freeatten-compile --target=v5p-8 --config=lssar:gpt2_small --config.model.implementation=pallas
    freeatten-compile --target=v5p-32 --config=lssar:gpt2_small --config.model.implementation=pallas \
        --config.model.remat=full --context=16 --seq_len=1048576 --config.train.batch_size=1
    freeatten-compile --target=v5e-8 --attention=lssar --seq_len=131072

With --config (and its usual overrides), one training step of that config on the target's mesh (--context=n:
the sequence split over n devices, the rest data parallel; --seq_len: tokens per example); with
--attention, that variant's forward+backward on one device (bf16, --heads x --head_dim). Prints per-device
memory against the chip's HBM and the number of Pallas kernel calls; an overflow (VMEM, shared memory,
HBM) is one line naming the knob to turn. Needs pip install 'freeatten_jax[compile]'.
"""

import sys

from absl import flags
from ml_collections import config_flags

from freeatten_jax.attention import IMPLEMENTATIONS, VARIANTS
from freeatten_jax.cli import shared as cli
from freeatten_jax.errors import UserError


def main() -> None:
    argv = cli.config_argv(sys.argv)
    config = config_flags.DEFINE_config_file(
        "config",
        None,
        "Training config whose step to compile, e.g. lm:variant=lssar,size=gpt2_small or lssar:gpt2_small.",
        lock_config=True,
        sys_argv=argv,
    )
    target = flags.DEFINE_string(
        "target", None, "v5e-8, v5e-16, v5p-8, v5p-32, v6e-8, v4-8, tpu:<generation>:<topology>, h100, h200 or 8xh100."
    )
    variant = flags.DEFINE_enum(
        "attention", None, VARIANTS, "Compile this attention variant's kernels alone instead of a training step."
    )
    seq_len = flags.DEFINE_integer("seq_len", None, "The sequence length (--attention: default 8192; --config: train.seq_len).")
    context = flags.DEFINE_integer(
        "context", None, "With --config: the context-parallel axis size (mesh data x 1 x 1 x context; ring attention)."
    )
    heads = flags.DEFINE_integer("heads", 16, "With --attention: the number of heads.")
    head_dim = flags.DEFINE_integer("head_dim", 128, "With --attention: the head dimension.")
    implementation = flags.DEFINE_enum(
        "implementation", "pallas", IMPLEMENTATIONS, "With --attention: the attention implementation."
    )
    flags.mark_flag_as_required("target")

    def compile_(_):
        import jax

        jax.config.update("jax_platforms", "cpu")  # the targets' compilers come from their topologies; nothing runs here

        from freeatten_jax.compile import run, targets

        try:
            targets.parse(target.value)  # before anything is printed or built
        except ValueError as e:
            raise UserError(f"--target={target.value}: {e}") from None
        if variant.value:
            print(
                f"compiling {variant.value} attention forward+backward, T={seq_len.value or 8192}, {heads.value} heads x {head_dim.value}, "  # noqa: E501
                f"bf16, implementation={implementation.value}",
                flush=True,
            )
            report = run.compile_attention(
                target.value,
                variant=variant.value,
                seq_len=seq_len.value or 8192,
                heads=heads.value,
                head_dim=head_dim.value,
                implementation=implementation.value,
            )
        else:
            if config.value is None:
                raise flags.ValidationError("give --config (a training step) or --attention (the kernels alone)")
            cfg = cli.config_value(config)
            if seq_len.value:
                cfg.train.seq_len = seq_len.value
            if context.value:
                cfg.mesh.shape = (-1, 1, 1, context.value)
            print(f"compiling one training step for {target.value} (this can take minutes)", flush=True)
            report = run.compile_train_step(cfg, target.value)
        print("\n".join(report.lines()))

    cli.run(compile_, argv)
