"""Character-level tokenizer for the synthetic tasks (arithmetic, Countdown).

One token per character, built with the ``tokenizers`` library (a WordLevel
model over single characters) and wrapped as a transformers fast tokenizer, so
``save_pretrained`` / ``AutoTokenizer.from_pretrained(folder)`` round-trip it
offline from the folder alone.

Vocabulary (22 ids, fixed order so saved models stay compatible):

    0 <pad>   1 <bos>   2 <eos>   3..21  0 1 2 3 4 5 6 7 8 9 + - * / ( ) = , >

Every encoded text starts with ``<bos>`` (added by the post-processor);
``<eos>`` is never added on encode: the policy writes it to end a completion.
Batches are padded on the left so generation continues every row from its
last prompt token.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

#: Characters of both task formats: arithmetic ``0047+0083=`` -> ``031`` and
#: Countdown ``3,7,25,50>125=`` -> ``(7-3)*25+25``.
CHARACTERS: str = "0123456789+-*/()=,>"

#: token -> id, specials first.
VOCAB: dict[str, int] = {t: i for i, t in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}

#: Longest prompt + completion the tiny policy is built for (positions are RoPE, so
#: this costs no parameters; it is the tokenizer's ``model_max_length``).
MAX_LENGTH = 128


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return the character tokenizer (fast, left padding, ``<bos>`` prepended).

    Example::

        tok = build_char_tokenizer()
        tok("0047+0083=").input_ids   # [1, 3, 3, 7, 10, 13, 3, 3, 11, 6, 19]
        tok.decode([6, 4, 3, 2], skip_special_tokens=True)   # "310"
    """
    core = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=None))
    # Split every character into its own pre-token; WordLevel then maps it to its id.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # join characters without spaces
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=MAX_LENGTH,
    )


def check_text(text: str, what: str = "text") -> None:
    """Raise ValueError naming the first character the vocabulary cannot encode.

    The tokenizer itself fails with an opaque "missing [UNK]" message on such
    input; call this first where the text comes from a user or a data file.
    """
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str, got {type(text).__name__}")
    for i, ch in enumerate(text):
        if ch not in VOCAB or ch in SPECIAL_TOKENS:
            raise ValueError(
                f"{what} {text!r} has character {ch!r} at position {i} outside the tiny policy's "
                f"vocabulary; allowed characters: {CHARACTERS!r}"
            )


def encode_prompts(tok: PreTrainedTokenizerBase, prompts: Iterable[str]) -> list[list[int]]:
    """Token ids per prompt, ``<bos>`` first, no padding; characters are validated.

    Returns a list of P lists of length 1 + len(prompt).
    """
    texts = list(prompts)
    for i, t in enumerate(texts):
        if not t:
            raise ValueError(f"prompt {i} is empty")
        check_text(t, what=f"prompt {i}")
    return [list(ids) for ids in tok(texts, add_special_tokens=True)["input_ids"]]


def vocabulary_problems(tok: PreTrainedTokenizerBase) -> list[str]:
    """Why ``tok`` is not the character tokenizer the tiny policy expects (empty if it is)."""
    problems: list[str] = []
    vocab = tok.get_vocab()
    missing = [t for t in VOCAB if t not in vocab]
    if missing:
        problems.append(f"tokens missing from the vocabulary: {missing}")
    moved = [f"{t!r}: {vocab[t]} (expected {i})" for t, i in VOCAB.items() if t in vocab and vocab[t] != i]
    if moved:
        problems.append("token ids differ from the character vocabulary: " + ", ".join(moved))
    for name, want in (("pad_token_id", PAD_ID), ("bos_token_id", BOS_ID), ("eos_token_id", EOS_ID)):
        got = getattr(tok, name, None)
        if got != want:
            problems.append(f"{name} is {got}, expected {want}")
    return problems
