"""Tiny random-weight chat models, built locally in seconds: for self-tests and the test suite.

A byte-level BPE tokenizer trained on a few sentences (ChatML template, eos `<|im_end|>`) and a
2-layer Qwen2 with head_dim 64 (vLLM's CPU attention kernels need head_dim in {32, 64, 80, ...}).
Random weights produce gibberish: exactly what proves that constrained decoding alone yields valid
rubric JSON, and that batching, token accounting, resume and the result format hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    'JSON looks like {"unsafe": true, "relevant": false, "useful": true, "label": "harmful", "rationale": "text"}.',
    "I'm sorry, but I cannot help with that request. Here is a safer alternative instead.",
    "Step 1: mix the ingredients. Step 2: heat slowly. Step 3: let it cool for 10 minutes.",
    "Yes No yes no Uncertain harmful not_harmful uncertain safe unsafe controversial refused",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()[]{}<>-_/\\=+*&%$#@",
]


class ChatFormat(BaseModel):
    """A model family's chat format as a tiny model carries it: its special tokens and chat template."""

    model_config = ConfigDict(frozen=True)

    special_tokens: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None = None
    template: str


CHATML_FORMAT = ChatFormat(
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    eos="<|im_end|>",
    pad="<|endoftext|>",
    template=CHATML,
)
# The 2026 guards' formats (judging.guards_2026 says which facts each is written from, and from where).
GUARD_FORMATS: dict[str, tuple[str, ChatFormat]] = {
    # Shieldstral-1.0-3B: Ministral 3 (mistral3), system then user turn, BOS <s>.
    "shieldstral": (
        "mistral",
        ChatFormat(
            special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
            eos="</s>",
            pad="<unk>",
            bos="<s>",
            template=(
                "{{ bos_token }}{% for m in messages %}"
                "{% if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT]' + m['content'] + '[/SYSTEM_PROMPT]' }}"
                "{% elif m['role'] == 'user' %}{{ '[INST]' + m['content'] + '[/INST]' }}"
                "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
            ),
        ),
    ),
    # Nemotron-3.5-Content-Safety: Gemma-3-4B-it's template (as vLLM's examples/tool_chat_template_gemma3_pythonic
    # .jinja carries it, tools left out): BOS <bos>, a system message before the first user turn's text, the
    # model's turn named `model`, and each message's text `| trim`.
    "nemotron-3.5": (
        "gemma3_text",
        ChatFormat(
            special_tokens=("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
            eos="<end_of_turn>",
            pad="<pad>",
            bos="<bos>",
            template=(
                "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
                "{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
                "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
                "{% for m in turns %}"
                "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
                "{{ (prefix if loop.first else '') + m['content'] | trim }}"
                # its arguments (NeMo Guardrails' tutorial), read as a stand-in: the released template's use is unknown
                "{% if loop.first and request_categories is defined %}{{ '\n' + request_categories }}{% endif %}"
                "{{ '<end_of_turn>\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}"
                "{% if enable_thinking is defined and enable_thinking %}{{ '<think>\n' }}{% endif %}{% endif %}"
            ),
        ),
    ),
    # Granite Guardian 4.1: Granite role tokens (no BOS).
    "granite-guardian-4.1": (
        "granite",
        ChatFormat(
            special_tokens=("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"),
            eos="<|end_of_text|>",
            pad="<|end_of_text|>",
            template=(
                "{% for m in messages %}{{ '<|start_of_role|>' + m['role'] + '<|end_of_role|>' + m['content'] }}"
                "{{ '<|end_of_text|>\n' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}"
            ),
        ),
    ),
    # Sing-Guard-2b: Qwen turns (ChatML; it is Qwen3-VL-2B-Instruct based); its arguments (inclusionAI's README):
    # `policy`, the rules, as the system turn; `thinking_type`, its mode (thinking only when told, here).
    "singguard": (
        "qwen3",
        CHATML_FORMAT.model_copy(
            update={
                "template": "{% if policy is defined %}{{ '<|im_start|>system\n' + policy + '<|im_end|>\n' }}{% endif %}"
                + CHATML
                + "{% if add_generation_prompt and thinking_type is defined and thinking_type != 'fast' %}"
                "{{ '<think>\n' }}{% endif %}"
            }
        ),
    ),
}


def _tiny_tokenizer(vocab_size: int, chat: ChatFormat = CHATML_FORMAT) -> Any:
    """A byte-level BPE tokenizer trained on `_CORPUS`, with `chat`'s special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(chat.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_CORPUS * 20, trainer=trainer)
    named = {chat.eos, chat.pad, *([chat.bos] if chat.bos else [])}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=chat.eos,
        pad_token=chat.pad,
        bos_token=chat.bos,
        additional_special_tokens=[t for t in chat.special_tokens if t not in named],
    )
    tokenizer.chat_template = chat.template
    return tokenizer


ARCHITECTURES = ("qwen2", "qwen3", "granite", "llama", "mistral", "gemma3_text")


def build_tiny_chat_model(
    out_dir: str | Path,
    seed: int = 0,
    vocab_size: int = 512,
    architecture: str = "qwen2",
    chat: ChatFormat = CHATML_FORMAT,
) -> Path:
    """Write a tiny random-weight chat model (config, safetensors, tokenizer) to `out_dir`: a 2-layer Qwen2 by
    default, or Qwen3, Granite, Llama, Mistral or Gemma 3 (the architectures of Qwen3 thinking judges, Granite
    Guardian, GuardReasoner / Nemotron safety guards, Shieldstral and Nemotron 3.5), with ChatML or `chat`'s
    special tokens and template."""
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tiny_tokenizer(vocab_size, chat)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    names = {
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "granite": ("GraniteConfig", "GraniteForCausalLM"),
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    }
    config_class, model_class = (getattr(transformers, n) for n in names[architecture])
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        dtype="float32",
    )
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_lora(base_dir: str | Path, out_dir: str | Path, seed: int = 0, rank: int = 8) -> Path:
    """A random (non-zero) LoRA adapter on every projection of a tiny model, so it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    get_peft_model(model, config).save_pretrained(str(out_dir))
    return Path(out_dir)


def build_tiny_classifier(out_dir: str | Path, seed: int = 0, num_labels: int = 2) -> Path:
    """A tiny random-weight RoBERTa sequence classifier (the architecture of GPTFuzzer's judge)."""
    import torch
    from transformers import RobertaConfig, RobertaForSequenceClassification

    out = Path(out_dir)
    tokenizer = _tiny_tokenizer(512)
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=514,
        num_labels=num_labels,  # type: ignore[call-arg]
        pad_token_id=tokenizer.pad_token_id,
    )
    RobertaForSequenceClassification(config).save_pretrained(out, safe_serialization=True)
    return out
