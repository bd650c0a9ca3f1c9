"""Build the tiny Llama that the tests and the demo serve with a real vLLM.

No model can be downloaded on the machines kvwatch is developed on, so we make one: random bf16
weights with the shape of a ~30M-parameter Llama (8 KiB of KV per token) and a byte-level BPE
tokenizer trained on a seeded synthetic corpus. The output text is gibberish; what matters is that
vLLM serves it exactly like a real model, so KV arithmetic and preemption behave as in production.
Every build of the same spec is byte-identical.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "TinyModelSpec",
    "DEFAULT_SPEC",
    "SWA_SPEC",
    "default_cache_dir",
    "build_tiny_model",
    "model_dir_for",
    "build_tokenizer",
    "build_dir_atomically",
]

# Bump when the build changes what it writes, so old caches are not reused.
_BUILD_VERSION = 1
_MARKER = "kvwatch-model.json"

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + ': ' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant: ' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated model; the defaults give 8 KiB of bf16 KV per token."""

    name: str = "tiny-llama-30m"
    hidden_size: int = 512
    intermediate_size: int = 1536
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    vocab_size: int = 4096
    max_position_embeddings: int = 4096
    seed: int = 0
    # Sliding-window attention: the window, and every how many layers one is full attention
    # (0: every layer slides). Written as `sliding_window` and `layer_types`, which vLLM's
    # llama.py reads per layer.
    sliding_window: int | None = None
    full_attention_every: int = 0

    def layer_types(self) -> list[str] | None:
        if self.sliding_window is None:
            return None
        every = self.full_attention_every
        return [
            "full_attention" if every and (i + 1) % every == 0 else "sliding_attention"
            for i in range(self.num_hidden_layers)
        ]

    @property
    def kv_bytes_per_token(self) -> int:
        """At full attention's rate (a sliding-window layer holds only its window)."""
        head_dim = self.hidden_size // self.num_attention_heads
        return self.num_hidden_layers * 2 * self.num_key_value_heads * head_dim * 2


DEFAULT_SPEC = TinyModelSpec()
# About 200M parameters, 32 KiB of KV per token: compute-bound decode on a CPU core, so recompute
# after a preemption costs real time (used where the cost of thrashing must show).
SMALL_SPEC = TinyModelSpec(
    name="small-llama-200m",
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=8,
)
# The tiny model with a 64-token sliding window on every other layer (Gemma/gpt-oss style
# interleaving): two KV cache groups, a request holds its window's blocks in one of them.
SWA_SPEC = TinyModelSpec(name="tiny-llama-30m-swa", sliding_window=64, full_attention_every=2)
SPECS = {"tiny": DEFAULT_SPEC, "small": SMALL_SPEC, "tiny-swa": SWA_SPEC}


def default_cache_dir() -> Path:
    """`$KVWATCH_CACHE`, else `~/.cache/kvwatch`."""
    env = os.environ.get("KVWATCH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kvwatch"


def model_dir_for(spec: TinyModelSpec = DEFAULT_SPEC, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / f"{spec.name}-v{_BUILD_VERSION}"


def _corpus(seed: int, n_lines: int = 20000) -> list[str]:
    """Seeded pseudo-English text: enough variety for a ~4k BPE vocabulary."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [26 - i for i in range(len(letters))]
    words = ["".join(rng.choices(letters, weights, k=rng.randint(1, 9))) for _ in range(3000)]
    punct = [".", ",", "?", "!", ":", ";"]
    lines = []
    for _ in range(n_lines):
        n = rng.randint(4, 18)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        lines.append(sentence.capitalize() + rng.choice(punct) + f" {rng.randint(0, 9999)}")
    return lines


def _build_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def build_tokenizer(out: Path, spec: TinyModelSpec = DEFAULT_SPEC) -> int:
    """Write the tiny model's tokenizer into `out` (for a model served without weights, as the
    twin serves); returns its vocabulary size."""
    from transformers import PreTrainedTokenizerFast

    _build_tokenizer(spec, out)
    return len(PreTrainedTokenizerFast.from_pretrained(str(out)))


def _build_weights(spec: TinyModelSpec, out: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        vocab_size=vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    if spec.sliding_window is not None:
        cfg_file = out / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg |= {"sliding_window": spec.sliding_window, "layer_types": spec.layer_types()}
        cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_tiny_model(
    spec: TinyModelSpec = DEFAULT_SPEC, cache_dir: Path | None = None, force: bool = False
) -> Path:
    """Return the model directory, building it first unless a complete build is cached.

    The build goes to a temporary sibling and is renamed into place, so an interrupted build never
    leaves a half-written model that a later run would mistake for a good one.
    """
    target = model_dir_for(spec, cache_dir)
    marker = target / _MARKER
    # fields at their "off" value are left out, so adding one does not rebuild older caches
    fields = {k: v for k, v in asdict(spec).items() if v is not None and v != 0 or k == "seed"}
    wanted = {"build_version": _BUILD_VERSION, "spec": fields}
    if not force and marker.exists():
        try:
            if json.loads(marker.read_text()) == wanted:
                return target
        except (OSError, ValueError):
            pass

    def fill(tmp: Path) -> None:
        vocab = build_tokenizer(tmp, spec)
        _build_weights(spec, tmp, vocab)
        (tmp / _MARKER).write_text(json.dumps(wanted, sort_keys=True, indent=2) + "\n")

    build_dir_atomically(target, fill)
    return target


def build_dir_atomically(target: Path, fill: Callable[[Path], T]) -> T:
    """Fill a temporary sibling of `target` and rename it into place: an interrupted build
    never leaves a half-written directory that a later run would mistake for a good one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        out = fill(tmp)
        tmp.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
