"""One KV cache for a changing batch (serving.batch_cache, the Plugin's state inside vLLM): as
requests join, leave, move and grow, each step's logits are those of each request decoded alone."""
import pytest
import torch

from plugin_lib.core.reweighter import make_reweighter
from plugin_lib.serving.batch_cache import BatchCache, Request, step

VOCAB = 211


def _alone(model, ids: list[int]) -> torch.Tensor:
    """The logits at the last position of ``ids``, the model run on them alone, without a cache."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("layers", [1, 2])
def test_each_request_gets_the_logits_it_would_get_alone_while_the_batch_changes(arch, layers):
    model = make_reweighter(arch, VOCAB, n_layer=layers, hidden_size=64, intermediate_size=128, seed=1).eval()
    rng = torch.Generator().manual_seed(0)

    def request(length: int) -> Request:
        return Request(torch.randint(0, VOCAB, (length,), generator=rng).tolist(), [], True, None)

    a, b, c, d = request(5), request(11), request(3), request(7)
    cache = BatchCache()
    # (the requests of each step, in the engine's order): joins, a leave, a swap, a step with nothing
    # new (the next-to-last: its logits are kept), and at step 4 two tokens at once for a (it starts again)
    schedule = [[a, b], [a, b, c], [c, b, a], [c, a], [c, a, d], [d, a], [d, a]]
    for n, batch in enumerate(schedule):
        with torch.no_grad():
            got = cache.logits(step(model, cache, batch, "cpu"))
        for row, r in zip(got, batch):
            want = _alone(model, r.prompt + r.output)
            assert torch.allclose(row, want, rtol=1e-5, atol=1e-5), (arch, layers, n, (row - want).abs().max())
        if n != len(schedule) - 2:
            for r in batch:
                r.output += torch.randint(0, VOCAB, (2 if (n, r) == (3, a) else 1,), generator=rng).tolist()
    # the columns of the requests that left and a block's padding are trimmed: none is empty for every row
    assert bool(cache.mask.any(0).all()) and cache.mask.shape[0] == 2


def test_a_context_free_model_reads_the_newest_token_alone():
    model = make_reweighter("mlp", VOCAB, hidden_size=16, intermediate_size=32, seed=2).eval()
    first, second = Request([3, 4, 5], [9], True, None), Request([7], [], True, None)
    with torch.no_grad():
        cache = BatchCache()
        got = cache.logits(step(model, cache, [first, second], "cpu"))
        want = model(torch.tensor([[9], [7]])).logits[:, -1]
    assert torch.equal(got, want)
