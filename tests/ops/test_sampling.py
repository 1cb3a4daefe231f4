"""Sampling on tpu, as RL rollouts and `generate(do_sample=True)` use it: the token
distribution matches the one asked for (temperature, top-k, top-p), seeded sampling
repeats, and the log-probabilities generation returns match a forward pass."""
import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0, 0.25]])
SETTINGS = {
    "plain": [],
    "temperature 0.7": [TemperatureLogitsWarper(0.7)],
    "top-k 4": [TopKLogitsWarper(4)],
    "temperature 1.3, top-p 0.8": [TemperatureLogitsWarper(1.3), TopPLogitsWarper(0.8)],
    "all three": [TemperatureLogitsWarper(0.7), TopKLogitsWarper(6), TopPLogitsWarper(0.9)],
}
DRAWS = 20_000


def _probs(device, warpers):
    x = LOGITS.to(device)
    for w in warpers:
        x = w(None, x)
    return torch.softmax(x, dim=-1)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_token_distribution_matches_the_requested_one(setting, eager):
    """A chi-square goodness-of-fit test of DRAWS tpu draws against the distribution the
    same warpers give on CPU; tokens the warpers exclude are never drawn."""
    want = _probs("cpu", SETTINGS[setting])[0].double()
    p = _probs("tpu", SETTINGS[setting])
    torch.manual_seed(1234)
    draws = torch.multinomial(p.expand(DRAWS, -1).contiguous(), 1).view(-1).cpu()
    counts = torch.bincount(draws, minlength=len(want)).double()
    assert counts[want == 0].sum() == 0, f"excluded tokens drawn: {counts}"
    keep = want > 0
    _, pvalue = stats.chisquare(counts[keep].numpy(), (want[keep] / want[keep].sum() * counts.sum()).numpy())
    assert pvalue > 1e-4, f"{setting}: p={pvalue:.2e}, counts {counts.tolist()}, want {want.tolist()}"


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_seeded_generate_repeats_and_its_logprobs_match_a_forward_pass(eager):
    model = _model().to("tpu")
    prompt = torch.randint(0, 64, (3, 5)).to("tpu")
    kw = dict(do_sample=True, top_k=20, top_p=0.95, temperature=0.8, max_new_tokens=6,
              min_new_tokens=6, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    with torch.no_grad():
        torch.manual_seed(7)
        a = model.generate(prompt, **kw)
        torch.manual_seed(7)
        b = model.generate(prompt, **kw)
        torch.manual_seed(8)
        c = model.generate(prompt, **kw)
        assert torch.equal(a.sequences.cpu(), b.sequences.cpu())
        assert not torch.equal(a.sequences.cpu(), c.sequences.cpu())
        new = a.sequences[:, prompt.shape[1]:]
        returned = torch.stack(a.logits, dim=1).log_softmax(-1).gather(-1, new[..., None])
        full = model(a.sequences).logits[:, prompt.shape[1] - 1:-1].log_softmax(-1)
        recomputed = full.gather(-1, new[..., None])
        torch.testing.assert_close(returned.cpu(), recomputed.cpu(), rtol=1e-4, atol=1e-4)
