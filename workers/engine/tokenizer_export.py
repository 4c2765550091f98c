"""Write a ``Tokenizer`` as the Hugging Face files ``AutoTokenizer.from_pretrained`` reads.

``tokenizer.json`` is the ``tokenizers`` pipeline itself, so Hugging Face tokenizes exactly
as we do; ``tokenizer_config.json`` names the fast-tokenizer class, the special tokens and
the chat template; ``special_tokens_map.json`` repeats the special tokens for older readers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.engine.tokenizer import Tokenizer


def _special_map(tok: Tokenizer) -> dict[str, Any]:
    s = tok.special
    named = {"bos_token": s.bos, "eos_token": s.eos, "pad_token": s.pad, "unk_token": s.unk}
    out: dict[str, Any] = {k: v for k, v in named.items() if v is not None}
    extra = [t for t in s.all if t not in named.values()]
    if extra:
        out["additional_special_tokens"] = extra
    return out


def save_pretrained(tok: Tokenizer, directory: Path) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    special = _special_map(tok)
    added = {
        str(idx): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for idx, t in sorted(tok.backend.get_added_tokens_decoder().items())
    }
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": tok.special.add_bos,
        "add_eos_token": False,
        # Byte-level BPE decodes spaces exactly; "clean up" would alter the text (" ." -> ".").
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
        "added_tokens_decoder": added,
        **special,
    }
    if tok.chat_template is not None:
        config["chat_template"] = tok.chat_template
    files = {
        "tokenizer.json": tok.backend.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False),
    }
    written = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text + "\n", encoding="utf-8")
        written.append(path)
    return written
