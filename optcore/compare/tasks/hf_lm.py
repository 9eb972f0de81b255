"""A tiny Hugging Face causal LM (Llama architecture: RMSNorm, rotary
positions, SwiGLU) built from a config, no weights downloaded, trained on the
shipped corpus at the character level. Needs ``transformers``.

Why: users pick optimizers for ``transformers`` models; this runs one (2
layers, d=64, ~0.1M parameters) in seconds, next to the hand-written char-lm.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor, nn

from optcore import ConfigError

from .char_lm import CharData, load_corpus, next_char_loss


class _LogitsOnly(nn.Module):
    """``model(input_ids).logits``: the task's loss sees a plain tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.inner(input_ids=input_ids).logits


class HFLlamaTask:
    """The task protocol for ``LlamaForCausalLM`` from a tiny ``LlamaConfig``."""

    name = "hf-llama"
    loss_label = "cross-entropy (nats/char)"

    def __init__(self, layers: int = 2, d_model: int = 64, heads: int = 4, context: int = 64, batch_size: int = 16):
        try:
            import transformers
        except ImportError:
            raise ConfigError(
                "--task hf-llama needs transformers: pip install transformers.", problems=[("task", "missing package")]
            ) from None
        self.data = CharData(load_corpus(), context, batch_size)
        self.config = transformers.LlamaConfig(
            vocab_size=len(self.data.vocab), hidden_size=d_model, intermediate_size=int(d_model * 8 / 3),
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=context, tie_word_embeddings=False,
        )  # fmt: skip
        self._transformers = transformers

    def describe(self) -> str:
        c = self.config
        return (
            f"transformers LlamaForCausalLM ({c.num_hidden_layers} layers, d={c.hidden_size}) on characters, "
            f"batch {self.data.batch_size}x{self.data.context}"
        )

    def model(self) -> nn.Module:
        model = self._transformers.LlamaForCausalLM(self.config)
        model.config.use_cache = False
        return _LogitsOnly(model)

    def batches(self, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.batches(seed)

    def heldout(self, seed: int) -> list[tuple[Tensor, Tensor]]:
        return self.data.heldout(seed, 4)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return next_char_loss(model(x), y)
