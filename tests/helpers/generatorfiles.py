"""Tiny real decoder-only generators saved to disk: a random Llama over the MiniLM vocabulary, with a chat template."""

from __future__ import annotations

from pathlib import Path

# ChatML, as SmolLM2's: the roles' markers are plain text to this vocabulary, which is all a test needs
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def save_tiny_llama(directory: Path, *, seed: int = 0, chat: bool = True, init: float = 0.5) -> Path:
    """A 2-layer, 32-wide random LlamaForCausalLM (grouped-query attention, tied embeddings) with MiniLM's tokenizer.

    ``init``: the weights' std; well above the default 0.02, so that outputs depend on the prompt.
    [SEP] is eos, [PAD] pads; ``chat`` gives the tokenizer a ChatML template.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rag_core.index.encoders import packaged_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_path()))
    tokenizer.eos_token = "[SEP]"
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=init, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
