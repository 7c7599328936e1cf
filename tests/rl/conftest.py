"""Fixtures of the RL tests."""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _llama(path: Path, inner: Tokenizer, extra_special: bool = False) -> Path:
    """A ChatML tokenizer over `inner` and a 2-layer llama with peaked random weights, saved in `path`."""
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", unk_token="<|endoftext|>")
    if extra_special:
        tok.add_special_tokens({"additional_special_tokens": ["<|endoftext|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, initializer_range=0.3, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A 2-layer llama (grouped-query attention, tied embeddings) with peaked random weights, so greedy
    choices are not near-ties, and a tokenizer of bytes plus ChatML's special tokens."""
    path = tmp_path_factory.mktemp("tiny-llama")
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    inner = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    return _llama(path, inner, extra_special=True)


WIDE_VOCAB = 512
"""The wide llama's vocabulary: bytes, ChatML's special tokens and BPE merges, most ids past the byte policy's."""


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory) -> Path:
    """A 2-layer llama whose tokenizer is byte-level BPE trained to WIDE_VOCAB tokens on code and prose, as a
    real model's is: its merges (and so most tokens it samples) have ids past ByteTokenizer.vocab_size."""
    path = tmp_path_factory.mktemp("wide-llama")
    inner = Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    corpus = ["```python\nfinal(len(open('data.txt').read().split()))\n```", "Answer with the number, no more.",
              "You are a coding agent: run a ```python cell to compute, then answer.", "say something, then stop",
              inspect.getsource(json.decoder), inspect.getsource(textwrap)]
    inner.train_from_iterator(corpus * 20, trainers.BpeTrainer(
        vocab_size=WIDE_VOCAB, special_tokens=["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return _llama(path, inner)
