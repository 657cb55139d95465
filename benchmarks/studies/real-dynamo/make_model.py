"""Tiny random-weight Qwen3 of benchmarks/fixtures/real-vllm (same weights, sha256 a5ffb7a3...) plus a word-level tokenizer.

    .venv-dynamo-real/bin/python benchmarks/studies/real-dynamo/make_model.py [OUT_DIR]   # default: benchmarks/studies/real-dynamo/tiny-model

Dynamo's frontend loads the model's tokenizer to build its preprocessor (even when prompts are token ids), so this
adds tokenizer.json: a WordLevel vocabulary of 8,192 entries (<pad>=0, <s>=1, </s>=2, then "t3".."t8191"), split on
whitespace. Token-id prompts never go through it; it only detokenizes the outputs.
"""
import json
import runpy
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

HERE = Path(__file__).resolve().parent


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "tiny-model"
    sys.argv = [sys.argv[0], str(out)]
    runpy.run_path(str(HERE.parents[1] / "fixtures" / "real-vllm" / "make_tiny_model.py"), run_name="__main__")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, 8192)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<pad>", "model_max_length": 8192, "add_bos_token": False,
        # a trivial chat template, only so that the frontend's preprocessor has one
        "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<pad>"}, indent=1))
    print(f"wrote {out}/tokenizer.json (WordLevel, 8192 entries)")


if __name__ == "__main__":
    main()
