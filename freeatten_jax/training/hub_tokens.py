"""The special token ids (bos, eos) and generation_config.json an export writes: a run records none, so they are read
from the Hugging Face folder its weights came from (an import's, or a warm start's source, followed back through
WORKDIR/init.json): that folder's generation_config.json, or one made from its config.json's ids as transformers makes
it (GenerationConfig.from_model_config). A run with no Hub folder behind it (trained here, or its folder gone) has
none: null ids, and generation_config.json without them.
"""

import json
import pathlib

from freeatten_jax.training import run_dir, storage

IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def hub_folder(workdir) -> pathlib.Path | None:
    """The Hugging Face folder the run's weights came from, through its warm starts' sources; None if there is none
    (or it holds no config.json any more)."""
    seen = set()
    while (record := storage.path(workdir) / run_dir.INIT_FILE).exists() and str(workdir) not in seen:
        seen.add(str(workdir))
        workdir, step = run_dir.split_step(json.loads(record.read_text())["source"])
        if step is None:  # a Hub folder (a run's source is WORKDIR@STEP)
            folder = pathlib.Path(workdir).expanduser()
            return folder if (folder / "config.json").is_file() else None
    return None


def special_tokens(workdir) -> tuple[dict, dict]:
    """(config.json's special token ids, generation_config.json) for an export of the run `workdir`."""
    folder = hub_folder(workdir)
    if folder is None:
        return dict.fromkeys(IDS), {"_from_model_config": True}
    hub = json.loads((folder / "config.json").read_text())
    ids = {key: hub.get(key) for key in IDS}
    generation = folder / "generation_config.json"
    if generation.is_file():
        return ids, json.loads(generation.read_text())
    return ids, {"_from_model_config": True, **{key: value for key, value in ids.items() if value is not None}}
