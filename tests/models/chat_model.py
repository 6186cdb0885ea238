"""A tiny pretrained-style causal LM for tests: Qwen2 architecture, byte-level BPE tokenizer with a chat template.

Built offline in a second from random weights; it stands in for a hub model such
as Qwen/Qwen2.5-1.5B-Instruct (non-Llama model type, chat template, special tokens
<|im_start|> / <|im_end|> / <|endoftext|>, eos = <|im_end|>, no pad token).
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Compute $1+1$. The answer is \\boxed{2}.",
    "Reason step by step, and put your final answer within \\boxed{}.",
    "Find $x$ if $2^x = 32$. Since $2^5 = 32$, we get $\\boxed{5}$.",
    "What is 3 + 4? 7. What is 12 - 5? 7. 0123456789 + - * / = ( ) { } \\frac",
    "user assistant system",
]


def build_tokenizer(bos: str | None = None):
    """Byte-level BPE (vocab ~400) trained on a few lines; ``bos`` set: prepended on encode (Llama style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = SPECIAL + ([bos] if bos else [])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(CORPUS * 4, trainer)
    if bos:
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                            special_tokens=[(bos, core.token_to_id(bos))])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", bos_token=bos,
                                  additional_special_tokens=["<|im_start|>", "<|endoftext|>"])
    tok.chat_template = ((bos or "") + CHAT_TEMPLATE) if bos else CHAT_TEMPLATE
    return tok


def build_chat_model(folder: str | Path, *, seed: int = 0, bos: str | None = None) -> Path:
    """Save a random tiny Qwen2ForCausalLM (hidden 64, 2 layers) and its chat tokenizer in ``folder``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(bos)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    folder = Path(folder)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
