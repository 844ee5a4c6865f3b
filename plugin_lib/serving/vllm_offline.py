"""Offline generation inside vLLM's own environment: ``python -m plugin_lib.serving.vllm_offline
REQUEST.json RESULT.json`` (``serving.vllm_engine.generate_ids`` writes the request and reads
the result; ``plugin-repro generate|evaluate --engine vllm`` use it).

The request names the artifact, the served model, the prompts as token ids (tokenised by the
caller exactly as the package's own decoding tokenises them) and one or more arms, each a set
of ``extra_args`` for the Plugin's logits processor (``{"plugin": 0}``: the base alone), or a list
of them, one per prompt (one batch that mixes them). One engine decodes every arm; the result holds each arm's generated token ids, per prompt.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROCESSOR = "plugin_lib.serving.vllm_processor:PluginLogitsProcessor"


def main(argv: list[str] | None = None) -> int:
    request_path, result_path = (argv if argv is not None else sys.argv[1:])[:2]
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    os.environ["PLUGIN_VLLM_ARTIFACT"] = request["artifact"]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=request["model"], dtype=request["dtype"], logits_processors=[PROCESSOR],
              max_model_len=request["max_model_len"], max_num_seqs=request["max_num_seqs"],
              gpu_memory_utilization=request["memory"], enforce_eager=request.get("eager", False),
              seed=request.get("seed", 0))
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
    result = {}
    for arm, extra in request["arms"].items():
        per_prompt = extra if isinstance(extra, list) else [extra] * len(prompts)  # a list: one batch, mixed
        params = [SamplingParams(temperature=request["temperature"], top_p=request["top_p"],
                                 max_tokens=request["max_new_tokens"], seed=request.get("seed"), extra_args=e)
                  for e in per_prompt]
        outputs = llm.generate(prompts, params, use_tqdm=request.get("progress", False))
        result[arm] = [list(o.outputs[0].token_ids) for o in outputs]
    partial = Path(result_path).with_suffix(".partial")
    partial.write_text(json.dumps(result), encoding="utf-8")
    os.replace(partial, result_path)  # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
