"""Models for a real `vllm serve` on a machine with no network: nothing is downloaded.

- a byte-level BPE tokenizer (8192 tokens, ChatML chat template) trained with `tokenizers` on the
  standard library's own sources, so it merges code the way a real tokenizer does (`":" ":"` -> `"::"`);
- `llama-8b-shape`: config only, an 8B-shaped Llama (hidden 4096, 32 layers, 32 heads, 8 KV heads),
  served with `--load-format dummy` (random weights of the real size: real memory, real kernels);
- `llama-tiny`: a 2-layer Llama with random weights saved by `save_pretrained` (a few MB);
- `llama-1b-random`: a 16-layer Llama (hidden 2048, 1.0 B parameters, 2.0 GB in bf16) with real random weights
  (initialised on the GPU when there is one): big enough that `--cpu-offload-gb 1` moves a real GiB of MLP weights
  to host memory, and, unlike `--load-format dummy`, its greedy text varies, so equal text after a wake means something.

    python3 gpu/vllm_serve/make_models.py /tmp/models
"""

from __future__ import annotations

import json
import pathlib
import sys
import sysconfig
import time

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 8192


def corpus() -> list[str]:
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))[:400]
    files += [str(p) for p in sorted((stdlib / "pydoc_data").glob("*.py"))]
    return files


def tokenizer(out: pathlib.Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out)


def llama_config(**shape: int):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, max_position_embeddings=8192, bos_token_id=0, eos_token_id=2,
                       pad_token_id=0, tie_word_embeddings=False, torch_dtype="bfloat16", **shape)


def main(root: pathlib.Path) -> None:
    started = time.monotonic()
    tok_dir = root / "tokenizer"
    tokenizer(tok_dir)
    big = root / "llama-8b-shape"
    llama_config(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8).save_pretrained(big)
    tiny = root / "llama-tiny"
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = llama_config(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tiny)
    mid = root / "llama-1b-random"
    torch.manual_seed(0)
    mid_config = llama_config(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                              num_attention_heads=16, num_key_value_heads=8)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        LlamaForCausalLM(mid_config).to(torch.bfloat16).save_pretrained(mid)
    for model in (big, tiny, mid):
        for f in tok_dir.iterdir():
            (model / f.name).write_bytes(f.read_bytes())
    print(json.dumps({"models": [str(big), str(tiny), str(mid)], "seconds": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
