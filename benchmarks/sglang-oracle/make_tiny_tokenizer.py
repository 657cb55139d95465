"""Add a word-level tokenizer to the tiny random-weight Qwen3 model (benchmarks/real-vllm/make_tiny_model.py).

    .venv-sglang-serve/bin/python benchmarks/sglang-oracle/make_tiny_tokenizer.py [MODEL_DIR]   # default: ./tiny-model here

SGLang's OpenAI endpoints need a tokenizer (with --skip-tokenizer-init, /v1/completions fails with KeyError: 'text').
Token i (0 <= i < 8192) is the word "t<i>", except 0 "<pad>", 1 "<s>", 2 "</s>"; words are split on whitespace and no
BOS/EOS is added, so the text "t10 t11 t12" is exactly the ids [10, 11, 12] and prompts can be written either way.
"""
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast

VOCAB = 8192
SPECIAL = {0: "<pad>", 1: "<s>", 2: "</s>"}


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "tiny-model"
    vocab = {SPECIAL.get(i, f"t{i}"): i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<pad>", model_max_length=8192)
    fast.save_pretrained(out)
    ids = fast("t10 t11 t12")["input_ids"]
    assert ids == [10, 11, 12], ids
    assert fast.decode([10, 11, 12]) == "t10 t11 t12", fast.decode([10, 11, 12])
    print(f"wrote tokenizer to {out}: 't10 t11 t12' -> {ids}")


if __name__ == "__main__":
    main()
