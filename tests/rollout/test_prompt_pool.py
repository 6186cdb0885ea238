"""encode_prompt_pool: special tokens added once, whether or not a chat template already wrote the bos token."""

from __future__ import annotations

from rlvr_core.models.tokenizer import BOS_ID, build_char_tokenizer
from rlvr_core.rollout.base import encode_prompt_pool, prompt_sequences
from tests.models.chat_model import build_tokenizer


def test_tiny_tokenizer_gets_its_bos_as_before() -> None:
    tok = build_char_tokenizer()
    assert encode_prompt_pool(tok, ["12+3=", "4*5="]) == [list(tok("12+3=").input_ids), list(tok("4*5=").input_ids)]
    assert encode_prompt_pool(tok, ["12+3="])[0][:2] == [BOS_ID, tok.convert_tokens_to_ids("1")]


def test_bos_written_by_a_chat_template_is_not_doubled() -> None:
    tok = build_tokenizer(bos="<s>")  # Llama style: the post-processor prepends <s>, the template writes it too
    bos = tok.convert_tokens_to_ids("<s>")
    rendered = tok.apply_chat_template([{"role": "user", "content": "Compute 1+1."}], add_generation_prompt=True,
                                       tokenize=False)
    assert rendered.startswith("<s><|im_start|>user")
    plain = "Compute 1+1."
    ids_rendered, ids_plain = encode_prompt_pool(tok, [rendered, plain])
    assert ids_rendered[:2] == [bos, tok.convert_tokens_to_ids("<|im_start|>")] and ids_rendered.count(bos) == 1
    assert ids_plain[0] == bos and ids_plain.count(bos) == 1  # prompts without it still get it, in order
    assert prompt_sequences(tok, [], [rendered]) == [ids_rendered]


def test_tokenizer_without_bos_encodes_chat_tokens_as_single_ids() -> None:
    tok = build_tokenizer()
    [ids] = encode_prompt_pool(tok, ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"])
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert ids[0] == start and ids.count(start) == 2 and ids.count(end) == 1
