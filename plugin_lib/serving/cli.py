"""``plugin-repro``: train a Plugin on your own data, generate with it, serve it.

    plugin-repro train --base smollm2-135m-instruct --data pairs.jsonl --out my-plugin
    plugin-repro generate --plugin my-plugin --prompt "name[The Eagle] | food[French]"
    plugin-repro evaluate --plugin my-plugin --data test.jsonl   # the Plugin against the base alone
    plugin-repro serve --plugin my-plugin --port 8000

Bad input (a missing or empty file, a missing column, an unknown base, a tokenizer that is not
the base's) is one line on stderr and exit status 2, before any model is loaded where possible.
"""
from __future__ import annotations

import contextlib
import glob
import inspect
import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from ..harness import machine
from ..utils.io import folder_bytes, is_full_disk
from .inputs import CONFIG_FILE, MAX_PROMPT_TOKENS, data_sha256, read_pairs, read_prompts
from .requests import GenerationRequest, TrainingRequest

# torch, transformers and the models load inside each command, after its input is checked: --help
# and refused input answer in well under a second (tests/test_front_door.py).

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, run and serve a Plugin: a small reweighting model on top of a black-box LLM.")


def one_paragraph_listings(*apps: typer.Typer) -> None:
    """Each command's row in a listing (``--help``) is its docstring's first paragraph as one
    flowing text: typer's rich listing keeps the docstring's line breaks, which left ragged rows;
    a command's own --help page reflows them already."""
    for listing in apps:
        for command in listing.registered_commands:
            if command.short_help is None and command.callback is not None and command.callback.__doc__:
                first = inspect.cleandoc(command.callback.__doc__).split("\n\n")[0]
                command.short_help = " ".join(first.split())


def user_errors() -> tuple[type[BaseException], ...]:
    """What a command reports as one line and exit 2: bad files and names (ValueError: the data,
    artifact and tokenizer errors), the file system, an endpoint's errors."""
    from ..core.api_client import ApiError

    return ValueError, OSError, ApiError


def head_dtype_option():
    return typer.Option("float32", help="The reweighting model's output layer at decoding: float32 (exact) or "
                                        "bfloat16 (faster on GPUs and CPUs with bfloat16 instructions; "
                                        "docs/serving.md measures both).")


def engine_option():
    return typer.Option("package", help="What decodes: the package's own (transformers' generate) or vllm (its own "
                                        "environment: bash scripts/bootstrap_vllm.sh; docs/serving.md).")


def fail(message: str, status: int = 2) -> None:
    """One line on stderr and the exit status (README, "Exit statuses": 2 bad input, 3 held by
    another call, 1 a failure of the machine, such as a full disk)."""
    typer.echo(f"plugin-repro: error: {message}", err=True)
    raise typer.Exit(status)


def checked(kind, **flags):
    """``kind(**flags)``: a request (``serving.requests``) whose bad value is one line and exit 2."""
    try:
        return kind(**flags)
    except ValueError as err:
        fail(str(err))


@app.command()
def train(
    base: str = typer.Option(..., help="A registry name (profiles.yaml), a Hub id, a local model directory, "
                                       "or an OpenAI-compatible server's URL (http://host:port)."),
    data: Path = typer.Option(..., help="JSONL or CSV with the columns prompt and completion."),
    out: Path = typer.Option(..., help="The artifact directory to write (replaced whole when training ends)."),
    profile: Optional[str] = typer.Option(None, help="Whose grid and training budget: a profile of profiles.yaml, e.g. "
                                               "local, smoke or paper (default with a GPU and the Hub: colab on "
                                               "Colab, else paper; without: local)."),
    epochs: Optional[int] = typer.Option(None, min=1, help="At most this many epochs (default: the profile's)."),
    lr: Optional[list[float]] = typer.Option(None, help="Learning rates to search (repeat; default: the profile's)."),
    weight_decay: Optional[list[float]] = typer.Option(None, help="Weight decays to search (repeat)."),
    reweighter_layers: Optional[int] = typer.Option(None, help="Blocks of the reweighting model (default: 1)."),
    reweighter_width: Optional[int] = typer.Option(None, help="Hidden width of the reweighting model."),
    refit: bool = typer.Option(True, "--refit/--no-refit", help="Train the chosen configuration again on every pair "
                                                                 "at the end, so the saved model saw all the data."),
    top_k: Optional[int] = typer.Option(None, help="Log-probabilities per position the base gives (an endpoint: "
                                                   "20 unless set; a model: its top-k view, default all)."),
    chat: bool = typer.Option(False, "--chat/--plain", help="Show prompts as a user turn of the chat template."),
    seed: Optional[int] = typer.Option(None, help="Seed of the split and of training (default: the profile's first)."),
    model: Optional[str] = typer.Option(None, help="An endpoint's model field (default: the server's only model)."),
    api_key_env: str = typer.Option("PLUGIN_API_KEY", help="The variable that holds an endpoint's API key."),
    tokenizer: Optional[str] = typer.Option(None, help="An endpoint's tokenizer: a Hub id, a local directory or a "
                                                       "registry name (required for an endpoint)."),
):
    """Train a Plugin on (prompt, completion) pairs and write it as one artifact."""
    request = checked(TrainingRequest, base=base, data=data, out=out, profile=profile, epochs=epochs, lr=lr,
                      weight_decay=weight_decay, reweighter_layers=reweighter_layers,
                      reweighter_width=reweighter_width, refit=refit, top_k=top_k, chat=chat, seed=seed, model=model,
                      api_key_env=api_key_env, tokenizer=tokenizer)
    try:
        pairs = read_pairs(data)
        if out.exists() and any(out.iterdir()) and not (out / CONFIG_FILE).exists():
            fail(f"{out} exists and is not a Plugin artifact: choose a new directory (an artifact there is replaced).")
        with _only_writer(out):  # before torch loads: a second train is refused at once
            typer.echo(f"{len(pairs)} pairs from {data}; loading torch and the base {base} (a first run also "
                       "downloads or converts it)", err=True)
            plugin = _train(request, pairs)
    except DiskFull as err:
        fail(str(err), status=1)
    except user_errors() as err:
        fail(str(err))
    record = plugin.training
    refit_note = (f"; the saved weights are that configuration trained again on all {record['refit']['pairs']} pairs "
                  f"for {record['refit']['epochs']} epoch(s) (--no-refit keeps the selection's)" if record.get("refit")
                  else "; the saved weights are the selection's (trained on the training part only)")
    typer.echo(f"wrote {out}: lr {record['hparams']['lr']:g}, weight decay {record['hparams']['weight_decay']:g}, "
               f"hyper-validation loss {record['val_loss']:.4f} (epoch {record['best_epoch']}){refit_note}")


class DiskFull(Exception):
    """``train`` stopped by a full disk; its message says what was removed and what to do."""


def _train(request: TrainingRequest, pairs: list):
    """``train``'s work once its input is checked and ``out`` is ours; an interrupt (Ctrl-C,
    SIGTERM) ends it with one line saying that the same command resumes."""
    from .training import train_plugin

    out, spec = request.out, request.base_spec()
    recipe = request.recipe(spec)  # without --profile, torch looks for a GPU
    typer.echo(f"base {spec.display}; profile {recipe.name}"
               f"{'' if request.profile else ' (chosen for this machine; --profile overrides)'}", err=True)
    # An interrupted call resumes: every configuration's state is kept beside the output until it is written.
    resume = out.parent / f".{out.name}.resume-{data_sha256(pairs)[:12]}"
    for stale in sorted(out.parent.glob(f".{glob.escape(out.name)}.resume-*")):
        if stale != resume:  # we hold --out's lock, so no other train is using it
            size = folder_bytes(stale)
            shutil.rmtree(stale, ignore_errors=True)
            typer.echo(f"removed {stale} ({size / 2**20:,.0f} MiB): the state of an interrupted train of {out} on "
                       "other data, which this one cannot resume", err=True)
    if resume.exists():
        typer.echo(f"resuming from {resume}", err=True)
    with _interrupts_resume(out, resume), _full_disk_leaves_nothing(out, resume):
        black_box = spec.load(_tokenizer(request.tokenizer) if spec.kind == "endpoint" else None)
        plugin = train_plugin(black_box, spec, pairs, recipe, cache_dir=machine.cache_dir() / "train-outputs",
                              resume_dir=resume, announce=lambda line: typer.echo(line, err=True))
        plugin.save_pretrained(out)
    shutil.rmtree(resume, ignore_errors=True)
    return plugin


@contextlib.contextmanager
def _full_disk_leaves_nothing(out: Path, resume: Path):
    """A full disk (``utils.io.is_full_disk``) ends ``train`` with one line, status 1: its resume
    state is removed, since it holds the space a next attempt needs and may be partly written."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        if not is_full_disk(err, out.parent):
            raise
        free, kept = shutil.disk_usage(out.parent).free, folder_bytes(resume)
        shutil.rmtree(resume, ignore_errors=True)
        raise DiskFull(f"the disk under {out.parent} is full ({free / 2**20:,.0f} MiB free): {out} was not written "
                       f"and the resume state ({kept / 2**20:,.0f} MiB) was removed. Free disk space or choose --out on a "
                       "larger disk (PLUGIN_CACHE_DIR holds the base's outputs), and run again.") from None


@contextlib.contextmanager
def _only_writer(out: Path):
    """One ``train`` per output: a second one into the same ``--out`` is refused at once, naming
    the first (a lock beside it, taken over when its owner has ended)."""
    from ..utils.locks import StoreLock

    lock = StoreLock(out.parent / f".{out.name}.lock")
    if not lock.acquire(blocking=False):
        held = lock.holder() or {}
        fail(f"another plugin-repro train (pid {held.get('pid')} on {held.get('host')}) is writing {out}: wait for "
             "it to end, or choose another --out.", status=3)
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _interrupts_resume(out: Path, resume: Path):
    """Ctrl-C and SIGTERM stop training with one line, status 130 or 143: nothing was written to
    ``out``, and the same command resumes from the state kept in ``resume``."""
    def terminate(signum, _frame):
        raise KeyboardInterrupt(signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except KeyboardInterrupt as stop:
        by_term = stop.args[:1] == (signal.SIGTERM,)
        typer.echo(f"plugin-repro: {'terminated' if by_term else 'interrupted'}; {out} was not written. The same "
                   f"command resumes where this one stopped (its state is kept in {resume}).", err=True)
        raise typer.Exit(143 if by_term else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command()
def generate(
    plugin: Path = typer.Option(..., help="An artifact directory (plugin-repro train, or save_pretrained)."),
    prompt: Optional[str] = typer.Option(None, help="One prompt."),
    file: Optional[Path] = typer.Option(None, help="Prompts: a text file (one per line) or JSONL with a prompt field."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Default: the artifact's."),
    temperature: Optional[float] = typer.Option(None, help="0 is greedy (the artifact's default)."),
    base_url: Optional[str] = typer.Option(None, help="The endpoint base at another address."),
    base_only: bool = typer.Option(False, "--base-only", help="The base alone, decoded as the Plugin decodes "
                                                              "(greedy): what the Plugin changes."),
    max_prompt_tokens: int = typer.Option(MAX_PROMPT_TOKENS, help="Longest prompt accepted, in tokens (a longer "
                                                                  "one is refused, never cut; as serve)."),
    head_dtype: str = head_dtype_option(),
    engine: str = engine_option(),
):
    """Generate with a trained Plugin: one prompt printed as text, a file as JSONL."""
    if (prompt is None) == (file is None):
        fail("give exactly one of --prompt and --file.")
    request = checked(GenerationRequest, max_new_tokens=max_new_tokens, temperature=temperature, base_url=base_url,
                      base_only=base_only, max_prompt_tokens=max_prompt_tokens, head_dtype=head_dtype, engine=engine)
    try:
        prompts = [prompt] if prompt is not None else read_prompts(file)
        outputs = _generated(plugin, prompts, request)
    except user_errors() as err:
        fail(str(err))
    _print_outputs(prompt, prompts, outputs)


def _generated(plugin: Path, prompts: list[str], request: GenerationRequest) -> list[str]:
    """``generate``'s texts: the Plugin's, or with ``base_only`` the base's alone, decoded as the Plugin decodes."""
    progress = len(prompts) > 1
    if request.engine == "vllm":
        return _vllm_outputs(plugin, prompts, request)["base" if request.base_only else "plugin"]
    adapted = request.load(plugin)
    adapted.check_prompt_lengths([adapted.format_prompt(p) for p in prompts], request.max_prompt_tokens)
    if request.base_only:
        from .evaluation import base_only_outputs

        return base_only_outputs(adapted, prompts, max_new_tokens=request.max_new_tokens, progress=progress)
    return adapted.generate(prompts, progress=progress, max_prompt_tokens=request.max_prompt_tokens,
                            **request.overrides())


def _print_outputs(prompt: str | None, prompts: list[str], outputs: list[str]) -> None:
    if prompt is not None:
        typer.echo(outputs[0])
    else:
        for text, output in zip(prompts, outputs):
            typer.echo(json.dumps({"prompt": text, "completion": output}, ensure_ascii=False))


def _vllm_outputs(plugin: Path, prompts: list[str], request: GenerationRequest) -> dict[str, list[str]]:
    """The texts of ``vllm_engine.generate``, prompts over ``max_prompt_tokens`` refused first."""
    from . import vllm_engine
    from .artifact import PromptTooLong

    limit = request.max_prompt_tokens
    ids, _ = vllm_engine.prompt_ids(plugin, prompts)
    for i, row in enumerate(ids):
        if len(row) > limit:
            raise PromptTooLong(f"prompt {i + 1} has {len(row)} tokens; at most {limit} are accepted "
                                "(--max-prompt-tokens). Shorten it: it is never cut silently.")
    return vllm_engine.generate(plugin, prompts, progress=len(prompts) > 1, base_only=request.base_only,
                                head_dtype=request.head_dtype, max_new_tokens=request.max_new_tokens,
                                temperature=request.temperature)


@app.command()
def evaluate(
    plugin: Path = typer.Option(..., help="An artifact directory."),
    data: Path = typer.Option(..., help="Held-out pairs: JSONL or CSV with the columns prompt and completion."),
    resamples: int = typer.Option(1000, min=100, help="Paired bootstrap draws over the pairs."),
    max_new_tokens: Optional[int] = typer.Option(None, help="Default: the artifact's."),
    base_url: Optional[str] = typer.Option(None, help="The endpoint base at another address."),
    card: bool = typer.Option(True, help="Store evaluation.json in the artifact and add the table to its model card."),
    head_dtype: str = head_dtype_option(),
    engine: str = engine_option(),
):
    """The Plugin against its base alone on held-out pairs, with paired bootstrap CIs: the paper's BLEU, ROUGE-1/2/L
    and NIST; sacrebleu's BLEU and chrF (0-100, with signatures); exact match; output length against the
    references', empty outputs and outputs at the token limit."""
    request = checked(GenerationRequest, max_new_tokens=max_new_tokens, base_url=base_url, head_dtype=head_dtype,
                      engine=engine)
    try:
        pairs = read_pairs(data)
        from .evaluation import markdown, write_to_artifact

        typer.echo(f"{len(pairs)} pairs from {data}; decoding with the Plugin and with the base alone"
                   + (" in vLLM" if request.engine == "vllm" else ""), err=True)
        result = _evaluation(plugin, pairs, resamples, request)
        result["data"] = {"file": str(data), "pairs": len(pairs)}
        if card:
            write_to_artifact(plugin, result)
    except user_errors() as err:
        fail(str(err))
    typer.echo(markdown(result), nl=False)
    if card:
        typer.echo(f"stored in {plugin / 'evaluation.json'} and the model card ({plugin / 'README.md'})", err=True)


def _evaluation(plugin: Path, pairs, resamples: int, request: GenerationRequest) -> dict:
    """``evaluate``'s result: both systems decoded greedily by the request's engine, then scored."""
    from .evaluation import evaluate as run_evaluation, score

    if request.engine == "package":
        return run_evaluation(request.load(plugin), pairs, resamples=resamples, max_new_tokens=request.max_new_tokens,
                              progress=len(pairs) > 16)
    from . import vllm_engine
    from .artifact_files import read_config

    limit = request.max_new_tokens or (read_config(plugin).get("decoding") or {}).get("max_new_tokens", 64)
    found = vllm_engine.generate(plugin, [p.prompt for p in pairs], both=True, max_new_tokens=limit,
                                 temperature=0.0, progress=len(pairs) > 16, head_dtype=request.head_dtype)
    return score(found["plugin"], found["base"], [p.completion for p in pairs], vllm_engine.tokenizer_of(plugin),
                 limit=limit, resamples=resamples, engine="vllm", head_dtype=request.head_dtype)


@app.command()
def serve(
    plugin: Path = typer.Option(..., help="An artifact directory."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    name: Optional[str] = typer.Option(None, help="The model id clients use (default: the directory's name)."),
    max_concurrency: Optional[int] = typer.Option(None, help="Requests decoded at once (default: 8 in process, "
                                                             "in one batch; 4 over an endpoint)."),
    max_queue: int = typer.Option(16, help="Requests that may wait; beyond that, 503."),
    max_tokens: int = typer.Option(512, help="Largest max_tokens a request may ask for."),
    max_prompt_tokens: int = typer.Option(MAX_PROMPT_TOKENS, help="Longest prompt accepted, in tokens (a longer "
                                                                  "one is refused, never cut; as generate)."),
    base_url: Optional[str] = typer.Option(None, help="The endpoint base at another address."),
    api_key: Optional[str] = typer.Option(None, envvar="PLUGIN_API_KEY", show_default=False,
                                          help="Clients must send 'Authorization: Bearer <key>' (OpenAI's api_key)."),
    docs: bool = typer.Option(False, help="Also serve the interactive docs (/docs, /openapi.json)."),
    head_dtype: str = head_dtype_option(),
    shutdown_grace_s: float = typer.Option(5.0, min=0, help="On SIGTERM or Ctrl-C, the seconds requests in flight "
                                                             "have to finish before they are stopped (open streams "
                                                             "end with an error event)."),
    engine: str = engine_option(),
):
    """Serve the adapted model with an OpenAI-compatible API (/v1/completions, /v1/chat/completions); with
    --engine vllm, vLLM's own server with the Plugin inside it."""
    from .server import exposure_warning

    request = checked(GenerationRequest, max_prompt_tokens=max_prompt_tokens, base_url=base_url, docs=docs,
                      head_dtype=head_dtype, engine=engine)
    warning = exposure_warning(host, api_key)
    if warning:
        typer.secho(warning, err=True, fg=typer.colors.RED, bold=True)
    if request.engine == "vllm":
        _serve_in_vllm(plugin, request.head_dtype, host=host, port=port, name=name or plugin.resolve().name,
                       api_key=api_key, max_concurrency=max_concurrency or 16,
                       max_model_len=request.max_prompt_tokens + max_tokens)

    try:
        from .server import GracefulServer, Limits, create_app

        adapted = request.load(plugin)
        limits = Limits(max_concurrency=max_concurrency or (4 if adapted.base_spec.kind == "endpoint" else 8),
                        max_queue=max_queue, max_tokens=max_tokens, max_prompt_tokens=request.max_prompt_tokens)
        api = create_app(adapted, model_id=name or plugin.resolve().name, limits=limits, api_key=api_key,
                         docs=request.docs)
    except user_errors() as err:
        fail(str(err))
    GracefulServer(api, host=host, port=port, grace_s=shutdown_grace_s, log_level="info").run()


def _serve_in_vllm(plugin: Path, head_dtype: str, **options) -> None:
    """Become vLLM's OpenAI-compatible server with the Plugin's processor (signals reach it directly)."""
    try:
        import os

        from . import vllm_engine

        command = vllm_engine.server_command(plugin, **options)
        typer.echo(f"plugin-repro serve: vLLM's server with the Plugin ({plugin}) on {options['host']}:{options['port']}",
                   err=True)
        sys.stdout.flush()
        os.execve(command[0], command, vllm_engine.environment(plugin, head_dtype))
    except user_errors() as err:
        fail(str(err))


def _tokenizer(source: str):
    from ..harness import models

    return models.api_tokenizer({"name": source, "tokenizer": source})


one_paragraph_listings(app)


def main() -> None:
    app(prog_name="plugin-repro")


if __name__ == "__main__":
    sys.exit(main())
