#!/usr/bin/env python3
"""Expected pre-tokenizer words for tests/test_pretokenizer.cc, from a second regex engine.

Writes splits.json beside this script: for each pre-tokenizer name, inputs and the words they split
into. The split rules are the regex lists llama.cpp's src/llama-vocab.cpp gives per pre-tokenizer
(llm_tokenizer_bpe; for tekken the Hugging Face original its comment quotes), applied the way
llama.cpp's unicode_regex_split does: each regex splits every word the previous ones left into its
matches and the text between them (also words), matching on that word alone.

The regexes are typed here independently of engine/text/pretokenizer.cc and run by Python's `regex`
module (mrab-regex: Unicode properties, lookarounds), not by PCRE2, so this is a second
implementation to check ours against. The names covered are the ones shared/tokenizers has no vocab
for (tekken, smollm, command-r), plus starcoder, falcon and deepseek-llm, whose vocabs and llama.cpp
vectors do exist: they check that this script's stage semantics are llama.cpp's.

Run: python3 tests/reference/pretokenizers/split.py   (needs python3-regex; prints what it wrote)
"""
import json
import os

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
RULES = {
    # Hugging Face tokenizer.json of mistralai/Mistral-Nemo-Base-2407 (quoted in llama-vocab.cpp).
    "tekken": [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    # STARCODER, REFACT, COMMAND_R, SMOLLM share one case in llama.cpp: digits alone, then GPT-2's.
    "smollm": [r"\p{N}", GPT2],
    "command-r": [r"\p{N}", GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "deepseek-llm": [
        r"[\r\n]",
        r"\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
        r"\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
        r"\s+$",
        r"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
        r"\p{N}+",
    ],
}

# Inputs that exercise each alternative: contractions, letters with and without a leading space, case
# changes (ASCII and not), combining marks, digits, punctuation runs with trailing newlines and
# slashes, whitespace runs before words, newlines and the end, CJK, emoji, symbols.
TEXTS = [
    "Hello world",
    "I'm sure they'll say we've done it, isn't it? 'S 'T",
    "HelloWorld HTTPServer getHTTPResponse ABC def aBC",
    "ÉcoleÉté naïve ΑθήναΑθήνα straße İstanbul",
    "cafe\u0301s re\u0301sume\u0301 e\u0301",
    "2024 3.14159 1,000,000 x2y3 ١٢٣ Ⅻ ½",
    "a/b/c https://example.org/path?q=1&r=2\nnext //comment\n",
    "x?!\n\ny ... -- ==> ~~~ $100 +5 <tag> |pipe| `code` ^caret",
    "a  b   c    d\t\te \n f\n\n\ng   ",
    "   leading and trailing   ",
    "\n\n\n",
    " \r\n\r\n \t ",
    "中文字符 日本語のテキスト 한국어 텍스트 mixed中文text",
    "emoji 🦙🚀 and symbols ©®™ → ∑ ≈",
    "line1\r\nline2\rline3\u2028line4\u00a0nbsp\u3000ideographic",
    "tab\tafter\ttabs\t",
    "'''quotes''' \"double\" «guillemets» ‘single’",
    "CamelCaseWordsAndMORECaps123Numbers",
]


def split(rules, text):
    words = [text]
    for pattern in rules:
        rx = regex.compile(pattern)
        out = []
        for w in words:
            gap = 0
            for m in rx.finditer(w):
                if m.end() == m.start():
                    continue
                if m.start() > gap:
                    out.append(w[gap:m.start()])
                out.append(m.group())
                gap = m.end()
            if gap < len(w):
                out.append(w[gap:])
        words = out
    assert "".join(words) == text
    return words


def main():
    result = {name: [{"text": t, "words": split(rules, t)} for t in TEXTS] for name, rules in RULES.items()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "splits.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"regex_module": regex.__version__, "splits": result}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(result)} pre-tokenizers x {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
