"""The default task: a tiny character-level transformer language model on a
corpus shipped in the package.

Why this task: it is the kind of model people pick optimizers for (attention,
layer norms, embeddings, weight decay that matters), it needs no download, and
at 2 layers x d=64 (~0.1M parameters) a few hundred steps take seconds on a CPU
while the optimizers still separate clearly.

The corpus (``optcore/data/corpus.txt``, 12 KB) is public-domain text:
Shakespeare's sonnets 1, 2, 18, 19, 29, 30, 55, 60, 65, 73, 104, 106, 116, 130
and 146, the Gettysburg Address, a passage of the Declaration of Independence
and the Preamble of the US Constitution. Every 8th block of 256 characters is
held out for validation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor, nn
from torch.nn import functional as F

BLOCK = 256
HOLDOUT_EVERY = 8


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of the task (defaults: ~0.1M parameters, ~5 ms a step on 2 CPU cores)."""

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    context: int = 64
    batch_size: int = 16
    eval_batches: int = 4


def load_corpus() -> str:
    """The shipped text."""
    return resources.files("optcore").joinpath("data/corpus.txt").read_text(encoding="utf-8")


class CharData:
    """The corpus as token ids, split into train and held-out text, with
    batches drawn from a seeded generator (so a run is reproducible)."""

    def __init__(self, text: str, context: int, batch_size: int) -> None:
        self.vocab = sorted(set(text))
        index = {ch: i for i, ch in enumerate(self.vocab)}
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        blocks = list(ids.split(BLOCK))
        held = [b for i, b in enumerate(blocks) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        self.train = torch.cat([b for i, b in enumerate(blocks) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1])
        self.val = torch.cat(held)
        self.context, self.batch_size = context, batch_size

    def batch(self, generator: torch.Generator, split: str = "train") -> tuple[Tensor, Tensor]:
        """``(inputs, targets)`` of shape (batch, context): random windows, targets shifted by one."""
        data = self.train if split == "train" else self.val
        n = self.context
        starts = torch.randint(0, len(data) - n - 1, (self.batch_size,), generator=generator).tolist()
        x = torch.stack([data[s : s + n] for s in starts])
        y = torch.stack([data[s + 1 : s + n + 1] for s in starts])
        return x, y

    def batches(self, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield self.batch(generator)

    def heldout(self, seed: int, n: int) -> list[tuple[Tensor, Tensor]]:
        """The same held-out batches for every config of a run."""
        generator = torch.Generator().manual_seed(seed + 1)
        return [self.batch(generator, "val") for _ in range(n)]


def next_char_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy in fp32 (also when the model computes in fp16/bf16)."""
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    """Token + position embeddings, ``n_layers`` blocks, a final norm and an untied head."""

    def __init__(self, vocab_size: int, task: TaskConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, task.d_model)
        self.pos = nn.Embedding(task.context, task.d_model)
        self.blocks = nn.ModuleList(Block(task.d_model, task.n_heads) for _ in range(task.n_layers))
        self.ln_f = nn.LayerNorm(task.d_model)
        self.head = nn.Linear(task.d_model, vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class CharLMTask:
    """The task protocol (:mod:`optcore.compare.tasks`) for :class:`CharLM`."""

    name = "char-lm"
    loss_label = "cross-entropy (nats/char)"

    def __init__(self, config: TaskConfig = TaskConfig()) -> None:
        self.config = config
        self.data = CharData(load_corpus(), config.context, config.batch_size)

    def describe(self) -> str:
        c = self.config
        return f"char transformer LM ({c.n_layers} layers, d={c.d_model}), batch {c.batch_size}x{c.context}"

    def model(self) -> nn.Module:
        return CharLM(len(self.data.vocab), self.config)

    def batches(self, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.batches(seed)

    def heldout(self, seed: int) -> list[tuple[Tensor, Tensor]]:
        return self.data.heldout(seed, self.config.eval_batches)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return next_char_loss(model(x), y)

    @torch.no_grad()
    def sample(self, model: nn.Module, n: int, seed: int, device: torch.device, prompt: str = "Shall I ") -> str:
        """``n`` characters after ``prompt``, drawn at temperature 0.8 from a seeded generator."""
        vocab = self.data.vocab
        index = {ch: i for i, ch in enumerate(vocab)}
        ids = torch.tensor([[index[ch] for ch in prompt if ch in index]], device=device)
        generator = torch.Generator(device=device).manual_seed(seed)
        model.eval()
        for _ in range(n):
            logits = model(ids[:, -self.config.context :])[0, -1].float() / 0.8
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        model.train()
        return "".join(vocab[i] for i in ids[0].tolist())
