"""GRPO (group relative policy optimization) in plain PyTorch: the loop that
examples/grpo.py runs and `python -m torch_tpu bench rl` times, one implementation for
both (and the example's tests).

One iteration: sample G completions for each of N prompts from the policy (temperature and
top-k, drawn by the device's generator); score them; normalize each reward within its
prompt's group (the advantage); one forward of a frozen reference copy; then the clipped
policy-gradient loss with a KL penalty against the reference, and an AdamW step. The toy
task rewards the fraction of completion tokens that equal TARGET, so the reward curve
starts near 1/vocab and rises within a few dozen iterations.

Nothing here is specific to tpu but the device string. The loop keeps every shape fixed
(batch, sequence length, number of new tokens), so after the first two iterations no
iteration compiles a program, in any eager mode or compiled.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import time

import torch

from .workloads import decoder

TARGET = 7


@dataclasses.dataclass
class Config:
    vocab: int = 32
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    prompts: int = 8          # N prompts per iteration
    group: int = 8            # G completions per prompt
    prompt_len: int = 4
    new_tokens: int = 8       # every completion is exactly this long (no early stop)
    temperature: float = 1.0
    top_k: int = 16
    lr: float = 3e-3
    beta: float = 0.04        # weight of the KL penalty against the reference
    clip: float = 0.2         # PPO clip range of the importance ratio
    updates: int = 1          # optimizer steps per rollout (the ratio differs from 1 after the first)
    seed: int = 0

    def model_spec(self) -> decoder.DecoderSpec:
        """The policy: a Llama with 2 query heads per KV head; token 0 is the pad token."""
        return decoder.DecoderSpec(vocab=self.vocab, hidden=self.hidden, layers=self.layers,
                                   heads=self.heads, kv_heads=self.heads // 2, pad=0,
                                   seed=self.seed)


def prompt_batches(cfg: Config, n: int) -> list[torch.Tensor]:
    """`n` batches of N random prompts (CPU), never containing TARGET."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    out = []
    for _ in range(n):
        p = torch.randint(1, cfg.vocab - 1, (cfg.prompts, cfg.prompt_len), generator=g)
        out.append(p + (p >= TARGET).long())
    return out


def reward_fn(completions: torch.Tensor) -> torch.Tensor:
    """The programmatic reward: the fraction of a completion's tokens equal to TARGET,
    computed on the device (no host round trip)."""
    return (completions == TARGET).float().mean(dim=1)


class GRPO:
    """The policy, its frozen reference copy, the optimizer and the four phases of one
    iteration: `rollout`, `score`, `reference`, `update` (`step` runs them in turn)."""

    def __init__(self, cfg: Config, device: str = "tpu", compile: bool = False,
                 model: torch.nn.Module | None = None):
        self.cfg, self.device = cfg, torch.device(device)
        if model is None:
            model = decoder.build_model(cfg.model_spec())
        self.policy = model.to(self.device)
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        # fused AdamW where the device has it (as HF Trainer picks), otherwise the foreach one
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=cfg.lr,
                                     fused=self.device.type != "cpu")
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def logits(model, ids):
            return model(input_ids=ids, use_cache=False).logits

        # torch.compile wraps the forward only; sampling, the loss and the optimizer stay eager
        self._logits = torch.compile(logits, backend="tpu") if compile else logits

    # ------------------------------------------------------------ the four phases
    @torch.no_grad()
    def rollout(self, prompts: torch.Tensor) -> torch.Tensor:
        """G sampled completions per prompt -> token ids [N*G, prompt_len + new_tokens].

        Our own sampling loop over a preallocated buffer rather than HF `generate`: every
        step runs the same full-length forward (the causal mask keeps the not-yet-written
        positions from influencing the logits read at `pos - 1`), writes one token column
        at an offset (a view's offset is program data, not part of its key), and never
        reads a value back to the host. `generate`'s dynamic KV cache instead grows by one
        position per token, a new shape (and programs) at every length, and its stopping
        check reads a flag to the host after every token. For a model this small the
        recomputed prefix costs less than those programs and round trips."""
        cfg = self.cfg
        p = cfg.prompt_len
        seqs = torch.zeros(cfg.prompts * cfg.group, p + cfg.new_tokens, dtype=torch.long,
                           device=self.device)
        seqs[:, :p] = prompts.to(self.device).repeat_interleave(cfg.group, dim=0)
        for pos in range(p, p + cfg.new_tokens):
            last = self._logits(self.policy, seqs)[:, pos - 1] / cfg.temperature
            top, idx = last.topk(cfg.top_k, dim=-1)
            choice = torch.multinomial(top.softmax(dim=-1), 1, generator=self.gen)
            seqs[:, pos] = idx.gather(1, choice).squeeze(1)
        return seqs

    def score(self, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (rewards [N*G], group-normalized advantages [N*G])."""
        rewards = reward_fn(seqs[:, self.cfg.prompt_len:])
        grouped = rewards.view(self.cfg.prompts, self.cfg.group)
        adv = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)
        return rewards, adv.reshape(-1)

    def _token_logp(self, model, seqs):
        """Log-probability of each completion token under `model`: [N*G, new_tokens]."""
        p = self.cfg.prompt_len
        logits = self._logits(model, seqs)[:, p - 1:-1]
        return logits.log_softmax(dim=-1).gather(-1, seqs[:, p:, None]).squeeze(-1)

    @torch.no_grad()
    def reference(self, seqs: torch.Tensor) -> torch.Tensor:
        return self._token_logp(self.ref, seqs)

    def update(self, seqs, adv, ref_logp) -> torch.Tensor:
        """`cfg.updates` AdamW steps on the clipped surrogate plus beta * KL (the k3
        estimator, as TRL's GRPOTrainer). The rollout's policy is the first update's own
        detached log-probabilities, as TRL does for one update per rollout: the ratio is
        then 1 but its gradient is the policy gradient; later updates clip it."""
        cfg, a = self.cfg, adv[:, None]
        for i in range(cfg.updates):
            logp = self._token_logp(self.policy, seqs)
            if i == 0:
                old = logp.detach()
            ratio = torch.exp(logp - old)
            surrogate = torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
            d = ref_logp - logp
            kl = torch.exp(d) - d - 1
            loss = (-surrogate + cfg.beta * kl).mean()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    # ------------------------------------------------------------ one iteration
    def step(self, prompts: torch.Tensor, phases: dict | None = None) -> tuple[float, float]:
        """One iteration -> (mean reward, loss), read to the host once. With `phases`, each
        phase's wall time (device work waited for) is added to phases[name]."""
        timer = self._timer(phases)
        with timer("rollout"):
            seqs = self.rollout(prompts)
        with timer("scoring"):
            rewards, adv = self.score(seqs)
        with timer("reference"):
            ref_logp = self.reference(seqs)
        with timer("update"):
            loss = self.update(seqs, adv, ref_logp)
        return rewards.mean().item(), loss.item()

    def _timer(self, phases):
        @contextlib.contextmanager
        def phase(name):
            if phases is None:
                yield
                return
            self.synchronize()
            t0 = time.perf_counter()
            yield
            self.synchronize()
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
        return phase

    def synchronize(self) -> None:
        if self.device.type != "cpu":
            torch.accelerator.synchronize()


def compiled_programs() -> int:
    """Programs compiled so far in this process: per-op executables, fused graphs and
    torch.compile executables (torch.tpu.compile_cache_stats's misses)."""
    kinds = torch.tpu.compile_cache_stats(programs=False, disk=False)["kinds"]
    return sum(k["misses"] for k in kinds.values())
